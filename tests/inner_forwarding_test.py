"""Tests for tf_lso._src.inner.forwarding: attributes read/written through."""

import keras
import numpy as np
import tensorflow as tf

import tf_lso

import test_util


class InnerForwardingTest(tf.test.TestCase):
    def test_learning_rate_and_lr(self):
        inner = keras.optimizers.Adam(1.0)
        opt = tf_lso.LossScaleOptimizer(inner)
        self.assertIs(opt.learning_rate, inner.learning_rate)
        self.assertIs(opt.lr, inner.learning_rate)
        opt.lr = 2.0
        self.assertEqual(test_util.num(inner.learning_rate), 2.0)
        opt.learning_rate = 3.0
        self.assertEqual(test_util.num(opt.lr), 3.0)
        inner.learning_rate = 4.0
        self.assertEqual(test_util.num(opt.learning_rate), 4.0)

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

    def test_only_hyperparameters_are_forwarded(self):
        # The list is derived: the keys of the inner optimizer's config.
        inner = keras.optimizers.SGD(1.0, momentum=0.5)
        inner.custom_state = 1  # Public, but not a hyperparameter.
        opt = tf_lso.LossScaleOptimizer(inner)
        self.assertEqual(opt.momentum, 0.5)
        self.assertIn("momentum", dir(opt))
        self.assertNotIn("custom_state", dir(opt))
        with self.assertRaisesRegex(
            AttributeError,
            r"no attribute 'custom_state'.*inner optimizer SGD.*'momentum'",
        ):
            opt.custom_state  # noqa: B018
        self.assertEqual(opt.inner_optimizer.custom_state, 1)
        opt.custom_state = 2  # Not forwarded: the wrapper's own attribute.
        self.assertEqual(inner.custom_state, 1)

    def test_flags_are_not_exposed_as_in_tf2_4(self):
        # TF 2.4's testArbitraryAttributesNotExposed and testDir.
        inner = keras.optimizers.SGD()
        opt = tf_lso.LossScaleOptimizer(inner)
        self.assertFalse(opt.inner_optimizer.nesterov)
        with self.assertRaisesRegex(
            AttributeError, "'LossScaleOptimizer' object has no attribute "
            "'nesterov'"
        ):
            opt.nesterov  # noqa: B018
        opt.nesterov = True
        self.assertTrue(opt.nesterov)
        self.assertFalse(inner.nesterov)
        fresh = tf_lso.LossScaleOptimizer(keras.optimizers.SGD())
        for name in ("learning_rate", "lr", "minimize", "loss_scale",
                     "momentum"):
            self.assertIn(name, dir(fresh))
        self.assertNotIn("nesterov", dir(fresh))
        self.assertIn("nesterov", dir(fresh.inner_optimizer))

    def test_tf2_private_inner_optimizer_attribute(self):
        # TF's class kept the inner optimizer in `_optimizer`; TF 2.x code
        # reads it.
        inner = keras.optimizers.SGD(1.0)
        self.assertIs(tf_lso.LossScaleOptimizer(inner)._optimizer, inner)

    def test_iterations_get_and_set(self):
        inner = keras.optimizers.SGD(1.0)
        opt = tf_lso.LossScaleOptimizer(inner)
        self.assertIs(opt.iterations, inner.iterations)
        opt.iterations = 7
        self.assertEqual(test_util.num(inner.iterations), 7)

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
        self.assertEqual(test_util.num(inner.iterations), 5)
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

    def test_learning_rate_of_an_inner_wrapper(self):
        # TF's testLossScaleDelegationWithWrapper: the inner optimizer is
        # itself a wrapper whose `learning_rate` is a property of its own.
        def wrapper_class(base, adam, **base_kwargs):
            class MyOptimizer(base):
                def __init__(self):
                    super().__init__(name="MyOptimizer", **base_kwargs)
                    self.inner_optimizer = adam(learning_rate=1.0)

                @property
                def learning_rate(self):
                    return self.inner_optimizer.learning_rate

                @learning_rate.setter
                def learning_rate(self, value):
                    self.inner_optimizer.learning_rate = value

                def get_config(self):
                    return {}

            return MyOptimizer

        legacy = test_util.tf_keras.optimizers.legacy
        for make_inner in (
            wrapper_class(keras.optimizers.Optimizer, keras.optimizers.Adam,
                          learning_rate=0.5),
            wrapper_class(legacy.Optimizer, legacy.Adam),
        ):
            for opt in (tf_lso.LossScaleOptimizer(make_inner()),
                        tf_lso.experimental.LossScaleOptimizer(make_inner(),
                                                               "dynamic")):
                innermost = opt.inner_optimizer.inner_optimizer
                self.assertEqual(test_util.num(opt.learning_rate), 1.0)
                opt.learning_rate = 2.0
                self.assertEqual(test_util.num(opt.learning_rate), 2.0)
                self.assertEqual(test_util.num(opt.lr), 2.0)
                self.assertEqual(test_util.num(innermost.learning_rate), 2.0)


class LearningRateScheduleTest(tf.test.TestCase):
    """`opt.learning_rate` with a schedule: TF 2.x's callable, Keras 3's value."""

    def _optimizer(self):
        schedule = keras.optimizers.schedules.ExponentialDecay(
            1.0, decay_steps=1, decay_rate=0.5)
        return schedule, tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(schedule), initial_scale=4)

    def test_called_with_a_step_as_tf2_code_does(self):
        schedule, opt = self._optimizer()
        var = tf.Variable(1.0)
        # EfficientDet's pattern, eagerly and in a traced train step.
        self.assertEqual(float(opt.learning_rate(opt.iterations)), 1.0)
        opt.apply_gradients([(tf.constant(1.0), var)])
        self.assertEqual(float(opt.learning_rate(opt.iterations)), 0.5)
        self.assertEqual(float(opt.lr(3)), 0.125)

        @tf.function
        def train_step():
            opt.apply_gradients([(tf.constant(1.0), var)])
            return opt.learning_rate(opt.iterations)

        self.assertEqual(float(train_step()), 0.25)
        self.assertEqual(float(var), 1.0 - 1.0 - 0.5)
        self.assertIs(opt.learning_rate.schedule, schedule)
        self.assertEqual(opt.learning_rate.get_config(), schedule.get_config())
        self.assertEqual(opt.learning_rate.initial_learning_rate, 1.0)

    def test_only_the_schedules_public_attributes_read_through(self):
        _, opt = self._optimizer()
        for name in ("no_such_attribute", "_private_state"):
            with self.assertRaisesRegex(
                    AttributeError, "'ScheduledLearningRate' object has no "
                    f"attribute '{name}'.*schedule ExponentialDecay"):
                getattr(opt.learning_rate, name)

    def test_used_as_the_current_value_as_keras3_code_does(self):
        _, opt = self._optimizer()
        opt.apply_gradients([(tf.constant(1.0), tf.Variable(1.0))])
        lr = opt.learning_rate
        self.assertEqual(float(lr), 0.5)
        self.assertEqual(lr.numpy(), np.float32(0.5))
        self.assertEqual(float(np.asarray(lr)), 0.5)
        self.assertEqual(float(tf.convert_to_tensor(lr)), 0.5)
        self.assertEqual(float(lr * 2), 1.0)
        self.assertEqual(f"{lr:.2f}", "0.50")
        self.assertEqual(float(keras.ops.convert_to_numpy(lr)), 0.5)
        self.assertEqual(
            float(tf.function(lambda: opt.learning_rate * 1.0)()), 0.5)

    def test_without_a_schedule_it_stays_the_variable(self):
        inner = keras.optimizers.SGD(0.1)
        opt = tf_lso.LossScaleOptimizer(inner)
        self.assertIs(opt.learning_rate, inner.learning_rate)


if __name__ == "__main__":
    tf.test.main()
