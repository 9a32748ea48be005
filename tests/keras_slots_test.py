"""Tests for TF 2.x checkpoint names on a Keras 3 optimizer (KerasInner)."""

import keras
import tensorflow as tf

from tf_lso._src.inner.kinds import keras_optimizer


class KerasSlotsTest(tf.test.TestCase):
    def _built(self, optimizer, variables):
        optimizer.build(variables)
        return optimizer

    def test_adam_slots_by_tf2_name(self):
        var = keras.Variable([1.0, 2.0], name="w")
        opt = self._built(keras.optimizers.Adam(), [var])
        momentum = keras_optimizer.tf2_slot(opt, var, "m")
        velocity = keras_optimizer.tf2_slot(opt, var, "v")
        self.assertIs(momentum, opt._momentums[0])
        self.assertIs(velocity, opt._velocities[0])
        self.assertIsNone(keras_optimizer.tf2_slot(opt, var, "no_such_slot"))

    def test_same_named_variables_follow_build_order(self):
        first = keras.Variable([1.0], name="w")
        second = keras.Variable([2.0], name="w")
        opt = self._built(keras.optimizers.SGD(momentum=0.9), [first, second])
        self.assertIs(keras_optimizer.tf2_slot(opt, second, "momentum"),
                      opt.momentums[1])
        self.assertIs(keras_optimizer.tf2_slot(opt, first, "momentum"),
                      opt.momentums[0])

    def test_iter_and_learning_rate(self):
        opt = keras.optimizers.SGD(0.5)
        self.assertIs(keras_optimizer.tf2_dependency(opt, "iter"),
                      opt.iterations)
        self.assertIs(keras_optimizer.tf2_dependency(opt, "learning_rate"),
                      opt.learning_rate)
        self.assertIsNone(keras_optimizer.tf2_dependency(opt, "decay"))
