"""Tests for tf_lso._src.optimizer.loss_scale_optimizer (the TF 2.4 class)."""

import contextlib
import warnings
from unittest import mock

import keras
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import tf_lso
from tf_lso._src import compat
from tf_lso._src.gradients import packing as gradients_lib
from tf_lso._src.optimizer import loss_scale_optimizer as lso_lib

import inner_kinds
import test_util

NAN = float("nan")


STRATEGY_AND_MODE = parameterized.named_parameters(
    *test_util.strategy_and_mode_cases()
)


def _run(strategy, fn, use_tf_function, *args):
    step = test_util.maybe_function(
        lambda *a: strategy.run(fn, args=a), use_tf_function
    )
    return step(*args)


class ScalingTest(tf.test.TestCase, parameterized.TestCase):
    @STRATEGY_AND_MODE
    def test_fixed_scale_reaches_gradient_with_minimize(
        self, strategy_name, use_tf_function
    ):
        strategy = test_util.STRATEGIES[strategy_name]()
        replicas = strategy.num_replicas_in_sync
        with strategy.scope():
            var = tf.Variable(5.0)
            opt = tf_lso.LossScaleOptimizer(
                keras.optimizers.SGD(2.0), dynamic=False, initial_scale=10
            )
        check = test_util.create_identity_with_grad_check_fn(10.0 / replicas)

        def step():
            opt.minimize(lambda: check(var) / replicas, [var])

        _run(strategy, step, use_tf_function)
        self.assertEqual(test_util.num(var), 3.0)
        self.assertIsInstance(opt.loss_scale, tf.Tensor)
        self.assertEqual(float(opt.loss_scale), 10.0)

    def test_get_gradients_in_tf_function(self):
        var = tf.Variable(5.0)
        opt = tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(1.0), dynamic=False, initial_scale=10
        )
        check = test_util.create_identity_with_grad_check_fn(10.0)
        grads = tf.function(lambda: opt.get_gradients(check(var) * 1.0, [var]))()
        self.assertEqual(float(grads[0]), 1.0)
        with self.assertRaisesRegex(RuntimeError, "not supported when eager"):
            opt.get_gradients(var * 1.0, [var])

    @test_util.EAGER_AND_FUNCTION
    def test_minimize_with_tape_and_tensor_loss(self, use_tf_function):
        var = tf.Variable(5.0)
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=4)

        def step():
            with tf.GradientTape() as tape:
                loss = var * 2.0
            opt.minimize(loss, [var], tape=tape)

        test_util.maybe_function(step, use_tf_function)()
        self.assertEqual(test_util.num(var), 3.0)
        with self.assertRaisesRegex(ValueError, "`tape` is required"):
            opt.minimize(tf.constant(1.0), [var])

    @test_util.EAGER_AND_FUNCTION
    def test_minimize_keras_variables(self, use_tf_function):
        # A Keras 3 model's variables, as `model.trainable_variables` gives
        # them; a non-trainable one is only differentiated if watched.
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        frozen = keras.Variable(3.0, trainable=False)
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                        initial_scale=4)
        model.set_weights([np.array([[2.0]]), np.array([1.0])])

        def loss():
            return tf.reduce_sum(model(tf.ones((1, 1)))) + frozen * 2.0

        test_util.maybe_function(
            lambda: opt.minimize(loss, model.trainable_variables + [frozen]),
            use_tf_function)()
        kernel, bias = model.weights
        self.assertAllEqual(kernel, [[1.0]])
        self.assertAllEqual(bias, [0.0])
        self.assertEqual(float(frozen.numpy()), 1.0)

    def test_get_scaled_loss(self):
        opt = tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(1.0), dynamic=False, initial_scale=2
        )
        loss = tf.constant(5.0)
        self.assertEqual(float(opt.get_scaled_loss(loss)), 10.0)
        self.assertEqual(float(opt.get_scaled_loss(lambda: loss)()), 10.0)
        half = opt.get_scaled_loss(tf.constant(5.0, tf.float16))
        self.assertEqual(half.dtype, tf.float16)
        self.assertEqual(float(half), 10.0)
        vector = opt.get_scaled_loss(tf.constant([1.0, 2.0]))
        self.assertAllEqual(vector, [2.0, 4.0])

    def test_callable_scaled_loss_reads_scale_when_called(self):
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=2)
        scaled = opt.get_scaled_loss(lambda: tf.constant(1.0))
        opt._loss_scale.current_loss_scale.assign(8.0)
        self.assertEqual(float(scaled()), 8.0)

    def test_get_unscaled_gradients(self):
        opt = tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(1.0), dynamic=False, initial_scale=2
        )
        grads = opt.get_unscaled_gradients(
            [tf.constant(3.0), None, tf.constant(-4.0, tf.float16)]
        )
        self.assertEqual(float(grads[0]), 1.5)
        self.assertIsNone(grads[1])
        self.assertEqual(grads[2].dtype, tf.float16)
        self.assertEqual(float(grads[2]), -2.0)

    def test_get_unscaled_sparse_gradients(self):
        opt = tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(1.0), dynamic=False, initial_scale=2
        )
        sparse = tf.IndexedSlices(
            tf.constant([[4.0, 2.0], [8.0, 5.0]]),
            tf.constant([1, 3]),
            tf.constant([6, 2]),
        )
        (result,) = opt.get_unscaled_gradients([sparse])
        self.assertIsInstance(result, tf.IndexedSlices)
        self.assertAllEqual(result.values, [[2.0, 1.0], [4.0, 2.5]])
        self.assertAllEqual(result.indices, [1, 3])
        self.assertAllEqual(result.dense_shape, [6, 2])


class ApplyGradientsTest(tf.test.TestCase, parameterized.TestCase):
    @STRATEGY_AND_MODE
    def test_dynamic_update(self, strategy_name, use_tf_function):
        strategy = test_util.STRATEGIES[strategy_name]()
        replicas = strategy.num_replicas_in_sync
        with strategy.scope():
            var = tf.Variable([1.0, 2.0])
            opt = tf_lso.LossScaleOptimizer(
                keras.optimizers.SGD(1.0), initial_scale=2,
                dynamic_growth_steps=1,
            )

        def step(bad):
            # `bad` makes only replica 0's gradient NaN.
            grad = tf.where(
                bad, test_util.value_on_replica_0(NAN, 1.0), 1.0
            ) / replicas
            opt.apply_gradients([(tf.fill([2], grad), var)])

        _run(strategy, step, use_tf_function, tf.constant(False))
        self.assertAllEqual(var, [0.0, 1.0])
        self.assertEqual(float(opt.loss_scale), 4.0)
        _run(strategy, step, use_tf_function, tf.constant(True))
        self.assertAllEqual(var, [0.0, 1.0])
        self.assertEqual(float(opt.loss_scale), 2.0)
        self.assertEqual(test_util.num(opt.iterations), 2)
        for component in strategy.experimental_local_results(var):
            self.assertAllEqual(component, [0.0, 1.0])

    @STRATEGY_AND_MODE
    def test_nan_on_second_replica_only_skips_everywhere(
        self, strategy_name, use_tf_function
    ):
        strategy = test_util.STRATEGIES[strategy_name]()
        with strategy.scope():
            var = tf.Variable(1.0)
            opt = tf_lso.LossScaleOptimizer(
                keras.optimizers.SGD(1.0, momentum=0.5), initial_scale=8
            )

        def step():
            replica = test_util.replica_id()
            last = strategy.num_replicas_in_sync - 1
            grad = tf.where(tf.equal(replica, last), float("inf"), 1.0)
            opt.apply_gradients([(grad, var)])

        _run(strategy, step, use_tf_function)
        self.assertEqual(test_util.num(var), 1.0)
        self.assertEqual(float(opt.loss_scale), 4.0)
        self.assertEqual(test_util.num(opt.dynamic_counter), 0)
        for slot in opt.inner_optimizer.variables:
            if "momentum" in slot.path:
                self.assertEqual(test_util.num(slot), 0.0)

    @test_util.EAGER_AND_FUNCTION
    def test_golden_step_sequence(self, use_tf_function):
        # Spec 2.3.5: SGD(1.0), initial_scale 4, growth 2.
        var = tf.Variable(5.0)
        opt = tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(1.0), initial_scale=4, dynamic_growth_steps=2
        )
        step = test_util.maybe_function(
            lambda g: opt.apply_gradients([(g, var)]), use_tf_function
        )
        observed = []
        for grad in [2.0, NAN, 1.0, 1.0]:
            step(tf.constant(grad))
            observed.append(
                (test_util.num(var), float(opt.loss_scale),
                 test_util.num(opt.dynamic_counter),
                 test_util.num(opt.iterations))
            )
        self.assertEqual(
            observed,
            [(3.0, 4.0, 1, 1), (3.0, 2.0, 0, 2), (2.0, 2.0, 1, 3),
             (1.0, 4.0, 0, 4)],
        )

    @test_util.EAGER_AND_FUNCTION
    def test_slots_untouched_on_skipped_step(self, use_tf_function):
        var = tf.Variable([1.0, 2.0])
        opt = tf_lso.LossScaleOptimizer(
            keras.optimizers.Adam(0.1), initial_scale=2, dynamic_growth_steps=1
        )
        step = test_util.maybe_function(
            lambda g: opt.apply_gradients([(g, var)]), use_tf_function
        )
        step(tf.constant([1.0, 1.0]))
        before = [v.numpy().copy() for v in opt.inner_optimizer.variables]
        var_before = var.numpy().copy()
        step(tf.constant([1.0, NAN]))
        after = [v.numpy() for v in opt.inner_optimizer.variables]
        self.assertAllEqual(var, var_before)
        for name_var, b, a in zip(opt.inner_optimizer.variables, before, after):
            if name_var.path.endswith("iteration"):
                self.assertEqual(int(a), int(b) + 1)
            else:
                self.assertAllEqual(a, b)

    @STRATEGY_AND_MODE
    def test_momentum_slots_with_growth(self, strategy_name, use_tf_function):
        strategy = test_util.STRATEGIES[strategy_name]()
        replicas = strategy.num_replicas_in_sync
        with strategy.scope():
            var = tf.Variable([1.0, 2.0])
            opt = tf_lso.LossScaleOptimizer(
                keras.optimizers.SGD(1.0, momentum=1.0), initial_scale=2,
                dynamic_growth_steps=1,
            )

        def step():
            opt.minimize(lambda: tf.reduce_sum(var) / replicas, [var])

        _run(strategy, step, use_tf_function)
        self.assertAllEqual(var, [0.0, 1.0])
        self.assertEqual(float(opt.loss_scale), 4.0)
        _run(strategy, step, use_tf_function)
        self.assertAllEqual(var, [-2.0, -1.0])
        self.assertEqual(float(opt.loss_scale), 8.0)

    @test_util.EAGER_AND_FUNCTION
    def test_float16_loss(self, use_tf_function):
        var = tf.Variable(5.0)
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(2.0), initial_scale=2)

        def loss():
            return tf.cast(var, tf.float16)

        test_util.maybe_function(lambda: opt.minimize(loss, [var]), use_tf_function)()
        self.assertEqual(test_util.num(var), 3.0)

    @test_util.EAGER_AND_FUNCTION
    def test_sparse_gradients(self, use_tf_function):
        table = tf.Variable(tf.ones([4, 2]))
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=8)

        def step(value):
            sparse = tf.IndexedSlices(
                tf.fill([1, 2], value), tf.constant([2]), tf.constant([4, 2])
            )
            opt.apply_gradients([(sparse, table)])

        step = test_util.maybe_function(step, use_tf_function)
        step(tf.constant(1.0))
        self.assertAllEqual(table[2], [0.0, 0.0])
        step(tf.constant(NAN))
        self.assertAllEqual(table[2], [0.0, 0.0])
        self.assertEqual(float(opt.loss_scale), 4.0)

    def test_jit_compile_matches_plain_function(self):
        results = []
        for jit in (False, True):
            var = tf.Variable([1.0, -2.0])
            opt = tf_lso.LossScaleOptimizer(
                keras.optimizers.Adam(0.1), initial_scale=4,
                dynamic_growth_steps=1,
            )

            @tf.function(jit_compile=jit)
            def step(grad):
                opt.apply_gradients([(grad, var)])  # noqa: B023 (this loop's)

            for grad in ([1.0, 2.0], [NAN, 1.0], [0.5, -1.0]):
                step(tf.constant(grad))
            results.append((var.numpy(), float(opt.loss_scale),
                            test_util.num(opt.iterations)))
        self.assertAllEqual(results[0][0], results[1][0])
        self.assertEqual(results[0][1:], results[1][1:])
        self.assertEqual(results[0][1:], (8.0, 3))

    @parameterized.named_parameters(
        ("clipnorm", "clipnorm"),
        ("global_clipnorm", "global_clipnorm"),
        ("clipvalue", "clipvalue"),
    )
    def test_clipping_sees_unscaled_gradients(self, clip_name):
        var = tf.Variable(5.0)
        inner = keras.optimizers.SGD(2.0, **{clip_name: 2.0})
        opt = tf_lso.LossScaleOptimizer(
            inner, initial_scale=2, dynamic_growth_steps=1
        )
        self.assertEqual(getattr(opt, clip_name), 2.0)

        def loss():
            return var * 4.0

        opt.minimize(loss, [var])  # Gradient 4, clipped to 2.
        self.assertEqual(test_util.num(var), 1.0)
        self.assertEqual(float(opt.loss_scale), 4.0)
        setattr(opt, clip_name, 3.0)
        self.assertEqual(getattr(inner, clip_name), 3.0)
        opt.minimize(loss, [var])
        self.assertEqual(test_util.num(var), -5.0)
        self.assertEqual(float(opt.loss_scale), 8.0)
        opt.minimize(lambda: var * float("inf"), [var])
        self.assertEqual(test_util.num(var), -5.0)
        self.assertEqual(float(opt.loss_scale), 4.0)

    def test_fixed_scale_applies_non_finite_steps(self):
        var = tf.Variable(1.0)
        opt = tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(1.0), dynamic=False, initial_scale=4
        )
        opt.apply_gradients([(tf.constant(NAN), var)])
        self.assertTrue(np.isnan(test_util.num(var)))

    def test_keras_protocol_scaled_gradients(self):
        var = tf.Variable(5.0)
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=8)
        with tf.GradientTape() as tape:
            loss = opt.scale_loss(var * 2.0)
        grads = tape.gradient(loss, [var])
        self.assertEqual(float(grads[0]), 16.0)
        opt.apply_gradients(zip(grads, [var]))
        self.assertEqual(test_util.num(var), 3.0)
        opt.apply([tf.constant(16.0)], [var])
        self.assertEqual(test_util.num(var), 1.0)

    def test_stateless_apply_is_refused_like_keras(self):
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0))
        with self.assertRaisesRegex(ValueError, "stateless_apply is not supported"):
            opt.stateless_apply([], [], [])

    def test_cross_replica_context_raises(self):
        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            var = tf.Variable(1.0)
            opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0))
            with self.assertRaisesRegex(
                ValueError, "must be called in a replica context"
            ):
                opt.apply_gradients([(tf.constant(1.0), var)])

    def test_unsupported_strategy(self):
        strategy = tf.distribute.experimental.CentralStorageStrategy(
            ["/cpu:0", "/cpu:1"]
        )
        message = (
            "Loss scaling is not supported with the tf.distribute.Strategy: "
            "CentralStorageStrategy"
        )
        with strategy.scope():
            with self.assertRaisesRegex(ValueError, message):
                tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0))
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0))
        with strategy.scope():
            var = tf.Variable(1.0)
            with self.assertRaisesRegex(ValueError, message):
                strategy.run(lambda: opt.minimize(lambda: var * 1.0, [var]))


# Eagerly, in a tf.function, and with jit_compile (see `_compiled`).
_MODES = (("eager", None), ("tf_function", False), ("jit", True))


_KERAS_BASE_ARGUMENTS = (
    ("weight_decay", 0.5), ("clipnorm", 0.5), ("global_clipnorm", 0.5),
    ("clipvalue", 0.5), ("use_ema", True), ("ema_momentum", 0.5),
    ("ema_overwrite_frequency", 2), ("loss_scale_factor", 0.5),
    ("gradient_accumulation_steps", 2),
)


# The two protocols' calls (issue 59): how the loss is scaled, whether
# get_unscaled_gradients is called, how the step is applied.
SCALES = ("get_scaled_loss", "scale_loss")
APPLIES = ("apply_gradients", "apply")
# Where the protocols' calls run: eagerly, in a tf.function, and in a
# tf.function under MirroredStrategy.
PLACES = {"eager": ("default", False), "tf_function": ("default", True),
          "mirrored": ("mirrored", True)}


def _mixed(cls, place):
    """A variable at 1.0, an optimizer with a fixed scale of 1024 (the
    experimental class or TF 2.4's) around SGD(0.25), the strategy, and a
    runner for a replica step (`place`)."""
    strategy_name, use_tf_function = PLACES[place]
    strategy = test_util.STRATEGIES[strategy_name]()
    with strategy.scope():
        var = tf.Variable(1.0)
        inner = keras.optimizers.SGD(0.25)
        opt = (tf_lso.experimental.LossScaleOptimizer(inner, 1024)
               if cls == "v1" else
               tf_lso.LossScaleOptimizer(inner, dynamic=False,
                                         initial_scale=1024))
    run = test_util.maybe_function(lambda fn: strategy.run(fn),
                                   use_tf_function)
    return var, opt, strategy, run


def _applied(strategy, var):
    """How far `var` moved from 1.0, in true gradients of `2 * var` summed
    over the replicas (SGD(0.25) on each replica's 2.0)."""
    [value] = set(test_util.local_values(strategy, var))
    return (1.0 - value) / (0.25 * 2.0 * strategy.num_replicas_in_sync)


class ProtocolsTest(tf.test.TestCase, parameterized.TestCase):
    """Every order of TF 2.x's protocol (get_scaled_loss,
    get_unscaled_gradients, apply_gradients) and Keras 3's (scale_loss,
    apply) mixed: what tf_lso handed out is never scaled or unscaled twice."""

    @parameterized.product(scale=SCALES, unscale=[True, False],
                           apply=APPLIES, cls=["v1", "v2"],
                           place=list(PLACES))
    def test_every_order_applies_the_true_gradient(self, scale, unscale,
                                                   apply, cls, place):
        var, opt, strategy, run = _mixed(cls, place)

        def step():
            with tf.GradientTape() as tape:
                scaled = getattr(opt, scale)(var * 2.0)
            grads = tape.gradient(scaled, [var])
            if unscale:
                grads = opt.get_unscaled_gradients(grads)
            if apply == "apply":
                opt.apply(grads, [var])
            else:
                opt.apply_gradients(zip(grads, [var]))

        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            run(step)
        warned = any(issubclass(w.category, tf_lso.LossScalingWarning)
                     for w in record)
        if (scale, unscale, apply) == ("get_scaled_loss", False,
                                       "apply_gradients"):
            # TF 2.4's apply_gradients applies what it is given: the
            # gradients of the scaled loss, never unscaled (with a warning).
            self.assertEqual(_applied(strategy, var), 1024.0)
            self.assertTrue(warned)
        else:
            self.assertEqual(_applied(strategy, var), 1.0)
            self.assertFalse(warned)

    @parameterized.product(scale=SCALES, apply=APPLIES, cls=["v1", "v2"],
                           place=list(PLACES))
    def test_gradients_computed_from_the_unscaled_ones(self, scale, apply,
                                                       cls, place):
        # Clipped after get_unscaled_gradients: new tensors, which apply()
        # (Keras 3's: scaled gradients) takes as unscaled, with a warning;
        # apply_gradients as they are, as always.
        var, opt, strategy, run = _mixed(cls, place)

        def step():
            with tf.GradientTape() as tape:
                scaled = getattr(opt, scale)(var * 2.0)
            grads = opt.get_unscaled_gradients(tape.gradient(scaled, [var]))
            grads = [tf.clip_by_value(g, -100.0, 100.0) for g in grads]
            if apply == "apply":
                opt.apply(grads, [var])
            else:
                opt.apply_gradients(zip(grads, [var]))

        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            run(step)
            run(step)
        warnings_ = [w for w in record
                     if issubclass(w.category, tf_lso.LossScalingWarning)]
        self.assertEqual(_applied(strategy, var), 2.0)
        self.assertLen(warnings_, 1 if apply == "apply" else 0)
        if warnings_:
            self.assertIn("takes them as unscaled", str(warnings_[0].message))

    @parameterized.product(scale=SCALES, cls=["v1", "v2"],
                           place=list(PLACES))
    def test_a_loss_scaled_twice_is_scaled_once(self, scale, cls, place):
        var, opt, strategy, run = _mixed(cls, place)
        scale_loss = getattr(opt, scale)
        run(lambda: opt.minimize(lambda: scale_loss(var * 2.0), [var]))
        self.assertEqual(_applied(strategy, var), 1.0)

        def twice():
            with tf.GradientTape() as tape:
                scaled = opt.get_scaled_loss(scale_loss(var * 2.0))
            grads = opt.get_unscaled_gradients(tape.gradient(scaled, [var]))
            opt.apply_gradients(zip(grads, [var]))

        run(twice)
        self.assertEqual(_applied(strategy, var), 2.0)

    @parameterized.product(apply=APPLIES, place=list(PLACES))
    def test_unscaled_and_scaled_gradients_in_one_step(self, apply, place):
        # Two losses scaled with Keras 3's scale_loss: the first one's
        # gradients unscaled, the second's not. Each is unscaled once.
        var, opt, strategy, run = _mixed("v2", place)
        with strategy.scope():
            other = tf.Variable(1.0)

        def step():
            with tf.GradientTape() as tape:
                scaled = opt.scale_loss(var * 2.0)
            unscaled = opt.get_unscaled_gradients(
                tape.gradient(scaled, [var]))
            with tf.GradientTape() as tape:
                scaled = opt.scale_loss(other * 2.0)
            grads = unscaled + tape.gradient(scaled, [other])
            if apply == "apply":
                opt.apply(grads, [var, other])
            else:
                opt.apply_gradients(zip(grads, [var, other]))

        run(step)
        self.assertEqual(_applied(strategy, var), 1.0)
        self.assertEqual(_applied(strategy, other), 1.0)

    @parameterized.product(cls=["v1", "v2"], place=list(PLACES))
    def test_gradients_unscaled_twice_are_unscaled_once(self, cls, place):
        var, opt, strategy, run = _mixed(cls, place)

        def step():
            with tf.GradientTape() as tape:
                scaled = opt.get_scaled_loss(var * 2.0)
            grads = opt.get_unscaled_gradients(tape.gradient(scaled, [var]))
            opt.apply_gradients(zip(opt.get_unscaled_gradients(grads), [var]))

        run(step)
        self.assertEqual(_applied(strategy, var), 1.0)

    @parameterized.product(cls=["v1", "v2"], use_tf_function=[False, True])
    def test_a_loss_scaled_in_a_nested_function(self, cls, use_tf_function):
        # Its output is a new tensor, and once traced nothing shows that it
        # scales: minimize would scale it again (TF 2.4 did, silently).
        var, opt, _, _ = _mixed(cls, "eager")

        @tf.function
        def scaled_loss():
            return opt.get_scaled_loss(var * 2.0)

        minimize = test_util.maybe_function(
            lambda: opt.minimize(scaled_loss, [var]), use_tf_function)
        with self.assertRaisesRegex(ValueError, "inside a tf.function of its "
                                    "own.*return the unscaled loss"):
            minimize()
        self.assertEqual(float(var), 1.0)

    @parameterized.product(cls=["v1", "v2"], use_tf_function=[False, True])
    def test_a_loss_function_that_scales_only_to_log(self, cls,
                                                     use_tf_function):
        var, opt, _, _ = _mixed(cls, "eager")
        logged = []

        def loss_fn():
            loss = var * 2.0
            logged.append(opt.get_scaled_loss(loss))
            return loss

        @tf.function
        def nested_loss():
            return var * 2.0

        for loss in (loss_fn, nested_loss):
            test_util.maybe_function(lambda loss=loss: opt.minimize(
                loss, [var]), use_tf_function)()
        self.assertEqual(float(var), 0.0)  # Two steps of the true gradient.

    @test_util.EAGER_AND_FUNCTION
    def test_minimize_of_a_scaled_loss(self, use_tf_function):
        # The case: minimize scales the loss again; TF 2.4 moved
        # the variable to -0.6 (8 times the step), with no warning.
        var = tf.Variable(1.0)
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                        initial_scale=8)
        test_util.maybe_function(
            lambda: opt.minimize(lambda: opt.get_scaled_loss(var * 2.0),
                                 [var]), use_tf_function)()
        self.assertAllClose(float(var), 0.8)

    @test_util.EAGER_AND_FUNCTION
    def test_a_loss_that_is_not_a_float_tensor(self, use_tf_function):
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD())
        for loss, what in (("loss", "of dtype string"),
                           (tf.constant(3), "of dtype int32"),
                           ({"a": 1.0}, "of type dict")):
            for scale in (opt.get_scaled_loss, opt.scale_loss):
                with self.assertRaisesRegex(
                        TypeError, "The loss to scale must be a float "
                        f"tensor. Received: loss=.* {what}"):
                    test_util.maybe_function(scale, use_tf_function)(loss)


class KerasSignatureTest(tf.test.TestCase, parameterized.TestCase):
    """The constructor takes TF 2.4's arguments and Keras 3's."""

    def test_name(self):
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(), name="lso")
        self.assertEqual(opt.name, "lso")
        config = opt.get_config()
        self.assertEqual(config["name"], "lso")
        restored = tf_lso.LossScaleOptimizer.from_config(config)
        self.assertEqual(restored.name, "lso")
        self.assertEqual(restored.get_config(), config)

    def test_no_name_keeps_tf24_config(self):
        config = tf_lso.LossScaleOptimizer(keras.optimizers.SGD()).get_config()
        self.assertEqual(sorted(config), ["dynamic", "dynamic_growth_steps",
                                          "initial_scale", "inner_optimizer"])

    def test_keras3_config_round_trips(self):
        # Keras 3's config (with its name) loads into tf_lso and comes back
        # with the same entries, and tf_lso's loads into Keras 3's class.
        # (An inner name that Keras made up is not configuration for
        # tf_lso, and not in its config: the inner optimizer has its own.)
        keras_lso = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.5, name="inner"), initial_scale=64.0,
            dynamic_growth_steps=10, name="scaled")
        # (Keras 3.0-3.8 configs also hold the base optimizer's settings at
        # their defaults, which neither class keeps as its own.)
        shared = ("name", "inner_optimizer", "initial_scale",
                  "dynamic_growth_steps")
        keras_config = keras_lso.get_config()
        opt = tf_lso.LossScaleOptimizer.from_config(dict(keras_config))
        self.assertEqual(opt.name, "scaled")
        config = opt.get_config()
        for key in shared:
            self.assertEqual(config[key], keras_config[key], key)
        self.assertIs(config["dynamic"], True)
        back = keras.optimizers.LossScaleOptimizer.from_config(dict(config))
        self.assertIs(type(back), keras.optimizers.LossScaleOptimizer)
        self.assertEqual(back.get_config(), keras_config)

    def test_keras3_keywords(self):
        opt = tf_lso.LossScaleOptimizer(
            inner_optimizer=keras.optimizers.SGD(), initial_scale=8.0,
            dynamic_growth_steps=3, name="lso", dynamic=True)
        self.assertEqual((opt.initial_scale, opt.dynamic_growth_steps,
                          opt.dynamic, opt.name), (8.0, 3, True, "lso"))

    @parameterized.named_parameters(
        (name, name, value) for name, value in _KERAS_BASE_ARGUMENTS)
    def test_base_optimizer_argument_belongs_to_the_inner(self, name, value):
        with self.assertRaisesRegex(
                ValueError, f"does not support `{name}`. Instead, set "
                f"`{name}` on the `inner_optimizer`"):
            tf_lso.LossScaleOptimizer(keras.optimizers.SGD(), **{name: value})

    def test_base_optimizer_defaults_are_accepted(self):
        # Keras 3.0-3.3 configs hold them (Keras 3's class accepts them too).
        defaults = {"weight_decay": None, "clipnorm": None,
                    "global_clipnorm": None, "clipvalue": None,
                    "use_ema": False, "ema_momentum": 0.99,
                    "ema_overwrite_frequency": None, "loss_scale_factor": None,
                    "gradient_accumulation_steps": None}
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(), **defaults)
        self.assertNotIn("clipnorm", opt.get_config())
        config = {**opt.get_config(), **defaults, "name": "old"}
        self.assertEqual(
            tf_lso.LossScaleOptimizer.from_config(config).name, "old")
        with self.assertRaisesRegex(ValueError, "set `clipnorm` on the"):
            tf_lso.LossScaleOptimizer.from_config({**config, "clipnorm": 1.0})

    def test_unknown_keywords(self):
        with self.assertRaisesRegex(
                ValueError, "does not support arguments: `foo`, `bar`"):
            tf_lso.LossScaleOptimizer(keras.optimizers.SGD(), foo=True, bar=3)

    def test_tf23_loss_scale_keyword_names_the_experimental_class(self):
        with self.assertRaisesRegex(
                ValueError, "arguments: `loss_scale`.*"
                r"tf_lso.experimental.LossScaleOptimizer\(optimizer, "
                "loss_scale\\)"):
            tf_lso.LossScaleOptimizer(keras.optimizers.SGD(),
                                      loss_scale="dynamic")

    def test_positional_scale_is_tf24s_type_error(self):
        # TF 2.4's second positional argument is `dynamic`. A number there
        # is TF 2.1-2.3's fixed loss scale, not Keras 3's initial scale.
        with self.assertRaisesRegex(
                TypeError, "must be a bool, but got: 1024.*"
                "`initial_scale=` by keyword"):
            tf_lso.LossScaleOptimizer(keras.optimizers.SGD(), 1024)

    def test_experimental_class_takes_a_name(self):
        opt = tf_lso.experimental.LossScaleOptimizer(
            keras.optimizers.SGD(), "dynamic", name="v1")
        self.assertEqual(opt.name, "v1")
        restored = tf_lso.experimental.LossScaleOptimizer.from_config(
            opt.get_config())
        self.assertEqual(restored.name, "v1")


class OverwriteWithGradientTest(tf.test.TestCase, parameterized.TestCase):
    """Variables with `overwrite_with_gradient` (Keras 3's float8 scales).

    Their "gradient" is their next value, not a gradient of the loss: Keras 3
    neither unscales it nor sums it over replicas.
    """

    @parameterized.named_parameters(
        (f"{protocol}_{mode_name}_{kind}", protocol, mode, kind)
        for protocol in ("apply", "scale_loss", "minimize")
        for mode_name, mode in _MODES
        for kind in ("v2", "v1")
    )
    def test_value_passes_through_unscaled(self, protocol, mode, kind):
        value = keras.Variable([1.0, 2.0])
        value.overwrite_with_gradient = True
        var = keras.Variable([1.0, 2.0])
        inner = keras.optimizers.SGD(0.5)
        opt = (tf_lso.LossScaleOptimizer(inner, initial_scale=8)
               if kind == "v2" else
               tf_lso.experimental.LossScaleOptimizer(inner, 8))
        new_value = tf.constant([10.0, 20.0])

        def step():
            if protocol == "apply":  # Keras 3's `apply` takes scaled grads.
                opt.apply([new_value, tf.constant([16.0, 8.0])],
                          [value, var])
            elif protocol == "scale_loss":  # What `fit` does.
                with tf.GradientTape() as tape:
                    loss = opt.scale_loss(tf.reduce_sum(var * [2.0, 1.0]))
                opt.apply_gradients([(new_value, value),
                                     (tape.gradient(loss, var.value), var)])
            else:
                opt.minimize(
                    lambda: tf.reduce_sum(var * [2.0, 1.0])
                    + tf.reduce_sum(_overwrite_with(value, new_value)),
                    [value, var])

        _compiled(step, mode)()
        self.assertAllEqual(value, [10.0, 20.0])
        self.assertAllEqual(var, [0.0, 1.5])
        self.assertEqual(float(opt.loss_scale if kind == "v2"
                               else opt.loss_scale()), 8.0)

    def test_a_non_finite_value_skips_the_step(self):
        # Keras 3's check covers every gradient, these included.
        value = keras.Variable([1.0, 2.0])
        value.overwrite_with_gradient = True
        var = keras.Variable([1.0, 2.0])
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.5),
                                        initial_scale=8)
        opt.apply([tf.constant([NAN, 1.0]), tf.constant([16.0, 8.0])],
                  [value, var])
        self.assertAllEqual(value, [1.0, 2.0])
        self.assertAllEqual(var, [1.0, 2.0])
        self.assertEqual(float(opt.loss_scale), 4.0)
        self.assertEqual(int(opt.skipped_steps), 1)

    @parameterized.named_parameters(("eager", False), ("tf_function", True))
    def test_mirrored_matches_bare_keras_optimizer(self, use_tf_function):
        # Each replica writes its own value, as the bare optimizer does; the
        # other gradients are summed over replicas.
        strategy = test_util.mirrored_strategy()
        results = []
        for wrap in (False, True):
            with strategy.scope():
                value = keras.Variable([1.0, 2.0])
                value.overwrite_with_gradient = True
                var = keras.Variable([1.0, 2.0])
                opt = keras.optimizers.SGD(0.5)
                if wrap:
                    opt = tf_lso.LossScaleOptimizer(opt, initial_scale=4)
                opt.build([value, var])

            def step(opt=opt, value=value, var=var):
                replica = tf.cast(test_util.replica_id(), tf.float32)
                grad = tf.stack([replica + 10.0, 20.0])
                scale = opt.scale_loss(tf.constant(1.0))
                opt.apply([grad, grad * scale], [value, var])

            _run(strategy, step, use_tf_function)
            results.append([test_util.local_values(strategy, v)
                            for v in (value, var)])
        self.assertAllEqual(results[1], results[0])
        self.assertAllEqual(results[1][0], [[10.0, 20.0], [11.0, 20.0]])


def _compiled(fn, jit_compile):
    """`fn` as it is (None), or a tf.function with `jit_compile`."""
    return fn if jit_compile is None else tf.function(
        fn, jit_compile=jit_compile)


def _overwrite_with(variable, new_value):
    """`variable` (as a loss term) whose gradient is `new_value`, as float8
    layers make the gradients of their scale variables."""

    @tf.custom_gradient
    def identity(x):
        return tf.identity(x), lambda dx: new_value

    return identity(variable.value)


class StackedAndSingleGradientsTest(tf.test.TestCase, parameterized.TestCase):
    @STRATEGY_AND_MODE
    def test_mix_of_stacked_and_single_gradients(
        self, strategy_name, use_tf_function
    ):
        # Regression: two same-shaped gradients (stacked) next to one of
        # another shape failed in a tf.function with "All custom_gradient
        # outputs should be from the same graph".
        strategy = test_util.STRATEGIES[strategy_name]()
        replicas = strategy.num_replicas_in_sync
        with strategy.scope():
            a, b = tf.Variable(tf.ones([3])), tf.Variable(tf.ones([3]))
            kernel = tf.Variable(tf.ones([2, 3]))
            opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                            initial_scale=4)

        def step():
            with tf.GradientTape() as tape:
                loss = (tf.reduce_sum(a * b) + tf.reduce_sum(kernel)) / replicas
                scaled = opt.get_scaled_loss(loss)
            grads = opt.get_unscaled_gradients(
                tape.gradient(scaled, [a, b, kernel]))
            opt.apply_gradients(zip(grads, [a, b, kernel]))

        _run(strategy, step, use_tf_function)
        self.assertAllEqual(a, [0.0, 0.0, 0.0])
        self.assertAllEqual(kernel, tf.zeros([2, 3]))


class PlainPathTest(tf.test.TestCase, parameterized.TestCase):
    """The stacked fast path equals per-tensor loss scaling, bit for bit."""

    @parameterized.product(protocol=["keras", "legacy"],
                           use_tf_function=[False, True])
    def test_matches_per_tensor_reference(self, protocol, use_tf_function):
        rng = np.random.default_rng(0)
        init = [rng.normal(size=(4, 4)) for _ in range(6)]
        init += [rng.normal(size=(10, 4)), rng.normal(size=(4,))]
        ids = tf.constant([[1, 3], [3, 7]])
        blow_up = [1.0, 1.0, 1e38, 1.0, 1.0, 1.0, 1e38, 1.0]  # overflows

        def loss_fn(variables, factor):
            *kernels, table, bias = variables
            h = tf.reduce_mean(tf.gather(table, ids), axis=1)  # IndexedSlices
            for kernel in kernels:
                h = tf.tanh(h @ kernel + bias)
            return tf.reduce_sum(tf.square(h)) * factor

        def new_variables():
            return [tf.Variable(tf.constant(v, tf.float32)) for v in init]

        ours = new_variables()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.Adam(0.01),
                                        initial_scale=1000,  # 1/1000 rounds
                                        dynamic_growth_steps=2)

        def our_step(factor):
            with tf.GradientTape() as tape:
                loss = loss_fn(ours, factor)
                if protocol == "keras":
                    scaled = opt.scale_loss(loss)
                else:
                    scaled = opt.get_scaled_loss(loss)
            grads = tape.gradient(scaled, ours)
            if protocol == "legacy":
                grads = opt.get_unscaled_gradients(grads)
            opt.apply_gradients(zip(grads, ours))

        reference = new_variables()
        bare = keras.optimizers.Adam(0.01)
        bare.build(reference)

        def reference_step(factor, scale):
            with tf.GradientTape() as tape:
                scaled = loss_fn(reference, factor) * scale
            grads = tape.gradient(scaled, reference)
            grads = [_unscale_one(g, 1.0 / scale) for g in grads]
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(
                g.values if isinstance(g, tf.IndexedSlices) else g))
                for g in grads])

            def apply():
                bare.apply_gradients(zip(grads, reference))
                return tf.constant(True)

            def skip():
                bare.iterations.assign_add(1)
                return tf.constant(False)

            return tf.cond(finite, apply, skip)

        # The reference runs in the same mode: graph and eager kernels may
        # round differently.
        reference_step = test_util.maybe_function(reference_step,
                                                  use_tf_function)
        step = test_util.maybe_function(our_step, use_tf_function)
        scale, good = 1000.0, 0
        for factor in blow_up:
            step(tf.constant(factor))
            if reference_step(tf.constant(factor), tf.constant(scale)):
                good += 1
                if good == 2:
                    scale, good = scale * 2, 0
            else:
                scale, good = max(scale / 2, 1.0), 0
            self.assertEqual(float(opt.loss_scale), scale)
            for a, b in zip(ours, reference):
                self.assertAllEqual(a, b)
            for a, b in zip(opt.inner_optimizer.variables, bare.variables):
                self.assertAllEqual(a, b)
        self.assertEqual(int(opt.skipped_steps), 2)


class ReusedPackingTest(tf.test.TestCase, parameterized.TestCase):
    """The TF 2.x protocol packs once: `apply_gradients` reuses what
    `get_unscaled_gradients` packed (`gradients.HandedOut`)."""

    def _setup(self, strategy):
        rng = np.random.default_rng(1)
        with strategy.scope():
            variables = [tf.Variable(tf.constant(rng.normal(size=(4, 4)),
                                                 tf.float32))
                         for _ in range(3)]
            variables += [tf.Variable(tf.constant(rng.normal(size=(10, 4)),
                                                  tf.float32)),
                          tf.Variable(tf.zeros([4]))]
            opt = tf_lso.LossScaleOptimizer(
                keras.optimizers.SGD(0.01, momentum=0.9), initial_scale=8,
                dynamic_growth_steps=2)
        ids = tf.constant([[1, 3], [3, 7]])

        def loss_fn(factor):
            *kernels, table, bias = variables
            h = tf.reduce_mean(tf.gather(table, ids), axis=1)  # IndexedSlices
            for kernel in kernels:
                h = tf.tanh(h @ kernel + bias)
            return tf.reduce_sum(tf.square(h)) * factor

        def step(factor, change=None):
            with tf.GradientTape() as tape:
                scaled = opt.get_scaled_loss(loss_fn(factor))
            grads = opt.get_unscaled_gradients(
                tape.gradient(scaled, variables))
            if change is not None:
                grads = change(grads)
            opt.apply_gradients(zip(grads, variables))

        return variables, opt, step

    def test_traced_step_stacks_once(self):
        _, _, step = self._setup(tf.distribute.get_strategy())
        graph = tf.function(step).get_concrete_function(
            tf.constant(1.0)).graph
        # One group of same-shaped small gradients: the three 4x4 kernels'.
        stacks = [op for op in graph.get_operations() if op.type == "Pack"
                  and op.outputs[0].shape.as_list() == [3, 4, 4]]
        self.assertLen(stacks, 1)

    @parameterized.product(strategy_name=["default", "mirrored"],
                           use_tf_function=[False, True])
    def test_matches_the_plain_path_bit_for_bit(self, strategy_name,
                                                use_tf_function):
        strategy = test_util.STRATEGIES[strategy_name]()
        factors = [1.0, 1e38, 1.0, 1.0, np.inf, 1.0, 1.0, 1.0]
        runs = []
        for reuse in (True, False):
            variables, opt, step = self._setup(strategy)
            run = test_util.maybe_function(
                lambda f, step=step: strategy.run(step, args=(f,)),
                use_tf_function)
            patch = (contextlib.nullcontext() if reuse else mock.patch.object(
                gradients_lib.HandedOut, "take", lambda self, grads: None))
            with patch:
                for factor in factors:
                    run(tf.constant(factor, tf.float32))
            runs.append([test_util.local_values(strategy, v)[0]
                         for v in variables + list(opt.variables)]
                        + [test_util.num(opt.loss_scale),
                           test_util.num(opt.skipped_steps)])
        self.assertEqual(int(runs[0][-1]), 2)
        for ours, plain in zip(*runs):
            self.assertAllEqual(ours, plain)

    @parameterized.parameters(False, True)
    def test_a_changed_list_is_packed_afresh(self, use_tf_function):
        def halve(grads):  # New tensors: the packed ones must not be used.
            return [_unscale_one(g, 0.5) for g in grads]

        results = []
        for change in (halve, None):
            variables, opt, step = self._setup(tf.distribute.get_strategy())
            if change is None:  # The same update, spelled as a learning rate.
                opt.learning_rate = 0.005
            run = test_util.maybe_function(
                lambda f, step=step, change=change: step(f, change),
                use_tf_function)
            for factor in (1.0, 1.0, 1.0):
                run(tf.constant(factor))
            results.append([v.numpy() for v in variables])
        for halved, slower in zip(*results):
            self.assertAllClose(halved, slower, rtol=1e-6, atol=1e-7)


def _unscale_one(grad, reciprocal):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * reciprocal, grad.indices,
                                grad.dense_shape)
    return grad * reciprocal


F32_MAX = float(np.finfo(np.float32).max)


class HugeScaleTest(tf.test.TestCase, parameterized.TestCase):
    """Scales above 2**126, which the dynamic rule can reach, still train."""

    @parameterized.product(
        protocol=["tf2", "keras"],
        mode=["eager", "tf_function", "jit"],
        dynamic=[True, False],
    )
    def test_steps_apply_the_unscaled_gradient(self, protocol, mode, dynamic):
        var = tf.Variable(1.0)
        opt = tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(1.0), dynamic=dynamic, initial_scale=2**127,
            dynamic_growth_steps=1 if dynamic else None,
        )

        def step():
            with tf.GradientTape() as tape:
                if protocol == "keras":
                    loss = opt.scale_loss(var * 0.25)
                else:
                    loss = opt.get_scaled_loss(var * 0.25)
            grads = tape.gradient(loss, [var])
            if protocol == "tf2":
                grads = opt.get_unscaled_gradients(grads)
            opt.apply_gradients(zip(grads, [var]))

        if mode != "eager":
            step = tf.function(step, jit_compile=mode == "jit")
        step()
        step()
        # Growing 2**127 would overflow, so the scale saturates there.
        self.assertEqual(test_util.num(var), 0.5)
        self.assertEqual(float(opt.loss_scale), 2.0**127)

    @test_util.EAGER_AND_FUNCTION
    def test_float32_max_scale(self, use_tf_function):
        var = tf.Variable([1.0, 2.0])
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                        initial_scale=F32_MAX)
        grads = test_util.maybe_function(
            opt.get_unscaled_gradients, use_tf_function
        )([tf.constant([F32_MAX, F32_MAX / 4])])
        self.assertAllEqual(grads[0], [1.0, 0.25])
        opt.apply_gradients(zip(grads, [var]))
        self.assertAllEqual(var, [0.0, 1.75])


def _inner_of_kind(kind):
    return inner_kinds.sgd(kind, 1.0)


class InvalidApplyTest(tf.test.TestCase, parameterized.TestCase):
    """A failing apply_gradients leaves the loss scale and counters alone."""

    @parameterized.product(
        kind=inner_kinds.NAMES,
        case=["empty", "only_none", "tensor", "shape", "sparse_shape",
              "unowned"],
        use_tf_function=[False, True],
    )
    def test_error_before_any_state_change(self, kind, case, use_tf_function):
        if case == "unowned" and kind == "tf_keras_legacy":
            self.skipTest("OptimizerV2 is not bound to its first variables.")
        var = tf.Variable([1.0, 2.0])
        opt = tf_lso.LossScaleOptimizer(_inner_of_kind(kind), initial_scale=4,
                                        dynamic_growth_steps=1)
        opt.apply_gradients([(tf.constant([1.0, 1.0]), var)])
        other = tf.Variable([3.0, 4.0])
        pairs = {
            "empty": [],
            "only_none": [(None, var)],
            "tensor": [(tf.constant([1.0, 1.0]), tf.constant([1.0, 2.0]))],
            "shape": [(tf.constant([1.0, 1.0, 1.0]), var)],
            "sparse_shape": [(tf.IndexedSlices(tf.constant([[1.0, 1.0]]),
                                               tf.constant([0])), var)],
            "unowned": [(tf.constant([1.0, 1.0]), other)],
        }[case]
        error, message = {
            "empty": (ValueError, "No gradients provided for any variable"),
            "only_none": (ValueError, "No gradients provided for any variable"),
            "tensor": (TypeError, "must be a variable. Received: a "),
            "shape": (ValueError, r"shape \(3,\), but .* shape \(2,\)"),
            "sparse_shape": (ValueError, r"shape \(None, 2\), but .* shape \(2,\)"),
            "unowned": ((ValueError, KeyError), "."),
        }[case]
        apply = test_util.maybe_function(
            lambda: opt.apply_gradients(pairs), use_tf_function
        )
        before = [float(opt.loss_scale), test_util.num(opt.dynamic_counter),
                  test_util.num(opt.iterations),
                  test_util.num(opt.skipped_steps)]
        self.assertEqual(before, [8.0, 0, 1, 0])
        with self.assertRaisesRegex(error, message):
            apply()
        after = [float(opt.loss_scale), test_util.num(opt.dynamic_counter),
                 test_util.num(opt.iterations),
                 test_util.num(opt.skipped_steps)]
        self.assertEqual(after, before)
        self.assertAllEqual(var, [0.0, 1.0])


class GradientAccumulationTest(tf.test.TestCase, parameterized.TestCase):
    """Keras 3 `gradient_accumulation_steps` on the inner optimizer.

    A non-finite gradient anywhere in a window skips the whole window: its
    accumulated gradients are dropped, no variable or slot changes, and the
    loss scale backs off once.
    """

    WINDOWS = [[1.0, 2.0], [NAN, 0.5], [0.25, -1.0], [3.0, float("inf")],
               [NAN, NAN], [-2.0, 1.5]]

    def setUp(self):
        super().setUp()
        if not test_util.keras_has_gradient_accumulation():
            self.skipTest("This Keras has no gradient_accumulation_steps.")

    def _inner(self):
        return keras.optimizers.SGD(0.5, momentum=0.9,
                                    gradient_accumulation_steps=2)

    @test_util.EAGER_AND_FUNCTION
    def test_matches_bare_optimizer_without_the_bad_windows(
        self, use_tf_function
    ):
        var = tf.Variable([1.0, -1.0])
        opt = tf_lso.LossScaleOptimizer(self._inner(), initial_scale=8,
                                        dynamic_growth_steps=1)
        step = test_util.maybe_function(
            lambda g: opt.apply_gradients([(g, var)]), use_tf_function
        )
        scales = []
        for window in self.WINDOWS:
            for g in window:
                step(tf.constant([g, g / 2]))
            scales.append(float(opt.loss_scale))
        # Reference: the bare optimizer fed only the finite windows.
        ref_var = tf.Variable([1.0, -1.0])
        ref = self._inner()
        for window in self.WINDOWS:
            if all(np.isfinite(window)):
                for g in window:
                    ref.apply_gradients([(tf.constant([g, g / 2]), ref_var)])
        self.assertAllEqual(var, ref_var)
        for mine, theirs in zip(opt.inner_optimizer.variables, ref.variables):
            if "iteration" not in mine.name:
                self.assertAllEqual(mine, theirs, msg=mine.name)
        # One back-off per bad window, two NaNs in one window included.
        self.assertEqual(scales, [16.0, 8.0, 16.0, 8.0, 4.0, 8.0])
        self.assertEqual(test_util.num(opt.skipped_steps), 3)
        # Every window counts, skipped or not: twice the reference's three.
        self.assertEqual(test_util.num(opt.iterations),
                         2 * test_util.num(ref.iterations))
        self.assertEqual(test_util.num(opt.dynamic_counter), 0)

    @test_util.EAGER_AND_FUNCTION
    def test_accumulation_turned_on_after_wrapping_is_refused(
            self, use_tf_function):
        # Regression: the step failed inside with an unrelated error
        # (tf.convert_to_tensor of None), Keras having built accumulators.
        var = tf.Variable([1.0, -1.0])
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.5))
        opt.gradient_accumulation_steps = 2
        step = test_util.maybe_function(
            lambda: opt.apply_gradients([(tf.constant([1.0, 1.0]), var)]),
            use_tf_function)
        with self.assertRaisesRegex(
                ValueError, r"gradient_accumulation_steps=2 was set on the "
                r"inner optimizer after .*gradient_accumulation_steps=2\)\)"):
            step()
        self.assertAllEqual(var, [1.0, -1.0])
        self.assertFalse(opt.inner_optimizer.built)
        self.assertEqual(test_util.num(opt.iterations), 0)

    @test_util.EAGER_AND_FUNCTION
    def test_accumulators_stay_finite_mid_window(self, use_tf_function):
        def make():
            var = tf.Variable([1.0, -1.0])
            opt = tf_lso.LossScaleOptimizer(
                keras.optimizers.SGD(0.5, momentum=0.9,
                                     gradient_accumulation_steps=3),
                initial_scale=8, dynamic_growth_steps=1)
            step = test_util.maybe_function(
                lambda g: opt.apply_gradients([(g, var)]), use_tf_function)
            return var, opt, step

        def accumulators(opt):
            return [v.numpy().tolist() for v in opt.inner_optimizer.variables
                    if "accumulator" in v.name]

        var, opt, step = make()
        step(tf.constant([1.0, 0.5]))
        step(tf.constant([float("inf"), 1.0]))
        # The window is lost at once: its accumulators are emptied (they
        # never hold the non-finite value), the scale backs off, the skip
        # is counted; no variable or other slot changes.
        self.assertEqual(accumulators(opt), [[0.0, 0.0]])
        self.assertAllEqual(var, [1.0, -1.0])
        self.assertEqual(float(opt.loss_scale), 4.0)
        self.assertEqual(test_util.num(opt.skipped_steps), 1)
        # Saved mid-window, restored into a new optimizer.
        # (skipped_steps as an entry of its own, as docs/keras.md shows.)
        prefix = tf.train.Checkpoint(
            var=var, opt=opt, skipped_steps=opt.skipped_steps).save(
                self.get_temp_dir() + "/ckpt")
        restored_var, restored_opt, restored_step = make()
        restored_opt.build([restored_var])
        tf.train.Checkpoint(
            var=restored_var, opt=restored_opt,
            skipped_steps=restored_opt.skipped_steps).restore(
                prefix).assert_consumed()
        for v, o, s in ((var, opt, step),
                        (restored_var, restored_opt, restored_step)):
            s(tf.constant([2.0, 2.0]))  # Ends the lost window.
            self.assertAllEqual(v, [1.0, -1.0])
            self.assertEqual(float(o.loss_scale), 4.0)  # Backed off once.
            self.assertEqual(test_util.num(o.skipped_steps), 1)
            self.assertEqual(test_util.num(o.iterations), 1)
            self.assertEqual(accumulators(o), [[0.0, 0.0]])
            for g in ([1.0, 1.0], [2.0, 0.0], [0.0, 4.0]):
                s(tf.constant(g))
        # The next window applies as the bare optimizer's first one.
        ref_var = tf.Variable([1.0, -1.0])
        ref = keras.optimizers.SGD(0.5, momentum=0.9,
                                   gradient_accumulation_steps=3)
        ref_step = test_util.maybe_function(  # Traced alike.
            lambda g: ref.apply_gradients([(g, ref_var)]), use_tf_function)
        for g in ([1.0, 1.0], [2.0, 0.0], [0.0, 4.0]):
            ref_step(tf.constant(g))
        self.assertAllEqual(var, ref_var)
        self.assertAllEqual(var, restored_var)
        for a, b in zip(opt.inner_optimizer.variables,
                        restored_opt.inner_optimizer.variables):
            self.assertAllEqual(a, b)

    def test_accumulators_stay_finite_mid_window_in_keras_files(self):
        var = tf.Variable([1.0, -1.0])
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        opt = tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(0.5, gradient_accumulation_steps=3))
        model.compile(opt, "mse")
        del var
        variables = model.trainable_variables
        opt.apply_gradients(zip([tf.ones_like(v) for v in variables],
                                variables))
        opt.apply_gradients(zip(
            [tf.fill(v.shape, float("inf")) for v in variables], variables))
        path = self.get_temp_dir() + "/mid_window.weights.h5"
        model.save_weights(path)
        other = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        other_opt = tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(0.5, gradient_accumulation_steps=3))
        other.compile(other_opt, "mse")
        other_opt.build(other.trainable_variables)
        other.load_weights(path)
        for o in (opt, other_opt):
            accumulators = [v.numpy() for v in o.inner_optimizer.variables
                            if "accumulator" in v.name]
            self.assertTrue(all(np.all(a == 0) for a in accumulators))
        # The window's end is skipped after the restore too.
        before = [v.numpy() for v in other.trainable_variables]
        other_opt.apply_gradients(zip(
            [tf.ones_like(v) for v in other.trainable_variables],
            other.trainable_variables))
        for a, b in zip(before, other.trainable_variables):
            self.assertAllEqual(a, b)
        self.assertEqual(test_util.num(other_opt.skipped_steps), 1)

    def test_fit_skips_the_window_with_an_overflowing_batch(self):
        rng = np.random.default_rng(3)
        x = rng.normal(size=(64, 4)).astype("float32")
        y = rng.normal(size=(64, 1)).astype("float32")
        y_bad = y.copy()
        y_bad[40] = 3e38  # Batch 2 (rows 32-47) ends window 1 (batches 2-3).

        def fit(optimizer, x, y):
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                                      keras.layers.Dense(1)])
            model.compile(optimizer, "mse")
            model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
            return model.get_weights()

        opt = tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(0.05, gradient_accumulation_steps=2),
            initial_scale=1024)
        actual = fit(opt, x, y_bad)
        keep = np.r_[0:32]
        expected = fit(
            keras.optimizers.SGD(0.05, gradient_accumulation_steps=2),
            x[keep], y[keep])
        for a, e in zip(actual, expected):
            np.testing.assert_allclose(a, e, rtol=1e-6)
        self.assertEqual(float(opt.loss_scale), 512.0)
        self.assertEqual(test_util.num(opt.skipped_steps), 1)


class ExponentialMovingAverageTest(tf.test.TestCase, parameterized.TestCase):
    """Keras 3's `use_ema` sees only the steps (windows) that apply.

    Keras starts the averages from the weights at its first step
    (`iterations == 0`). A skipped step still counts in `iterations` (TF
    2.4's rule), but the averages start at the first step that applies, and
    a skipped accumulation window leaves them as they were: exactly the bare
    optimizer fed only the steps that apply.
    """

    def _run(self, inner, grads, use_tf_function, initial_value):
        var = tf.Variable(initial_value)
        opt = tf_lso.LossScaleOptimizer(inner, initial_scale=4)
        step = test_util.maybe_function(
            lambda g: opt.apply_gradients([(g, var)]), use_tf_function)
        for g in grads:
            step(tf.constant(g))
        return opt, var

    def _bare(self, inner, grads, initial_value):
        var = tf.Variable(initial_value)
        for g in grads:
            inner.apply_gradients([(tf.constant(g), var)])
        return inner, var

    def _assert_same_state(self, opt, var, ref, ref_var):
        self.assertAllEqual(var, ref_var)
        mine = opt.inner_optimizer.variables
        self.assertLen(mine, len(ref.variables))
        for a, b in zip(mine, ref.variables):
            if "iteration" not in a.name:
                self.assertAllEqual(a, b, msg=a.name)
        opt.finalize_variable_values([var])
        ref.finalize_variable_values([ref_var])
        self.assertAllEqual(var, ref_var)

    @test_util.EAGER_AND_FUNCTION
    def test_a_skipped_first_step_does_not_start_the_average_from_zeros(
        self, use_tf_function
    ):
        def inner():
            return keras.optimizers.SGD(0.5, use_ema=True, ema_momentum=0.9)

        grads = [[float("inf"), 1.0], [1.0, 1.0], [NAN, 2.0], [2.0, -1.0]]
        opt, var = self._run(inner(), grads, use_tf_function, [1.0, 2.0])
        self.assertEqual(test_util.num(opt.skipped_steps), 2)
        ref, ref_var = self._bare(
            inner(), [g for g in grads if np.all(np.isfinite(g))], [1.0, 2.0])
        self._assert_same_state(opt, var, ref, ref_var)
        # The numbers: after the first step that applies, the average
        # is the weights [0.5, 1.5] (Keras 3's LossScaleOptimizer agrees),
        # not 0.1 * [0.5, 1.5] from zeros.

    @test_util.EAGER_AND_FUNCTION
    def test_a_skipped_window_leaves_the_average_alone(self, use_tf_function):
        if not test_util.keras_has_gradient_accumulation():
            self.skipTest("This Keras has no gradient_accumulation_steps.")

        def inner():
            return keras.optimizers.SGD(0.25, use_ema=True, ema_momentum=0.5,
                                        gradient_accumulation_steps=2)

        grads = [[1.0], [1.0], [1.0], [1.0], [1.0], [float("inf")],
                 [NAN], [1.0], [2.0], [3.0]]
        opt, var = self._run(inner(), grads, use_tf_function, [1.0])
        self.assertEqual(test_util.num(opt.skipped_steps), 2)
        ref, ref_var = self._bare(
            inner(), grads[:4] + grads[8:], [1.0])
        self._assert_same_state(opt, var, ref, ref_var)

    @test_util.EAGER_AND_FUNCTION
    def test_first_window_skipped(self, use_tf_function):
        if not test_util.keras_has_gradient_accumulation():
            self.skipTest("This Keras has no gradient_accumulation_steps.")

        def inner():
            return keras.optimizers.SGD(0.1, momentum=0.5, use_ema=True,
                                        ema_momentum=0.8,
                                        gradient_accumulation_steps=3)

        grads = [[1.0, 2.0], [NAN, 0.0], [1.0, 1.0],
                 [0.5, -1.0], [2.0, 0.25], [-3.0, 1.0],
                 [1.0, 1.0], [4.0, 1.0], [0.0, -2.0]]
        opt, var = self._run(inner(), grads, use_tf_function, [1.0, -1.0])
        self.assertEqual(test_util.num(opt.skipped_steps), 1)
        ref, ref_var = self._bare(inner(), grads[3:], [1.0, -1.0])
        self._assert_same_state(opt, var, ref, ref_var)

    def test_fit_with_an_overflowing_first_batch(self):
        rng = np.random.default_rng(5)
        x = rng.normal(size=(64, 4)).astype("float32")
        y = rng.normal(size=(64, 1)).astype("float32")
        y_bad = y.copy()
        y_bad[3] = 3e38  # The first batch (rows 0-15) overflows.

        def fit(optimizer, x, y):
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                                      keras.layers.Dense(1)])
            model.compile(optimizer, "mse")
            model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
            return model.get_weights()

        def inner():
            return keras.optimizers.SGD(0.05, use_ema=True, ema_momentum=0.9)

        opt = tf_lso.LossScaleOptimizer(inner(), initial_scale=1024)
        actual = fit(opt, np.concatenate([x, x[16:]]),
                     np.concatenate([y_bad, y[16:]]))
        self.assertEqual(test_util.num(opt.skipped_steps), 1)
        # fit copies the averages into the model at its end.
        expected = fit(inner(), np.concatenate([x[16:], x[16:]]),
                       np.concatenate([y[16:], y[16:]]))
        for a, e in zip(actual, expected):
            np.testing.assert_array_equal(a, e)


class MirroredMovingAverageTest(tf.test.TestCase, parameterized.TestCase):
    """Under MirroredStrategy every replica keeps the averages of one device.

    tf_lso updates Keras 3's `use_ema` averages itself (see
    ExponentialMovingAverageTest), on each replica's copy. Each run is
    compared, replica by replica and bit for bit, with the same optimizer on
    one device fed the replicas' summed gradients (a step with a non-finite
    gradient on either replica is skipped on both).
    """

    # Replica 0's and replica 1's gradient, step by step: steps 1 and 4
    # overflow on one replica only.
    GRADS = [([0.2, 0.2], [0.1, 0.0]), ([float("inf"), 0.1], [0.1, 0.1]),
             ([0.1, -0.1], [0.3, 0.2]), ([0.0, 0.5], [0.1, -0.2]),
             ([0.1, 0.1], [0.1, NAN]), ([0.4, 0.1], [0.2, 0.3]),
             ([0.1, 0.1], [0.1, 0.1])]

    def _mirrored(self, make_inner, use_tf_function):
        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            var = tf.Variable([0.0, 1.0])
            opt = tf_lso.LossScaleOptimizer(make_inner(), initial_scale=4)

        def step(g0, g1):
            grad = test_util.value_on_replica_0(g0, g1)
            opt.apply_gradients([(grad, var)])

        run = test_util.maybe_function(
            lambda g0, g1: strategy.run(step, args=(g0, g1)),
            use_tf_function)
        for g0, g1 in self.GRADS:
            run(tf.constant(g0), tf.constant(g1))
        return strategy, opt, var

    def _one_device(self, make_inner):
        var = tf.Variable([0.0, 1.0])
        opt = tf_lso.LossScaleOptimizer(make_inner(), initial_scale=4)
        for g0, g1 in self.GRADS:
            summed = np.float32(g0) + np.float32(g1)
            opt.apply_gradients([(tf.constant(summed), var)])
        return opt, var

    def _state(self, opt):
        """Every variable tf_lso keeps: the optimizer's (the inner one's,
        the loss scale's), `skipped_steps`, the overflow and report records
        and, with accumulation, `window_overflowed`."""
        children = compat.trackable_children(opt, "checkpoint")
        window = [children["window_overflowed"]] if (
            "window_overflowed" in children) else []
        return (list(opt.variables) + [opt.skipped_steps] + window
                + list(lso_lib.overflow_record(opt).variables)
                + list(lso_lib.gradient_reports(opt).variables))

    def _assert_every_replica_matches(self, strategy, opt, var, ref, ref_var):
        mine = [var] + self._state(opt)
        theirs = [ref_var] + self._state(ref)
        self.assertLen(mine, len(theirs))
        names = [v.name for v in theirs]
        self.assertTrue(any("average" in name for name in names), names)
        self.assertIn("overflow_count:0", names)
        for a, b in zip(mine, theirs):
            for local in test_util.local_values(strategy, a):
                self.assertAllEqual(local, b, msg=a.name)
        # What reads the averages on every replica: the final swap.
        with strategy.scope():
            opt.finalize_variable_values([var])
        ref.finalize_variable_values([ref_var])
        for local in test_util.local_values(strategy, var):
            self.assertAllEqual(local, ref_var)

    @parameterized.named_parameters(
        ("eager", False, None), ("tf_function", True, None),
        ("eager_overwrite", False, 2), ("tf_function_overwrite", True, 2))
    def test_every_replica_keeps_the_averages(self, use_tf_function,
                                              overwrite_frequency):
        def inner():
            return keras.optimizers.SGD(
                0.5, use_ema=True, ema_momentum=0.9,
                ema_overwrite_frequency=overwrite_frequency)

        strategy, opt, var = self._mirrored(inner, use_tf_function)
        self.assertEqual(test_util.num(opt.skipped_steps), 2)
        ref, ref_var = self._one_device(inner)
        self._assert_every_replica_matches(strategy, opt, var, ref, ref_var)

    def test_every_replica_keeps_the_accumulation_window(self):
        # Eagerly: in a tf.function Keras 3's own accumulation cannot run
        # under MirroredStrategy (see the next test).
        if not test_util.keras_has_gradient_accumulation():
            self.skipTest("This Keras has no gradient_accumulation_steps.")

        def inner():
            return keras.optimizers.SGD(0.5, use_ema=True, ema_momentum=0.9,
                                        gradient_accumulation_steps=2)

        strategy, opt, var = self._mirrored(inner, use_tf_function=False)
        # Windows (0, 1) and (4, 5) are dropped; step 6 opens a window.
        self.assertEqual(test_util.num(opt.skipped_steps), 2)
        ref, ref_var = self._one_device(inner)
        self._assert_every_replica_matches(strategy, opt, var, ref, ref_var)

    def test_accumulation_in_a_tf_function_is_refused_at_the_first_step(self):
        if not test_util.keras_has_gradient_accumulation():
            self.skipTest("This Keras has no gradient_accumulation_steps.")

        def inner():
            return keras.optimizers.SGD(0.5, gradient_accumulation_steps=2)

        with self.assertRaisesRegex(
            RuntimeError,
            r"gradient_accumulation_steps=2.*tf\.function under "
            r"MirroredStrategy.*eagerly"):
            self._mirrored(inner, use_tf_function=True)

    def test_fit(self):
        # fit's step is a tf.function. The oracle: Keras 3's averaging
        # formula on one device, over the weights after each batch.
        rng = np.random.default_rng(3)
        x = rng.normal(size=(48, 4)).astype("float32")
        y = rng.normal(size=(48, 1)).astype("float32")
        y[2] = 3e38  # The first batch (rows 0-7) overflows.
        strategy = test_util.mirrored_strategy()
        momentum = 0.8
        with strategy.scope():
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2),
                                      keras.layers.Dense(1)])
            opt = tf_lso.LossScaleOptimizer(
                keras.optimizers.SGD(0.01, use_ema=True,
                                     ema_momentum=momentum),
                initial_scale=2.0**15)
            model.compile(opt, "mse")
        weights = []
        record = keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: weights.append(
                [v.numpy() for v in model.trainable_variables]))
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
                  callbacks=[record])
        self.assertEqual(test_util.num(opt.skipped_steps), 1)
        m = np.float32(momentum)
        expected = weights[1]  # The first step that applied.
        for step_weights in weights[2:]:
            expected = [m * a + (np.float32(1) - m) * w
                        for a, w in zip(expected, step_weights)]
        averages = [v for v in opt.inner_optimizer.variables
                    if "average" in v.name]
        self.assertLen(averages, len(expected))
        for average, e in zip(averages, expected):
            for local in test_util.local_values(strategy, average):
                self.assertAllEqual(local, e, msg=average.name)
        # fit ends by copying the averages into the model, on every replica.
        for variable, e in zip(model.trainable_variables, expected):
            for local in test_util.local_values(strategy, variable):
                self.assertAllEqual(local, e, msg=variable.name)


class DifferentialTest(tf.test.TestCase, parameterized.TestCase):
    """Random runs against a NumPy model of TF 2.4's LossScaleOptimizer.

    Seeded, so every run checks the same cases. Scales start anywhere from
    1 to the float32 maximum; gradients overflow now and then.
    """

    @parameterized.product(seed=[0, 1, 2, 3], use_tf_function=[False, True])
    def test_matches_reference(self, seed, use_tf_function):
        rng = np.random.default_rng(seed)
        exponent = rng.uniform(0, 30) if seed % 2 else rng.uniform(120, 128)
        initial = float(np.float32(2.0 ** exponent))
        growth = int(rng.integers(1, 4))
        var = tf.Variable(rng.normal(size=(3,)).astype(np.float32))
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                        initial_scale=initial,
                                        dynamic_growth_steps=growth)

        def step(scaled_grad):
            grads = opt.get_unscaled_gradients([scaled_grad])
            opt.apply_gradients(zip(grads, [var]))

        step = test_util.maybe_function(step, use_tf_function)
        ref_var = var.numpy().copy()
        scale, count = np.float32(initial), 0
        for _ in range(12):
            unscaled = rng.normal(size=(3,)).astype(np.float32)
            if rng.random() < 0.2:
                unscaled[rng.integers(3)] = rng.choice([np.inf, np.nan])
            with np.errstate(over="ignore", invalid="ignore"):
                scaled = (unscaled.astype(np.float64) * scale).astype(
                    np.float32)
                if scale <= 2.0**126:
                    expected = scaled * (np.float32(1) / scale)
                else:
                    expected = (scaled.astype(np.float64) / scale).astype(
                        np.float32)
            step(tf.constant(scaled))
            if np.all(np.isfinite(expected)):
                ref_var = ref_var - expected
                count += 1
                if count >= growth:
                    count = 0
                    with np.errstate(over="ignore"):
                        grown = scale * np.float32(2)
                    scale = grown if np.isfinite(grown) else scale
            else:
                scale, count = max(scale / np.float32(2), np.float32(1)), 0
            self.assertAllEqual(var, ref_var)
            self.assertEqual(float(opt.loss_scale), float(scale))
            self.assertEqual(test_util.num(opt.dynamic_counter), count)

    @parameterized.product(
        optimizer=["adagrad", "ftrl", "rmsprop", "adam"],
        mode=["eager", "function"],
    )
    def test_matches_bare_keras_optimizer(self, optimizer, mode):
        # A step is the bare optimizer's step, bit for bit: a kept step its
        # apply_gradients, a skipped one only `iterations += 1`. In a
        # tf.function the skip cond is lowered, as TF 2.4's and Keras 3's
        # were: Grappler rewrote an update whose cond stayed one If op (a
        # separate function) differently from the bare one, a few ulps
        # apart for updates with square roots and powers.
        make = {
            "adagrad": lambda: keras.optimizers.Adagrad(0.1),
            "ftrl": lambda: keras.optimizers.Ftrl(
                0.1, l1_regularization_strength=0.01),
            "rmsprop": lambda: keras.optimizers.RMSprop(
                0.01, momentum=0.5, centered=True),
            "adam": lambda: keras.optimizers.Adam(0.01, amsgrad=True),
        }[optimizer]
        rng = np.random.default_rng(7)
        start = [rng.normal(size=s).astype(np.float32)
                 for s in [(3,), (2, 2), (4, 2)]]
        opt = tf_lso.LossScaleOptimizer(make(), initial_scale=256.0,
                                        dynamic_growth_steps=2)
        bare = make()
        var_list = [tf.Variable(x) for x in start]
        bare_vars = [tf.Variable(x) for x in start]
        bare.build(bare_vars)

        def step(scaled_grads):
            grads = opt.get_unscaled_gradients(scaled_grads)
            opt.apply_gradients(zip(grads, var_list))

        def bare_step(grads, finite):  # `finite` is a Python bool.
            if finite:
                bare.apply_gradients(zip(grads, bare_vars))
            else:
                bare.iterations.assign_add(1)

        if mode == "function":
            step, bare_step = tf.function(step), tf.function(bare_step)
        for i in range(10):
            grads = [rng.normal(size=x.shape).astype(np.float32)
                     for x in start]
            if i in (3, 6):
                grads[i % 3].flat[0] = np.nan
            scale = np.float32(opt.loss_scale)  # A power of two: exact.
            step([tf.constant(g * scale) for g in grads])
            finite = all(np.isfinite(g).all() for g in grads)
            bare_step([tf.constant(g) for g in grads], bool(finite))
            actual = var_list + opt.variables
            expected = bare_vars + bare.variables
            self.assertLen(actual, len(expected))
            for a, e in zip(actual, expected):
                self.assertAllEqual(a, e)
        self.assertEqual(test_util.num(opt.skipped_steps), 2)
        self.assertEqual(float(opt.loss_scale), 512.0)

    @parameterized.product(seed=[0, 1, 2, 3, 4, 5], use_tf_function=[False, True])
    def test_matches_tf_keras(self, seed, use_tf_function):
        # tf_keras's LossScaleOptimizer is TF 2.4's code, kept for Keras 2.
        # Both wrap the same kind of OptimizerV2; weights, slots, scale,
        # counter and iterations must be bit-equal after every step. Scales
        # stay below 2**126, where tf_lso deliberately divides instead.
        tf_keras = test_util.tf_keras
        rng = np.random.default_rng(seed)
        legacy = tf_keras.optimizers.legacy
        make_inner = [
            lambda: legacy.Adam(0.01, clipnorm=0.5),
            lambda: legacy.SGD(0.1, momentum=0.9, clipvalue=0.3),
            lambda: legacy.RMSprop(0.01, global_clipnorm=1.0),
        ][seed % 3]
        settings = {"initial_scale": float(np.float32(2.0 ** rng.uniform(0, 20))),
                    "dynamic_growth_steps": int(rng.integers(1, 4))}
        if seed == 5:
            settings = {"dynamic": False, "initial_scale": 3.0}
        start = [rng.normal(size=s).astype(np.float32) for s in [(3,), (2, 2)]]
        runs = []
        for make in (tf_keras.mixed_precision.LossScaleOptimizer,
                     tf_lso.LossScaleOptimizer):
            var_list = [tf.Variable(x) for x in start]
            opt = make(make_inner(), **settings)

            def step(scaled_grads, opt=opt, var_list=var_list):
                grads = opt.get_unscaled_gradients(scaled_grads)
                opt.apply_gradients(zip(grads, var_list))

            runs.append((opt, var_list,
                         test_util.maybe_function(step, use_tf_function)))
        (ref, ref_vars, ref_step), (opt, var_list, opt_step) = runs
        for _ in range(15):
            scale = np.float64(ref.loss_scale)
            grads = [rng.normal(size=x.shape) for x in start]
            if rng.random() < 0.2:
                grads[0].flat[0] = rng.choice([np.inf, -np.inf, np.nan])
            with np.errstate(invalid="ignore"):
                scaled = [tf.constant((g * scale).astype(np.float32))
                          for g in grads]
            ref_step(scaled)
            opt_step(scaled)
            test_util.assert_same_state_as_tf_keras(
                self, opt, var_list, ref, ref_vars, use_tf_function)
            self.assertEqual(float(opt.loss_scale), float(ref.loss_scale))
            if "dynamic" not in settings:
                self.assertEqual(int(opt.dynamic_counter),
                                 int(ref.dynamic_counter))
            self.assertEqual(int(opt.iterations), int(ref.iterations))


    @parameterized.named_parameters(
        (f"{kind}_{mode}", kind, mode == "tf_function")
        for kind in inner_kinds.names("tf_keras_legacy", "tf_keras")
        for mode in ("eager", "tf_function")
    )
    def test_never_applies_what_the_aggregation_made_non_finite(
        self, kind, use_tf_function
    ):
        # A finite gradient that the inner optimizer's own aggregation turns
        # into an inf (here: summed in float16) is skipped, bit-equal to
        # tf_keras's class, which checks after the aggregation.
        tf_keras = test_util.tf_keras

        def to_float16_times_4(grads_and_vars):
            return [(tf.cast(tf.cast(g, tf.float16) * 4.0, g.dtype), v)
                    for g, v in grads_and_vars]

        if kind == "tf_keras_legacy":
            def make_inner():
                return tf_keras.optimizers.legacy.SGD(
                    1.0, gradient_aggregator=to_float16_times_4)
        else:
            class Float16SumSGD(tf_keras.optimizers.SGD):
                def aggregate_gradients(self, grads_and_vars):
                    return to_float16_times_4(grads_and_vars)

            def make_inner():
                return Float16SumSGD(1.0)

        runs = []
        for make in (tf_keras.mixed_precision.LossScaleOptimizer,
                     tf_lso.LossScaleOptimizer):
            var = tf.Variable(1.0)
            opt = make(make_inner(), initial_scale=4.0,
                       dynamic_growth_steps=1)

            def step(grad, opt=opt, var=var):
                opt.apply_gradients([(grad, var)])

            step = test_util.maybe_function(step, use_tf_function)
            for grad in (30000.0, 1.0):  # Aggregated: inf, then 4.
                step(tf.constant(grad))
            runs.append((float(var.numpy()), float(opt.loss_scale),
                         int(opt.iterations)))
        self.assertEqual(runs[1], runs[0])
        self.assertEqual(runs[1], (-3.0, 4.0, 2))


def _v1_classes():
    """Both classes around a fresh tf_keras legacy SGD (OptimizerV2)."""
    sgd = test_util.tf_keras.optimizers.legacy.SGD
    return {
        "tf24": lambda lr, **kw: tf_lso.LossScaleOptimizer(sgd(lr), **kw),
        "experimental": lambda lr, initial_scale, dynamic_growth_steps: (
            tf_lso.experimental.LossScaleOptimizer(
                sgd(lr),
                tf_lso.experimental.DynamicLossScale(initial_scale,
                                                     dynamic_growth_steps),
            )
        ),
    }


class GraphModeTest(tf.test.TestCase, parameterized.TestCase):
    """tf.compat.v1 graphs and sessions, where TF 2.4 ran each test too.

    There `apply_gradients` and `minimize` must return an op that runs the
    whole step (TF 2.4's did); nothing runs unless the session fetches it.
    TF 2.4 wrapped OptimizerV2, i.e. tf_keras legacy optimizers.
    """

    @parameterized.product(
        strategy_name=("default", "mirrored"), cls=("tf24", "experimental")
    )
    def test_dynamic_update(self, strategy_name, cls):
        with tf.Graph().as_default():
            strategy = test_util.STRATEGIES[strategy_name]()
            replicas = strategy.num_replicas_in_sync
            with strategy.scope():
                var = tf.Variable([1.0, 2.0])
                opt = _v1_classes()[cls](
                    1.0, initial_scale=2, dynamic_growth_steps=1
                )
            bad = tf.compat.v1.placeholder(tf.bool, [])

            def step():
                # `bad` makes only replica 0's gradient NaN.
                grad = tf.where(
                    bad, test_util.value_on_replica_0(NAN, 1.0), 1.0
                ) / replicas
                return opt.apply_gradients([(tf.fill([2], grad), var)])

            train_op = strategy.experimental_local_results(strategy.run(step))
            state = [var, tf.convert_to_tensor(opt.loss_scale),
                     opt.iterations, opt.skipped_steps]
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                trajectory = []
                for is_bad in (False, True, False):
                    session.run(train_op, {bad: is_bad})
                    value, scale, iterations, skipped = session.run(state)
                    trajectory.append(
                        (value.tolist(), scale, iterations, skipped))
        self.assertEqual(trajectory, [
            ([0.0, 1.0], 4.0, 1, 0),
            ([0.0, 1.0], 2.0, 2, 1),
            ([-1.0, 0.0], 4.0, 3, 1),
        ])

    def test_minimize_scales_the_loss(self):
        # TF 2.4's testFixedLossScaleAppliedToLossWithMinimize.
        with tf.Graph().as_default():
            var = tf.Variable(5.0)
            opt = _v1_classes()["tf24"](2.0, dynamic=False, initial_scale=10)
            check = test_util.create_identity_with_grad_check_fn(10.0)
            train_op = opt.minimize(lambda: check(var), [var])
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                session.run(train_op)
                self.assertEqual(session.run(var), 3.0)
                self.assertEqual(session.run(opt.iterations), 1)

    def test_get_gradients_then_apply(self):
        # TF 2.4's testFixedLossScaleAppliedToLossWithGetGradients.
        with tf.Graph().as_default():
            var = tf.Variable(5.0)
            opt = _v1_classes()["tf24"](2.0, dynamic=False, initial_scale=10)
            check = test_util.create_identity_with_grad_check_fn(10.0)
            grads = opt.get_gradients(check(var) * 1.0, [var])
            train_op = opt.apply_gradients(zip(grads, [var]))
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                session.run(train_op)
                self.assertEqual(session.run(var), 3.0)

    def test_slots_stay_on_skipped_steps(self):
        # TF 2.4's testDynamicLossScaleWithSlots, with a NaN step between.
        with tf.Graph().as_default():
            var = tf.Variable([1.0, 2.0])
            opt = tf_lso.LossScaleOptimizer(
                test_util.tf_keras.optimizers.legacy.SGD(1.0, momentum=1.0),
                initial_scale=2, dynamic_growth_steps=1,
            )
            grad = tf.compat.v1.placeholder(tf.float32, [])
            train_op = opt.apply_gradients([(tf.fill([2], grad), var)])
            momentum = opt.get_slot(var, "momentum")
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                trajectory = []
                for value in (1.0, NAN, 1.0):
                    session.run(train_op, {grad: value})
                    trajectory.append(
                        (session.run(var).tolist(),
                         session.run(momentum).tolist(),
                         session.run(opt.loss_scale)))
        self.assertEqual(trajectory, [
            ([0.0, 1.0], [-1.0, -1.0], 4.0),
            ([0.0, 1.0], [-1.0, -1.0], 2.0),
            ([-2.0, -1.0], [-2.0, -2.0], 4.0),
        ])

    def test_max_consecutive_skips_fails_the_session_run(self):
        with tf.Graph().as_default():
            var = tf.Variable(1.0)
            opt = tf_lso.LossScaleOptimizer(
                test_util.tf_keras.optimizers.legacy.SGD(1.0),
                initial_scale=8, max_consecutive_skips=2,
            )
            train_op = opt.apply_gradients([(tf.constant(NAN), var)])
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                session.run(train_op)
                session.run(train_op)
                with self.assertRaisesRegex(
                    tf.errors.InvalidArgumentError,
                    "3 steps in a row .* max_consecutive_skips=2",
                ):
                    session.run(train_op)
                self.assertEqual(session.run(var), 1.0)

    @parameterized.named_parameters(
        (kind.name, kind.name) for kind in inner_kinds.KINDS
        if not kind.kind.runs_in_v1_graph)
    def test_other_inner_optimizers_are_a_runtime_error(self, kind):
        with tf.Graph().as_default():
            var = tf.Variable(1.0)
            opt = tf_lso.LossScaleOptimizer(inner_kinds.sgd(kind, 1.0))
            with self.assertRaisesRegex(
                RuntimeError,
                r"In a tf.compat.v1 graph .* must be a tf_keras legacy "
                r"optimizer .* Received: inner_optimizer=",
            ):
                opt.apply_gradients([(tf.constant(1.0), var)])

    def test_weight_methods(self):
        # TF 2.4's testWeightMethods, in its graph-mode run.
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            var = tf.Variable([1.0])
            opt = _v1_classes()["tf24"](
                1.0, initial_scale=2.0, dynamic_growth_steps=1
            )
            train_op = opt.minimize(lambda: var * 2, [var])
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train_op)
            self.assertLen(opt.weights, 1)  # iterations
            self.assertEqual(session.run(opt.weights[0]), 1)
            self.assertEqual(opt.get_weights()[0], 1)
            self.assertEqual(session.run(opt.variables()[0]), 1)
            opt.set_weights([np.array(2)])
            self.assertEqual(session.run(opt.variables()[0]), 2)

    def test_checkpoint_save_and_restore(self):
        # TF 2.4's testCheckpoint (SaveAndRestoreBase), in its graph run.
        prefix = self.create_tempdir().full_path + "/ckpt"
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            var = tf.Variable([2.0])
            opt = tf_lso.LossScaleOptimizer(
                test_util.tf_keras.optimizers.legacy.SGD(1.0, momentum=1.0),
                initial_scale=1.0, dynamic_growth_steps=2,
            )
            train_op = opt.minimize(lambda: var / 2.0, [var])
            checkpoint = tf.compat.v1.train.Checkpoint(optimizer=opt, var=var)
            state = [var, opt.get_slot(var, "momentum"), opt.loss_scale,
                     opt.dynamic_counter, opt.iterations]
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train_op)
            saved = session.run(state)
            path = checkpoint.save(prefix, session=session)
            session.run(train_op)
            self.assertEqual(session.run(opt.loss_scale), 2.0)
            checkpoint.restore(path).assert_consumed().run_restore_ops(session)
            restored = session.run(state)
        self.assertEqual([v.tolist() for v in saved],
                         [[1.5], [-0.5], 1.0, 1, 1])
        self.assertEqual([v.tolist() for v in restored],
                         [v.tolist() for v in saved])


if __name__ == "__main__":
    tf.test.main()
