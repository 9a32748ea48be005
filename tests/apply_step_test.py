"""Tests for tf_lso._src.optimizer.apply_step: one step, applied or skipped.

The optimizer-level behaviour (protocols, strategies, accumulation) is in
loss_scale_optimizer_test.py and replicas_test.py; here the step runs on
its own, with each kind of loss scale.
"""

import keras
import tensorflow as tf
from absl.testing import parameterized

from tf_lso._src.inner import wrapping
from tf_lso._src.optimizer import apply_step
from tf_lso._src.optimizer import training_health
from tf_lso._src.scaling import loss_scale as loss_scale_lib

import test_util

INF = float("inf")


def _step(loss_scale):
    inner = wrapping.wrap(keras.optimizers.SGD(1.0, momentum=0.5),
                                 "inner_optimizer")
    var = tf.Variable([1.0, 2.0])
    inner.build([var])
    record = training_health.OverflowRecord()
    return apply_step.ApplyStep(inner, loss_scale, record), inner, var


class ApplyStepTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(False, True)
    def test_dynamic_scale_applies_or_skips(self, use_tf_function):
        loss_scale = loss_scale_lib.DynamicLossScale(8.0, increment_period=1)
        step, inner, var = _step(loss_scale)
        def run(grad):
            step([grad], [var])

        if use_tf_function:
            run = tf.function(run)
        run(tf.constant([1.0, 1.0]))
        self.assertAllEqual(var, [0.0, 1.0])
        self.assertEqual(float(loss_scale()), 16.0)
        slots = [v.numpy() for v in inner.variables()]
        run(tf.constant([INF, 1.0]))
        self.assertAllEqual(var, [0.0, 1.0])
        for before, after in zip(slots[1:], inner.variables()[1:]):
            self.assertAllEqual(before, after)  # Slots unchanged.
        self.assertEqual(int(inner.iterations), 2)
        self.assertEqual(int(step.skipped_steps), 1)
        self.assertEqual(float(loss_scale()), 8.0)

    def test_fixed_scale_never_skips(self):
        step, inner, var = _step(loss_scale_lib.FixedLossScale(4.0))
        step([tf.constant([INF, 1.0])], [var])
        self.assertEqual(float(var[0]), -INF)
        self.assertEqual(int(step.skipped_steps), 0)
        self.assertEqual(int(inner.iterations), 1)

    @parameterized.parameters(False, True)
    def test_checks_the_gradients_the_inner_aggregation_returns(
        self, use_tf_function
    ):
        # TF 2.5+'s order, and tf_keras's: a tf_keras legacy optimizer's
        # gradient_aggregator runs first, and the check sees what it returns,
        # so a NaN that the aggregator makes skips the step.
        def aggregator(grads_and_vars):
            return [(g * float("nan"), v) for g, v in grads_and_vars]

        loss_scale = loss_scale_lib.DynamicLossScale(8.0, increment_period=1)
        sgd = test_util.tf_keras.optimizers.legacy.SGD(
            1.0, gradient_aggregator=aggregator)
        inner = wrapping.wrap(sgd, "inner_optimizer")
        var = tf.Variable([1.0, 2.0])
        inner.build([var])
        step = apply_step.ApplyStep(inner, loss_scale,
                                    training_health.OverflowRecord())

        def run():
            step([tf.constant([1.0, 1.0])], [var])

        if use_tf_function:
            run = tf.function(run)
        run()
        self.assertAllEqual(var, [1.0, 2.0])
        self.assertEqual(int(step.skipped_steps), 1)
        self.assertEqual(float(loss_scale()), 4.0)
        self.assertEqual(int(inner.iterations), 1)


class CountingFixed(loss_scale_lib.FixedLossScale):
    """A subclass with its own `update`, as TF 2.4 code could write."""

    def __init__(self, value):
        super().__init__(value)
        self.calls = tf.Variable(0, name="calls")

    def update(self, grads):
        self.calls.assign_add(1)
        return super().update(grads)


class CountingDynamic(loss_scale_lib.DynamicLossScale):
    def __init__(self, initial):
        super().__init__(initial, increment_period=1)
        self.calls = tf.Variable(0, name="calls")

    def update(self, grads):
        self.calls.assign_add(1)
        return super().update(grads)


def _runner(loss_scale, use_tf_function):
    """A step around `loss_scale`, a function running it on one gradient
    (a `tf.function` if asked), and the variable it trains."""
    step, _, var = _step(loss_scale)
    run = test_util.maybe_function(
        lambda grad: step([grad], [var]), use_tf_function)
    return step, run, var


class OverriddenUpdateTest(tf.test.TestCase, parameterized.TestCase):
    """TF 2.4's optimizer called `loss_scale.update(grads)` every step: a
    subclass of a built-in loss scale that overrides it is called too."""

    @parameterized.parameters(False, True)
    def test_a_fixed_subclass_is_asked(self, use_tf_function):
        loss_scale = CountingFixed(4.0)
        step, run, var = _runner(loss_scale, use_tf_function)
        run(tf.constant([1.0, 1.0]))
        run(tf.constant([INF, 1.0]))  # A fixed scale applies it (TF 2.4).
        self.assertEqual(int(loss_scale.calls), 2)
        self.assertEqual(float(var[0]), -INF)
        self.assertEqual(int(step.skipped_steps), 0)

    @parameterized.parameters(False, True)
    def test_a_dynamic_subclass_is_asked(self, use_tf_function):
        loss_scale = CountingDynamic(8.0)
        step, run, var = _runner(loss_scale, use_tf_function)
        run(tf.constant([1.0, 1.0]))
        self.assertEqual(float(loss_scale()), 16.0)
        run(tf.constant([INF, 1.0]))
        self.assertEqual(int(loss_scale.calls), 2)
        self.assertAllEqual(var, [0.0, 1.0])
        self.assertEqual(int(step.skipped_steps), 1)
        self.assertEqual(float(loss_scale()), 8.0)
        self.assertEqual(loss_scale_lib.step_mode(loss_scale), "update")
        self.assertEqual(
            loss_scale_lib.step_mode(loss_scale_lib.DynamicLossScale()),
            "rule")


class _Halves(loss_scale_lib.LossScale):
    """A user's loss scale: the step knows no rule for it."""

    def __call__(self):
        return tf.constant(2.0)

    def update(self, grads):
        return None, True

    def get_config(self):
        return {}


class AccumulationTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.parameters(False, True)
    def test_a_users_loss_scale_is_refused_before_any_state_changes(
            self, use_tf_function):
        if not test_util.keras_has_gradient_accumulation():
            self.skipTest("Keras 3.4+ accumulates gradients")
        inner = wrapping.wrap(
            keras.optimizers.SGD(1.0, momentum=0.5,
                                 gradient_accumulation_steps=2),
            "inner_optimizer")
        var = tf.Variable([1.0, 2.0])
        step = apply_step.ApplyStep(inner, _Halves(),
                                    training_health.OverflowRecord())

        def run():
            step([tf.constant([1.0, 1.0])], [var])

        with self.assertRaisesRegex(NotImplementedError,
                                    "needs a FixedLossScale or "
                                    "DynamicLossScale"):
            test_util.maybe_function(run, use_tf_function)()
        self.assertAllEqual(var, [1.0, 2.0])
        self.assertFalse(inner.optimizer.built)  # Refused before step 2.
        self.assertEqual(int(inner.iterations.numpy()), 0)

    @parameterized.product(use_tf_function=[False, True],
                           loss_scale=["fixed", "dynamic"])
    def test_an_overridden_update_is_refused_not_ignored(
            self, use_tf_function, loss_scale):
        # Its `update` knows nothing of windows; following the built-in
        # rule instead would ignore the user's code silently.
        if not test_util.keras_has_gradient_accumulation():
            self.skipTest("Keras 3.4+ accumulates gradients")
        loss_scale = (CountingFixed(4.0) if loss_scale == "fixed"
                      else CountingDynamic(8.0))
        inner = wrapping.wrap(
            keras.optimizers.SGD(1.0, gradient_accumulation_steps=2),
            "inner_optimizer")
        var = tf.Variable([1.0, 2.0])
        step = apply_step.ApplyStep(inner, loss_scale,
                                    training_health.OverflowRecord())

        def run():
            step([tf.constant([1.0, 1.0])], [var])

        with self.assertRaisesRegex(NotImplementedError,
                                    "whose `update` is not overridden"):
            test_util.maybe_function(run, use_tf_function)()
        self.assertAllEqual(var, [1.0, 2.0])
        self.assertEqual(int(loss_scale.calls), 0)
