"""A skipped step's cause: a non-finite loss (a bug) or an overflow (issue 43).

The optimizer sees the loss before scaling it (`get_scaled_loss`,
`scale_loss`, `minimize`, `fit`); a skipped step's record says whether that
loss itself was not finite, and `stop_on_nonfinite_loss` stops there.
"""

import threading

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

import tf_lso
from tf_lso._src.optimizer import loss_scale_optimizer

import inner_kinds
import test_util

tf_keras = test_util.tf_keras

INF, NAN = float("inf"), float("nan")
MODES = parameterized.named_parameters(
    ("eager", {}), ("tf_function", {"tf_function": True}),
    ("jit", {"tf_function": True, "jit_compile": True}),
)


def _maybe_function(fn, mode):
    if mode:
        return tf.function(fn, jit_compile=mode.get("jit_compile"))
    return fn


def _variables():
    return [tf.Variable([1.0, 2.0], name="a"), tf.Variable(3.0, name="b")]


def _loss(variables, x):
    """A finite loss for x = 1; NaN for x = NaN (a's gradient too, b's is
    finite); for x = 1e38 a finite loss whose scaled gradient for `a`
    overflows at any scale >= 4."""
    a, b = variables
    return tf.reduce_sum(a) * x + b


def _mirrored_step(strategy, opt, variables, bad_replica, use_tf_function):
    """The TF 2.x protocol under `strategy`: replica `bad_replica` computes
    its loss from the step's `x`, every other replica from 1 (finite)."""

    def replica_step(x):
        x = tf.where(tf.equal(test_util.replica_id(), bad_replica), x,
                     tf.constant(1.0))
        with tf.GradientTape() as tape:
            scaled = opt.get_scaled_loss(_loss(variables, x))
        grads = opt.get_unscaled_gradients(tape.gradient(scaled, variables))
        opt.apply_gradients(zip(grads, variables))

    return test_util.maybe_function(
        lambda x: strategy.run(replica_step, args=(x,)), use_tf_function)


def _tf2_step(opt, variables, mode):
    """The TF 2.x protocol: get_scaled_loss, get_unscaled_gradients."""

    def step(x):
        with tf.GradientTape() as tape:
            scaled = opt.get_scaled_loss(_loss(variables, x))
        grads = opt.get_unscaled_gradients(tape.gradient(scaled, variables))
        opt.apply_gradients(zip(grads, variables))

    return _maybe_function(step, mode)


def _keras3_step(opt, variables, mode):
    """Keras 3's protocol, as `fit` uses it: scale_loss, scaled gradients."""

    def step(x):
        with tf.GradientTape() as tape:
            scaled = opt.scale_loss(_loss(variables, x))
        opt.apply_gradients(zip(tape.gradient(scaled, variables), variables))

    return _maybe_function(step, mode)


def _minimize_step(opt, variables, mode):
    def step(x):
        opt.minimize(lambda: _loss(variables, x), variables)

    return _maybe_function(step, mode)


PROTOCOLS = {"tf2": _tf2_step, "keras3": _keras3_step,
             "minimize": _minimize_step}


class CauseTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.product(
        mode=[{}, {"tf_function": True},
              {"tf_function": True, "jit_compile": True}],
        protocol=sorted(PROTOCOLS))
    def test_nonfinite_loss_and_overflow_are_told_apart(self, mode, protocol):
        variables = _variables()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                        initial_scale=8)
        step = PROTOCOLS[protocol](opt, variables, mode)
        step(tf.constant(NAN))
        self.assertEqual(opt.last_overflow,
                         tf_lso.Overflow(0, 1, ("a:0",), 1, "loss"))
        step(tf.constant(1e38))  # A finite loss; a's gradient overflows.
        self.assertEqual(opt.last_overflow,
                         tf_lso.Overflow(1, 1, ("a:0",), 2, "gradients"))
        step(tf.constant(1.0))
        step(tf.constant(-INF))  # log(0)-like: an infinite loss.
        self.assertEqual(opt.last_overflow.cause, "loss")
        self.assertEqual(opt.last_overflow.step, 3)
        self.assertEqual(test_util.num(opt.nonfinite_loss_steps), 2)
        self.assertEqual(test_util.num(opt.skipped_steps), 3)

    @parameterized.named_parameters(
        ("v2", lambda inner: tf_lso.LossScaleOptimizer(inner)),
        ("v1", lambda inner: tf_lso.experimental.LossScaleOptimizer(
            inner, "dynamic")))
    def test_experimental_optimizer_too(self, make):
        variables = _variables()
        opt = make(keras.optimizers.SGD(0.1))
        _tf2_step(opt, variables, {"tf_function": True})(tf.constant(NAN))
        self.assertEqual(opt.last_overflow.cause, "loss")

    def test_unknown_when_only_apply_gradients_is_called(self):
        variables = _variables()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        opt.apply_gradients(zip([tf.constant([NAN, 1.0]), tf.constant(1.0)],
                                variables))
        self.assertIsNone(opt.last_overflow.cause)
        # A loss seen once is not reused by a later apply.
        with tf.GradientTape() as tape:
            scaled = opt.get_scaled_loss(_loss(variables, tf.constant(NAN)))
        grads = opt.get_unscaled_gradients(tape.gradient(scaled, variables))
        opt.apply_gradients(zip(grads, variables))
        self.assertEqual(opt.last_overflow.cause, "loss")
        opt.apply_gradients(zip(grads, variables))
        self.assertIsNone(opt.last_overflow.cause)

    @parameterized.named_parameters(
        (name, name) for name in inner_kinds.TF_KERAS_NAMES)
    def test_tf_keras_inner_optimizers(self, kind):
        for use_tf_function in (False, True):
            variables = _variables()
            opt = tf_lso.LossScaleOptimizer(inner_kinds.sgd(kind, 0.1),
                                            initial_scale=8)
            step = _tf2_step(opt, variables,
                             {"tf_function": True} if use_tf_function else {})
            step(tf.constant(NAN))
            self.assertEqual(opt.last_overflow.cause, "loss")
            step(tf.constant(1e38))
            self.assertEqual(opt.last_overflow.cause, "gradients")

    @parameterized.product(bad_replica=[0, 1], use_tf_function=[False, True])
    def test_mirrored_nan_loss_on_one_replica(self, bad_replica,
                                              use_tf_function):
        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            variables = _variables()
            opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                            initial_scale=8)

        step = _mirrored_step(strategy, opt, variables, bad_replica,
                              use_tf_function)
        step(tf.constant(NAN))
        self.assertEqual(opt.last_overflow,
                         tf_lso.Overflow(0, 1, ("a:0",), 1, "loss"))
        step(tf.constant(1e38))
        self.assertEqual(opt.last_overflow,
                         tf_lso.Overflow(1, 1, ("a:0",), 2, "gradients"))


def _model():
    """A float16 hidden layer, whose scaled gradients can overflow while
    the loss (float32) is finite."""
    keras.utils.set_random_seed(4)
    return keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(2, name="hidden", dtype="mixed_float16"),
        keras.layers.Dense(1, name="out"),
    ])


def _skip_overflow_under_xla_on_tf_2_16(test):
    # Measured on TensorFlow 2.16.2 only: there XLA compiles the float16
    # layer's backward pass so that the batch `_data` makes overflow does
    # not (the skipped steps differ from 2.21's), so the scenario these
    # tests build does not arise; not a tf_lso difference.
    if tf.__version__.startswith("2.16."):
        test.skipTest("TF 2.16's XLA does not overflow on this batch.")


def _data(nan_batches=(), overflow_batches=(), batches=6, batch_size=4):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(batches * batch_size, 3)).astype("float32")
    y = rng.normal(size=(batches * batch_size, 1)).astype("float32")
    for batch in nan_batches:
        y[batch * batch_size] = np.nan
    for batch in overflow_batches:
        # A finite loss (MSE ~ 2.5e7) whose scaled gradients overflow in
        # the float16 layer (at a scale of 256: ~1e6).
        y[batch * batch_size] = 1e4
    return x, y


class FitTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(
        ("one_device", False, False), ("jit", False, True),
        # (No mirrored jit: XLA cannot compile a step whose variables are
        # on two CPU devices, with a bare optimizer too.)
        ("mirrored", True, False))
    def test_fit_tells_a_nan_loss_from_an_overflow(self, mirrored, jit):
        if jit:
            _skip_overflow_under_xla_on_tf_2_16(self)
        scope = (test_util.mirrored_strategy().scope() if mirrored
                 else tf.distribute.get_strategy().scope())
        with scope:
            model = _model()
            opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1e-3),
                                            initial_scale=256)
            model.compile(opt, "mse", jit_compile=jit)
        x, y = _data(nan_batches=[1], overflow_batches=[4])
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
        self.assertEqual(opt.last_overflow.step, 4)
        self.assertEqual(opt.last_overflow.cause, "gradients")
        self.assertEqual(test_util.num(opt.nonfinite_loss_steps), 1)
        self.assertEqual(test_util.num(opt.skipped_steps), 2)

    def test_monitor_logs_nonfinite_losses(self):
        model = _model()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1e-3),
                                        initial_scale=256)
        model.compile(opt, "mse")
        x, y = _data(nan_batches=[1, 2], overflow_batches=[4])
        history = model.fit(
            x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
            callbacks=[tf_lso.callbacks.LossScaleMonitor()])
        self.assertEqual(history.history["nonfinite_loss_steps"], [2, 4])
        self.assertEqual(history.history["skipped_steps"], [3, 6])

    def test_floor_warning_blames_the_loss(self):
        model = _model()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1e-3),
                                        initial_scale=1)
        model.compile(opt, "mse")
        x, y = _data(nan_batches=[1])
        with pytest.warns(UserWarning, match="floor of 1") as caught:
            model.fit(x, y, batch_size=4, epochs=1, shuffle=False,
                      verbose=0,
                      callbacks=[tf_lso.callbacks.LossScaleMonitor()])
        message = str(caught[0].message)
        self.assertIn("the loss itself is not finite, so lowering the loss "
                      "scale cannot help; look at the inputs", message)
        self.assertNotIn("Usual remedies", message)


class StuckRunTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(("eager", False), ("tf_function", True))
    def test_stuck_message_blames_the_loss(self, use_tf_function):
        variables = _variables()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                        max_consecutive_skips=2)
        step = _tf2_step(opt, variables,
                         {"tf_function": True} if use_tf_function else {})
        step(tf.constant(1e38))  # An overflow, then a NaN loss twice.
        step(tf.constant(NAN))
        error = (tf.errors.InvalidArgumentError if use_tf_function
                 else RuntimeError)
        with self.assertRaises(error) as raised:
            step(tf.constant(NAN))
        expected = (
            "3 steps in a row were skipped (more than max_consecutive_skips"
            "=2) and the loss itself has been non-finite for 2 step(s): "
            "lowering the loss scale cannot help; look at the inputs and the "
            "model (bad data, a division by zero, a log of 0). At step 2, 1 "
            "gradient(s) were not finite, for: a:0.")
        self.assertIn(expected, str(raised.exception))
        self.assertNotIn("Usual remedies", str(raised.exception))

    def test_stuck_by_overflow_keeps_the_remedies(self):
        variables = _variables()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                        max_consecutive_skips=1)
        step = _tf2_step(opt, variables, {})
        step(tf.constant(NAN))
        with self.assertRaisesRegex(RuntimeError, "Usual remedies"):
            step(tf.constant(1e38))

    def test_monitor_stop_blames_the_loss(self):
        model = _model()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1e-3),
                                            initial_scale=256)
        model.compile(opt, "mse", jit_compile=True)
        monitor = tf_lso.callbacks.LossScaleMonitor(max_consecutive_skips=1)
        x, y = _data(nan_batches=[2, 3, 4])
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0,
                  callbacks=[monitor])
        self.assertEqual(test_util.num(opt.iterations), 4)
        self.assertIn("the loss itself has been non-finite for 2 step(s): "
                      "lowering the loss scale cannot help",
                      monitor.stop_reason)


class StopOnNonfiniteLossTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.product(
        use_tf_function=[False, True],
        make=["v2", "v1"])
    def test_stops_at_the_first_nonfinite_loss(self, use_tf_function, make):
        variables = _variables()
        if make == "v2":
            opt = tf_lso.LossScaleOptimizer(
                keras.optimizers.SGD(0.1), initial_scale=8,
                stop_on_nonfinite_loss=True)
        else:
            opt = tf_lso.experimental.LossScaleOptimizer(
                keras.optimizers.SGD(0.1), tf_lso.experimental.DynamicLossScale(
                    8), stop_on_nonfinite_loss=True)
        step = _tf2_step(opt, variables,
                         {"tf_function": True} if use_tf_function else {})
        step(tf.constant(1e38))  # An overflow does not stop.
        step(tf.constant(1.0))
        before = [v.numpy() for v in variables]
        error = (tf.errors.InvalidArgumentError if use_tf_function
                 else RuntimeError)
        with self.assertRaises(error) as raised:
            step(tf.constant(NAN))
        self.assertIn(
            "Stopping at the first non-finite loss (stop_on_nonfinite_loss="
            "True): the loss itself has been non-finite for 1 step(s): "
            "lowering the loss scale cannot help; look at the inputs and the "
            "model (bad data, a division by zero, a log of 0). At step 2, 1 "
            "gradient(s) were not finite, for: a:0.",
            str(raised.exception))
        # The step was skipped and recorded, as without the option.
        for var, value in zip(variables, before):
            self.assertAllEqual(var, value)
        self.assertEqual(opt.last_overflow,
                         tf_lso.Overflow(2, 1, ("a:0",), 1, "loss"))
        self.assertEqual(test_util.num(opt.iterations), 3)
        self.assertEqual(test_util.num(opt._loss_scale()), 2.0)

    def test_changes_nothing_until_it_stops(self):
        runs = []
        for option in (False, True):
            variables = _variables()
            opt = tf_lso.LossScaleOptimizer(
                keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=8,
                dynamic_growth_steps=2, stop_on_nonfinite_loss=option)
            step = _tf2_step(opt, variables, {"tf_function": True})
            for x in (1.0, 1e38, 1.0, 1.0, 1.0, 2.0):
                step(tf.constant(x))
            runs.append(([v.numpy() for v in variables],
                         float(opt.loss_scale), opt.last_overflow,
                         test_util.num(opt.iterations)))
        for without, with_option in zip(runs[0][0], runs[1][0]):
            self.assertAllEqual(without, with_option)
        self.assertEqual(runs[0][1:], runs[1][1:])

    def test_default_off_config_and_validation(self):
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD())
        self.assertFalse(opt.stop_on_nonfinite_loss)
        self.assertNotIn("stop_on_nonfinite_loss", opt.get_config())
        on = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(),
                                       stop_on_nonfinite_loss=True)
        config = on.get_config()
        self.assertEqual(config, {**opt.get_config(),
                                  "stop_on_nonfinite_loss": True})
        self.assertTrue(tf_lso.LossScaleOptimizer.from_config(
            config).stop_on_nonfinite_loss)
        v1 = tf_lso.experimental.LossScaleOptimizer(
            keras.optimizers.SGD(), "dynamic", stop_on_nonfinite_loss=True)
        self.assertTrue(tf_lso.experimental.LossScaleOptimizer.from_config(
            v1.get_config()).stop_on_nonfinite_loss)
        with self.assertRaisesRegex(TypeError, "stop_on_nonfinite_loss"):
            tf_lso.LossScaleOptimizer(keras.optimizers.SGD(),
                                      stop_on_nonfinite_loss=1)

    def test_fit_stops_with_the_message(self):
        model = _model()
        model.compile(tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(1e-3), initial_scale=256,
            stop_on_nonfinite_loss=True), "mse")
        x, y = _data(nan_batches=[3])
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "the loss itself has been non-finite"):
            model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)

    def test_monitor_option_stops_fit_under_jit(self):
        _skip_overflow_under_xla_on_tf_2_16(self)
        model = _model()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1e-3),
                                            initial_scale=256)
        model.compile(opt, "mse", jit_compile=True)
        monitor = tf_lso.callbacks.LossScaleMonitor(
            stop_on_nonfinite_loss=True)
        x, y = _data(nan_batches=[3], overflow_batches=[1])
        model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
                  callbacks=[monitor])
        self.assertEqual(test_util.num(opt.iterations), 4)
        self.assertStartsWith(
            monitor.stop_reason, "Stopping training: Stopping at the first "
            "non-finite loss (stop_on_nonfinite_loss=True): the loss itself")


@pytest.mark.parametrize("mode", ["eager", "tf_function"])
def test_print_overflows_names_the_cause(mode, capfd):
    variables = _variables()
    opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                    initial_scale=8, print_overflows=True)
    step = _tf2_step(opt, variables,
                     {"tf_function": True} if mode == "tf_function" else {})
    step(tf.constant(NAN))
    step(tf.constant(1e38))
    lines = [line for line in capfd.readouterr().err.splitlines()
             if line.startswith("tf_lso:")]
    assert lines == [
        "tf_lso: skipped step 0 - the loss itself was not finite; 1 "
        'gradient(s) not finite, for: "a:0"',
        "tf_lso: skipped step 1 - the loss was finite (the gradients "
        "overflowed at this loss scale); 1 gradient(s) not finite, for: "
        '"a:0"',
    ]


class GradientAccumulationTest(tf.test.TestCase):
    def test_window_dropped_for_a_nan_loss_says_so(self):
        if not test_util.keras_has_gradient_accumulation():
            self.skipTest("Keras 3.4+ has gradient accumulation")
        variables = _variables()
        opt = tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(0.1, gradient_accumulation_steps=2),
            initial_scale=8)
        step = _tf2_step(opt, variables, {"tf_function": True})
        step(tf.constant(1.0))
        step(tf.constant(NAN))  # The first window's second call.
        # `iterations` counts windows here.
        self.assertEqual(opt.last_overflow,
                         tf_lso.Overflow(0, 1, ("a:0",), 1, "loss"))
        step(tf.constant(1e38))  # The next window's first call.
        step(tf.constant(1.0))
        self.assertEqual(opt.last_overflow,
                         tf_lso.Overflow(1, 1, ("a:0",), 2, "gradients"))
        self.assertEqual(test_util.num(opt.nonfinite_loss_steps), 1)


class MirroredStopTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(("eager", False), ("tf_function", True))
    def test_nan_loss_on_one_replica_stops_every_replica(
            self, use_tf_function):
        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            variables = _variables()
            opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                            stop_on_nonfinite_loss=True)

        step = _mirrored_step(strategy, opt, variables, 1, use_tf_function)
        step(tf.constant(1.0))
        error = (tf.errors.InvalidArgumentError if use_tf_function
                 else RuntimeError)
        with self.assertRaisesRegex(error, "stop_on_nonfinite_loss=True"):
            step(tf.constant(NAN))
        self.assertEqual(opt.last_overflow,
                         tf_lso.Overflow(1, 1, ("a:0",), 1, "loss"))


def test_seen_losses_drop_the_oldest_verdicts_first():
    seen = loss_scale_optimizer.SeenLosses()
    for stale in range(seen._MAX_ENTRIES - 1):  # Threads that never apply.
        seen._entries[-1 - stale] = (None, tf.constant(False))
    saw, done, taken = threading.Event(), threading.Event(), []

    def replica():  # Sees its loss, applies after the main thread saw.
        seen.see(tf.constant(NAN))
        saw.set()
        done.wait()
        taken.append(seen.take())

    thread = threading.Thread(target=replica)
    thread.start()
    saw.wait()
    seen.see(tf.constant(1.0))  # Full: the oldest stale verdict goes.
    done.set()
    thread.join()
    assert len(seen._entries) == seen._MAX_ENTRIES - 1
    assert bool(taken[0]) is True
    assert bool(seen.take()) is False
    assert seen.take() is None  # Taken once.
