"""Tests for tf_lso._src.scaling.loss_scale: the three loss scale classes."""

import contextlib

import hypothesis
import numpy as np
import tensorflow as tf
from absl.testing import parameterized
from hypothesis import strategies as st

import tf_lso
from tf_lso.experimental import DynamicLossScale
from tf_lso.experimental import FixedLossScale
from tf_lso.experimental import LossScale

import test_util

F32_MAX = float(np.finfo(np.float32).max)
NAN = float("nan")

# Spec 1.4.5: (init, period, multiplier, inputs, expected scales after each).
TRAJECTORIES = [
    ("increase", 1, 2, 2, [True] * 6, [1, 2, 2, 4, 4, 8]),
    (
        "keep_increasing_until_capped",
        F32_MAX / 4,
        2,
        2,
        [True] * 6,
        [F32_MAX / 4, F32_MAX / 2, F32_MAX / 2, F32_MAX, F32_MAX, F32_MAX],
    ),
    ("decrease_every_step", 1024, 2, 2, [False] * 6, [512, 256, 128, 64, 32, 16]),
    ("keep_decreasing_until_one", 16, 2, 2, [False] * 6, [8, 4, 2, 1, 1, 1]),
    ("nan_clear_good_step", 1, 2, 2, [True, True, True, False, True], [1, 2, 2, 1, 1]),
    (
        "trigger_loss_scale_update_each_step",
        1,
        1,
        2,
        [True, True, True, False, True, True],
        [2, 4, 8, 4, 8, 16],
    ),
    (
        "alternating_trigger_each_step",
        1,
        1,
        2,
        [True, False] * 4 + [True],
        [2, 1, 2, 1, 2, 1, 2, 1, 2],
    ),
    (
        "alternating_trigger_every_other_step",
        32,
        2,
        2,
        [True, False] * 3 + [True],
        [32, 16, 16, 8, 8, 4, 4],
    ),
    ("nondefault_multiplier", 4, 2, 3, [True, True, False, True, True],
     [4, 12, 4, 4, 12]),
    (
        "random_mix_good_and_bad_gradients",
        4,
        2,
        2,
        [False, True, True, True, False, True, False, True, True, True, False],
        [2, 2, 4, 4, 2, 2, 1, 1, 2, 2, 1],
    ),
]


def _trajectory_cases():
    for name, init, period, mult, inputs, expected in TRAJECTORIES:
        for case in test_util.strategy_and_mode_cases(prefix=f"{name}_"):
            yield dict(
                case, init=init, period=period, mult=mult, inputs=inputs,
                expected=expected,
            )


class FixedLossScaleTest(tf.test.TestCase, parameterized.TestCase):
    @test_util.EAGER_AND_FUNCTION
    def test_update_returns_python_true_and_keeps_value(self, use_tf_function):
        loss_scale = FixedLossScale(1000)

        def step(grad):
            _, should_apply = loss_scale.update([grad])
            # A Python bool, so callers never have to build a tf.cond.
            self.assertIs(should_apply, True)
            return loss_scale()

        step = test_util.maybe_function(step, use_tf_function)
        self.assertEqual(float(step(tf.constant(1.0))), 1000.0)
        self.assertEqual(float(step(tf.constant(NAN))), 1000.0)

    def test_update_op_is_none_in_eager_mode(self):
        self.assertIsNone(FixedLossScale(2).update([tf.constant(1.0)])[0])

    def test_call_returns_float32_tensor(self):
        value = FixedLossScale(123)()
        self.assertIsInstance(value, tf.Tensor)
        self.assertEqual(value.dtype, tf.float32)

    def test_repr_and_config(self):
        loss_scale = FixedLossScale(123)
        self.assertEqual(repr(loss_scale), "FixedLossScale(123.0)")
        self.assertEqual(loss_scale.get_config(), {"loss_scale_value": 123.0})
        restored = FixedLossScale.from_config(loss_scale.get_config())
        self.assertEqual(float(restored()), 123.0)

    @parameterized.named_parameters(
        ("true", True, 1.0),
        ("numpy_float64", np.float64(4.0), 4.0),
    )
    def test_accepted_values(self, value, expected):
        self.assertEqual(FixedLossScale(value)._loss_scale_value, expected)

    @parameterized.named_parameters(
        ("string", "2"),
        ("none", None),
        ("numpy_float32", np.float32(2.0)),
        ("numpy_int64", np.int64(2)),
    )
    def test_rejects_non_python_numbers(self, value):
        with self.assertRaisesRegex(
            ValueError, "must be a Python int or float. Received"
        ):
            FixedLossScale(value)

    @parameterized.named_parameters(
        ("inf", float("inf")), ("nan", float("nan")), ("float32_inf", 1e39),
    )
    def test_rejects_what_is_not_finite_as_float32(self, value):
        # TF accepted these; every step then had an inf or NaN loss.
        with self.assertRaisesRegex(
            ValueError, "must be at least 1. Received: loss_scale_value="
        ):
            FixedLossScale(value)

    def test_rejects_below_one(self):
        with self.assertRaisesRegex(
            ValueError, r"must be at least 1. Received: loss_scale_value=0.5"
        ):
            FixedLossScale(0.5)

    def test_has_no_variables(self):
        self.assertEmpty(FixedLossScale(2).variables)


class DynamicLossScaleTest(tf.test.TestCase, parameterized.TestCase):
    def _run_trajectory(self, strategy, loss_scale, inputs, use_tf_function):
        """Feeds finite/non-finite steps; returns scales and should_apply."""

        def replica_step(finite):
            # Under MirroredStrategy only replica 0 sees the NaN: the check
            # must be reduced across replicas for both to skip.
            bad = test_util.value_on_replica_0(NAN, 1.0)
            grad = tf.where(finite, 1.0, bad)
            _, should_apply = loss_scale.update([grad])
            return should_apply

        def step(finite):
            return strategy.run(replica_step, args=(finite,))

        step = test_util.maybe_function(step, use_tf_function)
        scales = []
        for finite in inputs:
            should_apply = step(tf.constant(finite))
            for value in strategy.experimental_local_results(should_apply):
                self.assertEqual(bool(value), finite)
            scales.append(float(loss_scale()))
        return scales

    @parameterized.named_parameters(*_trajectory_cases())
    def test_trajectory(
        self, init, period, mult, inputs, expected, strategy_name,
        use_tf_function,
    ):
        strategy = test_util.STRATEGIES[strategy_name]()
        with strategy.scope():
            loss_scale = DynamicLossScale(init, period, mult)
        scales = self._run_trajectory(
            strategy, loss_scale, inputs, use_tf_function
        )
        self.assertEqual(scales, [float(np.float32(e)) for e in expected])
        for component in strategy.experimental_local_results(
            loss_scale.current_loss_scale
        ):
            self.assertEqual(float(component), scales[-1])

    def test_counter_cycles_and_resets(self):
        loss_scale = DynamicLossScale(1, 3)
        counts = []
        for grad in [1.0, 1.0, 1.0, 1.0, NAN, 1.0]:
            loss_scale.update([tf.constant(grad)])
            counts.append(int(loss_scale.good_steps))
        self.assertEqual(counts, [1, 2, 0, 1, 0, 1])

    def test_floor_applies_to_scale_below_one(self):
        loss_scale = DynamicLossScale(0.25, 2)
        loss_scale.update([tf.constant(NAN)])
        self.assertEqual(float(loss_scale()), 1.0)

    @test_util.EAGER_AND_FUNCTION
    def test_gradient_structures(self, use_tf_function):
        loss_scale = DynamicLossScale(4, 100)

        def check(grads):
            return loss_scale.update(grads)[1]

        check = test_util.maybe_function(check, use_tf_function)
        one = tf.constant([1.0, 2.0])
        nan = tf.constant([1.0, NAN])
        self.assertTrue(bool(check(one)))  # A bare tensor.
        self.assertTrue(bool(check({"a": one, "b": [one, None]})))
        self.assertFalse(bool(check({"a": one, "b": [None, nan]})))
        self.assertFalse(bool(check((tf.constant(float("-inf"), tf.float16),))))

    def test_none_and_empty_gradients_count_as_finite(self):
        loss_scale = DynamicLossScale(2, 1)
        self.assertTrue(bool(loss_scale.update([None])[1]))
        self.assertTrue(bool(loss_scale.update([])[1]))
        self.assertEqual(float(loss_scale()), 8.0)  # Two good steps.

    @test_util.EAGER_AND_FUNCTION
    def test_indexed_slices_checked_on_values(self, use_tf_function):
        loss_scale = DynamicLossScale(2, 100)
        update = test_util.maybe_function(
            lambda grads: loss_scale.update(grads)[1], use_tf_function
        )
        bad = tf.IndexedSlices(
            tf.constant([[1.0, NAN]]), tf.constant([1]), tf.constant([3, 2])
        )
        self.assertFalse(bool(update([bad])))
        self.assertEqual(float(loss_scale()), 1.0)

    def test_integer_gradients_raise(self):
        with self.assertRaises(tf.errors.InvalidArgumentError):
            DynamicLossScale().update([tf.constant(1)])

    def test_update_in_cross_replica_context_with_per_replica_grads(self):
        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            loss_scale = DynamicLossScale(8, 100)
            grads = strategy.run(lambda: test_util.value_on_replica_0(NAN, 1.0))
            _, should_apply = loss_scale.update([grads])
        self.assertFalse(bool(should_apply))
        self.assertEqual(float(loss_scale()), 4.0)

    def test_variables_and_legacy_aliases(self):
        loss_scale = DynamicLossScale()
        self.assertIs(loss_scale._current_loss_scale, loss_scale.current_loss_scale)
        self.assertIs(loss_scale._num_good_steps, loss_scale.good_steps)
        self.assertEqual(loss_scale.current_loss_scale.dtype, tf.float32)
        self.assertEqual(loss_scale.good_steps.dtype, tf.int64)
        self.assertFalse(loss_scale.current_loss_scale.trainable)
        self.assertEqual(
            loss_scale.current_loss_scale.name, "current_loss_scale:0"
        )
        self.assertEqual(loss_scale.good_steps.name, "good_steps:0")

    def test_defaults_properties_and_config(self):
        loss_scale = DynamicLossScale()
        self.assertEqual(loss_scale.initial_loss_scale, 32768.0)
        self.assertEqual(loss_scale.increment_period, 2000)
        self.assertEqual(loss_scale.multiplier, 2.0)
        self.assertEqual(float(loss_scale()), 32768.0)
        config = DynamicLossScale(1, 2, 3).get_config()
        self.assertEqual(
            config,
            {"initial_loss_scale": 1.0, "increment_period": 2, "multiplier": 3.0},
        )
        restored = DynamicLossScale.from_config(config)
        self.assertEqual(
            (float(restored()), restored.increment_period, restored.multiplier),
            (1.0, 2, 3.0),
        )

    def test_repr_eager_and_graph(self):
        loss_scale = DynamicLossScale(1, 2, 3)
        self.assertEqual(
            repr(loss_scale),
            "DynamicLossScale(current_loss_scale=1.0, num_good_steps=0, "
            "initial_loss_scale=1.0, increment_period=2, multiplier=3.0)",
        )
        reprs = []
        tf.function(lambda: reprs.append(repr(loss_scale)))()
        self.assertEqual(
            reprs,
            ["DynamicLossScale(initial_loss_scale=1.0, increment_period=2, "
             "multiplier=3.0)"],
        )

    @parameterized.named_parameters(
        ("string_scale", {"initial_loss_scale": "abc"}, TypeError, "must be a number"),
        ("zero_scale", {"initial_loss_scale": 0}, ValueError, "positive and finite"),
        ("inf_scale", {"initial_loss_scale": float("inf")}, ValueError, "positive"),
        ("fractional_period", {"increment_period": 2.7}, ValueError,
         "integer of at least 1"),
        ("zero_period", {"increment_period": 0}, ValueError, "integer of at least 1"),
        ("small_multiplier", {"multiplier": 0.5}, ValueError, "at least 1"),
    )
    def test_invalid_arguments(self, kwargs, error, message):
        with self.assertRaisesRegex(error, message):
            DynamicLossScale(**kwargs)

    def test_checkpoint_names_and_round_trip(self):
        loss_scale = DynamicLossScale(2, 3)
        loss_scale.update([tf.constant(1.0)])
        checkpoint = tf.train.Checkpoint(loss_scale=loss_scale)
        path = checkpoint.save(self.create_tempdir().full_path + "/ckpt")
        names = [name for name, _ in tf.train.list_variables(path)]
        self.assertIn("loss_scale/current_loss_scale/.ATTRIBUTES/VARIABLE_VALUE", names)
        self.assertIn("loss_scale/good_steps/.ATTRIBUTES/VARIABLE_VALUE", names)
        loss_scale.update([tf.constant(NAN)])
        checkpoint.restore(path).assert_consumed()
        self.assertEqual((float(loss_scale()), int(loss_scale.good_steps)), (2.0, 1))


def _reference_trajectory(init, period, multiplier, inputs):
    """The legacy rule (spec 1.4.4) in plain float32 Python."""
    scale, count, scales, counts = np.float32(init), 0, [], []
    for finite in inputs:
        if finite:
            if count + 1 >= period:
                grown = np.float32(scale * np.float32(multiplier))
                if np.isfinite(grown):
                    scale = grown
                count = 0
            else:
                count += 1
        else:
            scale = max(np.float32(scale / np.float32(multiplier)), np.float32(1))
            count = 0
        scales.append(float(scale))
        counts.append(count)
    return scales, counts


class GraphModeTest(tf.test.TestCase):
    """tf.compat.v1 graphs and sessions, as TF 1.x-style code used them."""

    def test_update_op_is_a_tensor(self):
        with tf.Graph().as_default():
            loss_scale = DynamicLossScale(2, 1)
            grad = tf.compat.v1.placeholder(tf.float32, [])
            update_op, should_apply = loss_scale.update([grad])
            self.assertIsInstance(update_op, tf.Tensor)
            train_op = tf.identity(update_op)  # TF 2.x code did this.
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                trajectory = []
                for value in (1.0, 1.0, NAN, 1.0):
                    _, applied = session.run([train_op, should_apply],
                                             {grad: value})
                    trajectory.append(
                        (session.run(loss_scale()), bool(applied)))
        self.assertEqual(trajectory,
                         [(4.0, True), (8.0, True), (4.0, False), (8.0, True)])

    def test_should_apply_depends_on_the_gradients_only(self):
        # TF 2.4: `should_apply` can be evaluated before the loss scale's
        # variables are initialized (it reads no variable).
        with tf.Graph().as_default():
            loss_scale = DynamicLossScale(2, 1)
            grad = tf.compat.v1.placeholder(tf.float32, [])
            update_op, should_apply = loss_scale.update([grad])
            with tf.compat.v1.Session() as session:
                self.assertTrue(session.run(should_apply, {grad: 1.0}))
                self.assertFalse(session.run(should_apply, {grad: NAN}))
                session.run(tf.compat.v1.global_variables_initializer())
                self.assertEqual(session.run(update_op, {grad: 1.0}), 4.0)

    def test_corrupt_scale_fails_the_session_run(self):
        with tf.Graph().as_default():
            loss_scale = DynamicLossScale(2, 1)
            update_op, _ = loss_scale.update([tf.constant(NAN)])
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                session.run(loss_scale.current_loss_scale.assign(NAN))
                with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                            "corrupt checkpoint"):
                    session.run(update_op)


class DynamicLossScalePropertyTest(tf.test.TestCase):
    @hypothesis.settings(max_examples=40, deadline=None)
    @hypothesis.given(
        init=st.sampled_from([0.5, 1.0, 3.0, 2.0**15, F32_MAX / 2]),
        period=st.integers(1, 4),
        multiplier=st.sampled_from([1.0, 2.0, 3.0]),
        inputs=st.lists(st.booleans(), max_size=12),
    )
    def test_matches_reference_and_stays_in_bounds(
        self, init, period, multiplier, inputs
    ):
        loss_scale = DynamicLossScale(init, period, multiplier)
        scales, counts = [], []
        for finite in inputs:
            loss_scale.update([tf.constant(1.0 if finite else NAN)])
            scales.append(float(loss_scale()))
            counts.append(int(loss_scale.good_steps))
        self.assertEqual(
            (scales, counts),
            _reference_trajectory(init, period, multiplier, inputs),
        )
        for scale in scales:
            self.assertTrue(np.isfinite(scale) and scale > 0)


class LossScaleTest(tf.test.TestCase):
    def test_abstract(self):
        with self.assertRaisesRegex(TypeError, "abstract"):
            LossScale()

    def test_used_like_a_tensor(self):
        loss_scale = DynamicLossScale(8)
        self.assertEqual(float(tf.convert_to_tensor(loss_scale)), 8.0)
        self.assertEqual(float(loss_scale), 8.0)
        self.assertEqual(loss_scale.numpy(), np.float32(8.0))
        self.assertEqual(float(loss_scale * 2), 16.0)
        self.assertEqual(float(2 * loss_scale), 16.0)
        self.assertEqual(float(1 / loss_scale), 0.125)
        self.assertEqual(float(loss_scale - 1), 7.0)
        self.assertEqual(float(tf.constant(2.0) * loss_scale), 16.0)
        self.assertTrue(bool(loss_scale > 4))
        self.assertEqual(float(np.asarray(loss_scale)), 8.0)
        self.assertEqual(f"{loss_scale:.1f}", "8.0")
        self.assertEqual(tf_lso.experimental.FixedLossScale(2).dtype, tf.float32)

    def test_returned_from_tf_function_and_summary(self):
        loss_scale = DynamicLossScale(8)
        result = tf.function(lambda: loss_scale)()
        self.assertIsInstance(result, tf.Tensor)
        self.assertEqual(float(result), 8.0)
        writer = tf.summary.create_file_writer(self.create_tempdir().full_path)
        with writer.as_default():
            self.assertTrue(tf.summary.scalar("loss_scale", loss_scale, step=0))

    def test_custom_subclass(self):
        class HalvingLossScale(LossScale):
            def __init__(self):
                super().__init__()
                self.value = tf.Variable(64.0)

            def __call__(self):
                return tf.convert_to_tensor(self.value)

            def update(self, grads):
                self.value.assign(self.value / 2)
                return None, True

            def get_config(self):
                return {}

        loss_scale = HalvingLossScale()
        loss_scale.update([])
        self.assertEqual(float(loss_scale * 1), 32.0)
        self.assertIsInstance(HalvingLossScale.from_config({}), HalvingLossScale)


class TensorFlowOptimizerTest(tf.test.TestCase, parameterized.TestCase):
    """tf_lso's loss scales in TensorFlow's own TF1-style loss scale optimizer.

    `tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer` (TF1
    optimizers, as NVIDIA's Mask R-CNN uses it) takes them as TF's own: they
    are registered as virtual subclasses of TF's deprecated classes.
    """

    def test_are_tensorflows_loss_scales(self):
        tf_classes = tf.compat.v1.mixed_precision
        self.assertIsInstance(DynamicLossScale(), tf_classes.DynamicLossScale)
        self.assertIsInstance(FixedLossScale(2), tf_classes.FixedLossScale)
        self.assertIsInstance(FixedLossScale(2), tf_classes.LossScale)
        self.assertNotIsInstance(FixedLossScale(2), tf_classes.DynamicLossScale)

    @parameterized.parameters("eager", "graph")
    def test_dynamic_scale_skips_in_tensorflows_optimizer(self, mode):
        with (tf.Graph().as_default() if mode == "graph"
              else contextlib.nullcontext()):
            loss_scale = DynamicLossScale(8.0, 2)
            var = tf.Variable(1.0)
            opt = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
                tf.compat.v1.train.GradientDescentOptimizer(1.0), loss_scale)
            self.assertIs(opt._loss_scale, loss_scale)  # Not converted.
            steps = [lambda: var * 2.0, lambda: var * float("inf")]
            if mode == "eager":
                for loss in steps:
                    opt.minimize(loss, var_list=[var])
                values = float(var.numpy()), float(loss_scale())
            else:
                ops = [opt.minimize(loss()) for loss in steps]
                with tf.compat.v1.Session() as session:
                    session.run(tf.compat.v1.global_variables_initializer())
                    for op in ops:
                        session.run(op)
                    values = session.run((var, loss_scale()))
        self.assertEqual(tuple(map(float, values)), (-1.0, 4.0))

    def test_fixed_scale_in_tensorflows_optimizer(self):
        var = tf.Variable(1.0)
        check = test_util.create_identity_with_grad_check_fn(4.0)
        opt = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(1.0),
            FixedLossScale(4))
        opt.minimize(lambda: check(var), var_list=[var])
        self.assertEqual(float(var.numpy()), 0.0)


if __name__ == "__main__":
    tf.test.main()
