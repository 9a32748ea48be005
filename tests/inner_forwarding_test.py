"""Tests for tf_lso._src.inner_forwarding: attributes read/written through."""

import keras
import numpy as np
import tensorflow as tf

import tf_lso


class InnerForwardingTest(tf.test.TestCase):
    def test_learning_rate_and_lr(self):
        inner = keras.optimizers.Adam(1.0)
        opt = tf_lso.LossScaleOptimizer(inner)
        self.assertIs(opt.learning_rate, inner.learning_rate)
        self.assertIs(opt.lr, inner.learning_rate)
        opt.lr = 2.0
        self.assertEqual(float(inner.learning_rate), 2.0)
        opt.learning_rate = 3.0
        self.assertEqual(float(opt.lr), 3.0)
        inner.learning_rate = 4.0
        self.assertEqual(float(opt.learning_rate), 4.0)

    def test_public_inner_attributes_read_and_write_through(self):
        inner = keras.optimizers.Adam(1.0, weight_decay=0.1)
        opt = tf_lso.LossScaleOptimizer(inner)
        self.assertEqual(opt.beta_1, 0.9)
        self.assertEqual(opt.epsilon, 1e-7)
        self.assertEqual(opt.weight_decay, 0.1)
        opt.beta_1 = 0.5
        opt.weight_decay = 0.2
        self.assertEqual(inner.beta_1, 0.5)
        self.assertEqual(inner.weight_decay, 0.2)
        self.assertIn("beta_1", dir(opt))
        for name in ("learning_rate", "lr", "minimize", "loss_scale"):
            self.assertIn(name, dir(opt))

    def test_wrapper_attributes_are_not_forwarded(self):
        inner = keras.optimizers.SGD(1.0)
        opt = tf_lso.LossScaleOptimizer(inner)
        opt.my_flag = True  # Not an inner attribute: stays on the wrapper.
        self.assertFalse(hasattr(inner, "my_flag"))
        with self.assertRaisesRegex(AttributeError, "'LossScaleOptimizer'"):
            opt.not_an_attr += 3
        with self.assertRaisesRegex(AttributeError, "_private"):
            opt._private  # noqa: B018
        with self.assertRaises(AttributeError):
            opt.loss_scale = 2.0

    def test_iterations_get_and_set(self):
        inner = keras.optimizers.SGD(1.0)
        opt = tf_lso.LossScaleOptimizer(inner)
        self.assertIs(opt.iterations, inner.iterations)
        opt.iterations = 7
        self.assertEqual(int(inner.iterations), 7)

    def test_variables_weights_and_set_weights(self):
        inner = keras.optimizers.SGD(1.0, momentum=0.5)
        opt = tf_lso.LossScaleOptimizer(inner)
        var = tf.Variable([1.0, 2.0])
        opt.apply_gradients([(tf.constant([1.0, 1.0]), var)])
        self.assertEqual(opt.variables, inner.variables)
        self.assertEqual(opt.variables(), inner.variables)
        self.assertEqual(opt.weights, inner.variables)
        weights = opt.get_weights()
        self.assertEqual(int(weights[0]), 1)
        weights[0] = np.array(5, dtype=np.int64)
        opt.set_weights(weights)
        self.assertEqual(int(inner.iterations), 5)
        # The loss scale state is not among the inner optimizer's variables.
        self.assertLen(opt.variables, len(inner.variables))

    def test_slot_methods_need_slots(self):
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0))
        self.assertEqual(opt.get_slot_names(), [])
        with self.assertRaisesRegex(AttributeError, "needs an inner optimizer"):
            opt.get_slot(tf.Variable(1.0), "momentum")

    def test_clipping_attributes(self):
        inner = keras.optimizers.SGD(1.0, clipnorm=1.5)
        opt = tf_lso.LossScaleOptimizer(inner)
        self.assertEqual(opt.clipnorm, 1.5)
        self.assertIsNone(opt.clipvalue)
        self.assertIsNone(opt.global_clipnorm)
        opt.clipnorm = 2.5
        self.assertEqual(inner.clipnorm, 2.5)


if __name__ == "__main__":
    tf.test.main()
