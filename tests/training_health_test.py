"""Tests for tf_lso._src.optimizer.training_health: overflow records and stuck runs."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

import tf_lso
from tf_lso._src.optimizer import training_health

import test_util

INF, NAN = float("inf"), float("nan")


def _variables():
    return [tf.Variable([1.0, 2.0], name="a"), tf.Variable(3.0, name="b"),
            tf.Variable([4.0], name="c")]


def _grads(bad=(), value=INF):
    """Gradients for `_variables()`: `value` in the variables named in bad."""
    grads = [tf.constant([0.5, 0.5]), tf.constant(0.5), tf.constant([0.5])]
    for i, name in enumerate("abc"):
        if name in bad:
            grads[i] = grads[i] * value
    return grads


def _train_step(opt, variables, mode):
    """`opt.apply_gradients` of grads for `variables`: eagerly, or traced
    (`mode`: {"tf_function": True, "jit_compile": ...})."""

    def step(grads):
        opt.apply_gradients(zip(grads, variables))

    if mode:
        step = tf.function(step, jit_compile=mode.get("jit_compile"))
    return step


class OverflowRecordTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(
        ("eager", {}), ("tf_function", {"tf_function": True}),
        ("jit", {"tf_function": True, "jit_compile": True}),
    )
    def test_names_exactly_the_offending_variables(self, mode):
        variables = _variables()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                        initial_scale=8)

        step = _train_step(opt, variables, mode)
        self.assertIsNone(opt.last_overflow)
        step(_grads(bad="ac", value=NAN))
        self.assertEqual(opt.last_overflow,
                         tf_lso.Overflow(0, 2, ("a:0", "c:0"), 1))
        step(_grads(bad="b"))
        self.assertEqual(opt.last_overflow,
                         tf_lso.Overflow(1, 1, ("b:0",), 2))
        before = [v.numpy() for v in variables]
        step(_grads())  # Finite: applied, the record stays.
        self.assertNotAllClose(variables[0], before[0])
        self.assertEqual(opt.last_overflow.step, 1)
        step(_grads(bad="a"))  # A new run of skips starts at 1.
        self.assertEqual(opt.last_overflow,
                         tf_lso.Overflow(3, 1, ("a:0",), 1))
        self.assertEqual(test_util.num(opt.skipped_steps), 3)
        self.assertEqual(float(opt.loss_scale), 1.0)  # 8 halved 3 times.

    def test_count_is_exact_beyond_the_eight_named(self):
        variables = [tf.Variable(float(i), name=f"v{i}") for i in range(11)]
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        grads = [tf.constant(INF if i % 10 else 1.0) for i in range(11)]
        tf.function(opt.apply_gradients)(zip(grads, variables))
        overflow = opt.last_overflow
        self.assertEqual(overflow.count, 9)  # All but v0 and v10.
        self.assertEqual(overflow.variables,
                         tuple(f"v{i}:0" for i in range(1, 9)))

    def test_keras_variables_are_named_by_path(self):
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(
            1, name="dense")])
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        grads = [tf.fill(v.shape, INF) if "bias" in v.path else tf.zeros(
            v.shape) for v in model.trainable_variables]
        opt.apply_gradients(zip(grads, model.trainable_variables))
        bias = model.layers[0].bias
        self.assertEqual(opt.last_overflow.variables, (bias.path,))
        self.assertTrue(bias.path.endswith("dense/bias"), bias.path)

    def test_two_functions_with_different_variables(self):
        variables = _variables()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        first = tf.function(lambda g: opt.apply_gradients(
            zip(g, variables[:2])))
        second = tf.function(lambda g: opt.apply_gradients(
            zip(g, variables[1:])))
        opt.build(variables)
        first(_grads()[:2])
        second(_grads()[1:])
        second([tf.constant(1.0), tf.constant([NAN])])
        self.assertEqual(opt.last_overflow.variables, ("c:0",))
        first([tf.constant([INF, 1.0]), tf.constant(1.0)])
        self.assertEqual(opt.last_overflow.variables, ("a:0",))

    def test_last_overflow_is_eager_only(self):
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1))

        @tf.function
        def read():
            return opt.last_overflow

        with self.assertRaisesRegex(RuntimeError, "read it eagerly"):
            read()


class SkippedAtFloorTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(
        ("eager", {}), ("tf_function", {"tf_function": True}),
        ("jit", {"tf_function": True, "jit_compile": True}),
    )
    def test_counts_only_skips_taken_at_scale_one(self, mode):
        variables = _variables()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                        initial_scale=2)
        step = _train_step(opt, variables, mode)
        counts = []
        for bad in ("a", "a", "", "b"):  # Skipped at 2, 1, applied, 1.
            step(_grads(bad=bad, value=NAN) if bad else _grads())
            counts.append((float(opt.loss_scale),
                           test_util.num(opt.skipped_steps_at_floor)))
        self.assertEqual(counts, [(1.0, 0), (1.0, 1), (1.0, 1), (1.0, 2)])
        self.assertEqual(test_util.num(opt.skipped_steps), 3)


class MaxConsecutiveSkipsTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(
        ("v2_eager", "v2", False), ("v2_tf_function", "v2", True),
        ("v1_eager", "v1", False), ("v1_tf_function", "v1", True),
    )
    def test_k_plus_one_skips_in_a_row_raise(self, kind, use_tf_function):
        variables = _variables()
        if kind == "v2":
            opt = tf_lso.LossScaleOptimizer(
                keras.optimizers.SGD(0.1), initial_scale=8,
                max_consecutive_skips=3)
        else:
            opt = tf_lso.experimental.LossScaleOptimizer(
                keras.optimizers.SGD(0.1), "dynamic", max_consecutive_skips=3)
        step = test_util.maybe_function(
            lambda g: opt.apply_gradients(zip(g, variables)), use_tf_function)
        step(_grads(bad="a"))
        step(_grads(bad="a"))
        step(_grads())  # The run ends: the next one starts again at 1.
        for _ in range(3):
            step(_grads(bad="bc"))
        before = [v.numpy() for v in variables]
        error = (tf.errors.InvalidArgumentError if use_tf_function
                 else RuntimeError)
        with self.assertRaises(error) as raised:
            step(_grads(bad="bc"))
        message = str(raised.exception)
        self.assertIn("max_consecutive_skips=3", message)
        self.assertIn("b:0", message)
        self.assertIn("c:0", message)
        self.assertNotIn("a:0", message)
        self.assertIn("lower the learning rate", message)
        # The fourth skip happened (and is recorded) before the error.
        for var, value in zip(variables, before):
            self.assertAllEqual(var, value)
        self.assertEqual(opt.last_overflow,
                         tf_lso.Overflow(6, 2, ("b:0", "c:0"), 4))
        self.assertEqual(test_util.num(opt.iterations), 7)

    def test_function_error_reads_as_the_eager_one(self):
        # One sentence with the numbers and names in it, not a list of
        # bracketed values after the text.
        messages = []
        for use_tf_function in (False, True):
            variables = _variables()
            opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                            max_consecutive_skips=1)
            step = test_util.maybe_function(
                lambda g, opt=opt, v=variables: opt.apply_gradients(
                    zip(g, v)), use_tf_function)
            step(_grads(bad="ac"))
            with self.assertRaises(Exception) as raised:
                step(_grads(bad="ac"))
            messages.append(str(raised.exception))
        eager, function = messages
        self.assertStartsWith(
            eager, "2 steps in a row were skipped for non-finite gradients "
            "(more than max_consecutive_skips=1): training cannot make "
            "progress. At step 1, 2 gradient(s) were not finite, for: a:0, "
            "c:0. Usual remedies:")
        self.assertIn(f"assertion failed: [{eager}]", function)

    @parameterized.parameters(0, 2.5, -1)
    def test_invalid_values(self, value):
        with self.assertRaisesRegex(ValueError, "max_consecutive_skips"):
            tf_lso.LossScaleOptimizer(keras.optimizers.SGD(),
                                      max_consecutive_skips=value)
        with self.assertRaisesRegex(ValueError, "max_consecutive_skips"):
            tf_lso.callbacks.LossScaleMonitor(max_consecutive_skips=value)

    def test_config_round_trip_and_tf_configs_unchanged(self):
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(),
                                        max_consecutive_skips=5)
        config = opt.get_config()
        self.assertEqual(config["max_consecutive_skips"], 5)
        restored = tf_lso.LossScaleOptimizer.from_config(config)
        self.assertEqual(restored.max_consecutive_skips, 5)
        plain = tf_lso.LossScaleOptimizer(keras.optimizers.SGD())
        self.assertNotIn("max_consecutive_skips", plain.get_config())
        self.assertIsNone(plain.max_consecutive_skips)
        v1 = tf_lso.experimental.LossScaleOptimizer(
            keras.optimizers.SGD(), "dynamic", max_consecutive_skips=2)
        config = v1.get_config()
        self.assertEqual(config, {**tf_lso.experimental.LossScaleOptimizer(
            keras.optimizers.SGD(), "dynamic").get_config(),
            "max_consecutive_skips": 2})
        restored = tf_lso.experimental.LossScaleOptimizer.from_config(config)
        self.assertEqual(restored.max_consecutive_skips, 2)


class MirroredTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.product(bad_replica=[0, 1], use_tf_function=[False, True])
    def test_overflow_on_one_replica_names_its_variables(
            self, bad_replica, use_tf_function):
        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            variables = _variables()
            opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                            initial_scale=8)

        def replica_step(bad):
            on_this_replica = tf.equal(test_util.replica_id(), bad_replica)
            grads = _grads()
            grads[2] = tf.where(on_this_replica, grads[2] * bad, grads[2])
            opt.apply_gradients(zip(grads, variables))

        step = test_util.maybe_function(
            lambda bad: strategy.run(replica_step, args=(bad,)),
            use_tf_function)
        step(tf.constant(INF))
        self.assertEqual(opt.last_overflow,
                         tf_lso.Overflow(0, 1, ("c:0",), 1))
        step(tf.constant(1.0))
        self.assertEqual(opt.last_overflow.step, 0)
        self.assertEqual(test_util.num(opt.skipped_steps), 1)


def _model():
    keras.utils.set_random_seed(2)
    return keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(3, name="hidden"),
        keras.layers.Dense(1, name="out"),
    ])


def _data(bad_batches=()):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = rng.normal(size=(64, 1)).astype("float32")
    for batch in bad_batches:
        y[batch * 8] = 3e38  # Its squared error overflows to inf.
    return x, y


class FitTest(tf.test.TestCase):
    def test_fit_records_and_logs_the_overflow(self):
        model = _model()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.01))
        model.compile(opt, "mse")
        monitor = tf_lso.callbacks.LossScaleMonitor()
        x, y = _data(bad_batches=[5])
        history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False,
                            verbose=0, callbacks=[monitor])
        overflow = opt.last_overflow
        self.assertEqual(overflow.step, 5)
        self.assertEqual(overflow.count, 4)  # Every weight sees the inf.
        self.assertEqual(overflow.variables,
                         tuple(v.path for v in model.trainable_variables))
        self.assertEqual(history.history["last_overflow_count"], [4])
        self.assertEqual(history.history["skipped_steps"], [1])

    def test_monitor_stops_a_stuck_fit(self):
        model = _model()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.01))
        model.compile(opt, "mse")
        monitor = tf_lso.callbacks.LossScaleMonitor(max_consecutive_skips=2)
        x, y = _data(bad_batches=[1, 3, 4, 5, 6])
        model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0,
                  callbacks=[monitor])
        # Batches 3, 4, 5 are skipped in a row: stopped after batch 5.
        self.assertEqual(test_util.num(opt.iterations), 6)
        self.assertEqual(opt.last_overflow.consecutive_skips, 3)
        self.assertIn("3 steps in a row", monitor.stop_reason)
        self.assertIn("hidden/kernel", monitor.stop_reason)
        self.assertIn("max_consecutive_skips=2", monitor.stop_reason)

    def test_optimizer_guard_stops_fit_with_its_error(self):
        model = _model()
        model.compile(tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.01),
                                                max_consecutive_skips=1),
                      "mse")
        x, y = _data(bad_batches=[2, 3])
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "max_consecutive_skips=1"):
            model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)

    def test_warns_once_when_skipping_at_the_floor(self):
        model = _model()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.01),
                                        initial_scale=2)
        model.compile(opt, "mse")
        x, y = _data(bad_batches=[0, 1, 2])
        with pytest.warns(UserWarning, match="floor of 1") as caught:
            model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                      callbacks=[tf_lso.callbacks.LossScaleMonitor()])
        self.assertLen([w for w in caught if "floor" in str(w.message)], 1)
        self.assertEqual(float(opt.loss_scale), 1.0)


def test_overflow_record_validates_like_the_optimizer():
    with pytest.raises(TypeError, match="max_consecutive_skips"):
        training_health.OverflowRecord("3")
    assert training_health.OverflowRecord(2.0).max_consecutive_skips == 2


@pytest.mark.parametrize("mode", ["eager", "tf_function", "jit"])
def test_print_overflows_prints_skipped_steps_only(mode, capfd):
    variables = _variables()
    opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                    print_overflows=True)

    def step(grads):
        opt.apply_gradients(zip(grads, variables))

    if mode != "eager":
        step = tf.function(step, jit_compile=mode == "jit")
    step(_grads())
    step(_grads(bad="ac"))
    step(_grads())
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("tf_lso:")]
    if mode == "jit":  # XLA cannot compile printing: the record still works.
        assert lines == []
    else:
        assert lines == ["tf_lso: skipped step 1 - 2 gradient(s) not finite, "
                         'for: "a:0, c:0"']
    assert opt.last_overflow == tf_lso.Overflow(1, 2, ("a:0", "c:0"), 1)
    assert opt.get_config()["print_overflows"] is True
    assert tf_lso.LossScaleOptimizer.from_config(
        opt.get_config()).print_overflows
    with pytest.raises(TypeError, match="print_overflows"):
        tf_lso.LossScaleOptimizer(keras.optimizers.SGD(), print_overflows=1)


# -- LossScalingWarning (issue 52) ------------------------------------------


def _steps(opt, protocol, use_tf_function):
    """A training step of `protocol` on one variable, eager or traced."""
    var = tf.Variable([1.0, 2.0])

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(var * 3.0)
            if protocol in ("tf2", "tf2_never_unscaled", "tf2_apply",
                            "tf2_by_hand", "tf2_experimental_by_hand"):
                scaled = opt.get_scaled_loss(loss)
            else:
                scaled = opt.scale_loss(loss)
        grads = tape.gradient(scaled, [var])
        if protocol == "tf2":
            grads = opt.get_unscaled_gradients(grads)
        elif protocol == "tf2_by_hand":
            grads = [g / opt.loss_scale for g in grads]
        elif protocol == "tf2_experimental_by_hand":
            grads = [g / opt.loss_scale() for g in grads]
        if protocol in ("tf2_apply", "keras3_apply"):
            opt.apply(grads, [var])
        else:
            opt.apply_gradients(zip(grads, [var]))

    return test_util.maybe_function(step, use_tf_function), var


def _loss_scaling_warnings(record):
    return [w for w in record if issubclass(w.category,
                                            tf_lso.LossScalingWarning)]


@pytest.mark.parametrize("use_tf_function", [False, True])
def test_warns_once_when_get_scaled_loss_is_never_unscaled(use_tf_function):
    opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                    initial_scale=8)
    step, var = _steps(opt, "tf2_never_unscaled", use_tf_function)
    with pytest.warns(tf_lso.LossScalingWarning) as record:
        step()
        step()
    [warning] = _loss_scaling_warnings(record)
    assert str(warning.message).startswith(
        "apply_gradients got gradients, but the loss that get_scaled_loss "
        "scaled before it never went through get_unscaled_gradients")
    assert ("silence it with warnings.filterwarnings('ignore', "
            "category=tf_lso.LossScalingWarning)") in str(warning.message)
    # The user's file: the apply's line, or the traced function's call.
    assert warning.filename == __file__
    # Only told: the steps ran as written (gradients 3 * 8, applied).
    np.testing.assert_allclose(var.numpy(), [1.0 - 48.0, 2.0 - 48.0])


def test_the_experimental_class_warns_too():
    opt = tf_lso.experimental.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                                 loss_scale="dynamic")
    step, _ = _steps(opt, "tf2_never_unscaled", True)
    with pytest.warns(tf_lso.LossScalingWarning, match="get_unscaled"):
        step()


@pytest.mark.parametrize("use_tf_function", [False, True])
@pytest.mark.parametrize("protocol", [
    "tf2", "tf2_apply", "tf2_by_hand", "keras3", "keras3_apply"])
def test_no_warning_on_the_right_orders(protocol, use_tf_function):
    opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                    initial_scale=8)
    step, var = _steps(opt, protocol, use_tf_function)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tf_lso.LossScalingWarning)
        step()
        step()
    # Each right order applies the true gradient, 3, once per step.
    np.testing.assert_allclose(var.numpy(), [1.0 - 6.0, 2.0 - 6.0])


@pytest.mark.parametrize("use_tf_function", [False, True])
def test_no_warning_for_minimize_or_the_experimental_loss_scale(
        use_tf_function):
    var = tf.Variable(1.0)
    opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0))
    old = tf_lso.experimental.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                                 loss_scale=8)
    step, _ = _steps(old, "tf2_experimental_by_hand", use_tf_function)
    minimize = test_util.maybe_function(
        lambda: opt.minimize(lambda: var * 2.0, [var]), use_tf_function)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tf_lso.LossScalingWarning)
        minimize()
        step()
    assert float(var.numpy()) == -1.0


def test_no_warning_for_a_loss_seen_in_another_graph():
    # The loss is scaled in one function and the step applied in another:
    # which gradients they are is not known there.
    opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                    initial_scale=8)
    var = tf.Variable(1.0)

    @tf.function
    def scaled_loss():
        return opt.get_scaled_loss(var * 2.0)

    with warnings.catch_warnings():
        warnings.simplefilter("error", tf_lso.LossScalingWarning)
        scaled_loss()
        opt.apply_gradients([(tf.constant(1.0), var)])


@pytest.fixture
def global_policy():
    yield keras.mixed_precision.set_global_policy
    keras.mixed_precision.set_global_policy("float32")


def test_warns_when_built_under_a_bfloat16_policy(global_policy):
    global_policy("mixed_bfloat16")
    with pytest.warns(tf_lso.LossScalingWarning) as record:
        tf_lso.LossScaleOptimizer(keras.optimizers.SGD())
    [warning] = _loss_scaling_warnings(record)
    assert str(warning.message).startswith(
        "A loss scale optimizer with a dynamic loss scale was built while "
        "the global dtype policy is 'mixed_bfloat16'")
    assert warning.filename == __file__
    with pytest.warns(tf_lso.LossScalingWarning, match="mixed_bfloat16"):
        tf_lso.experimental.LossScaleOptimizer(keras.optimizers.SGD(),
                                               "dynamic")
    with warnings.catch_warnings():  # A fixed scale costs and skips nothing.
        warnings.simplefilter("error", tf_lso.LossScalingWarning)
        tf_lso.LossScaleOptimizer(keras.optimizers.SGD(), dynamic=False,
                                  initial_scale=1)
        tf_lso.experimental.LossScaleOptimizer(keras.optimizers.SGD(), 128)


def test_a_warning_raised_as_an_error_leaves_the_optimizer_free(
        global_policy):
    # Regression: the optimizer was claimed before the warning, so after
    # `-W error` raised it, no loss scale optimizer could wrap it again.
    global_policy("mixed_bfloat16")
    sgd = keras.optimizers.SGD()
    with warnings.catch_warnings():
        warnings.simplefilter("error", tf_lso.LossScalingWarning)
        with pytest.raises(tf_lso.LossScalingWarning):
            tf_lso.LossScaleOptimizer(sgd)
    global_policy("mixed_float16")
    assert tf_lso.LossScaleOptimizer(sgd).inner_optimizer is sgd


@pytest.mark.parametrize("policy", ["mixed_float16", "float32"])
def test_no_policy_warning_under_other_policies(global_policy, policy):
    global_policy(policy)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tf_lso.LossScalingWarning)
        tf_lso.LossScaleOptimizer(keras.optimizers.SGD())


@pytest.mark.parametrize("unscaled", [False, True])
def test_loss_scaling_warning_under_mirrored_strategy(unscaled):
    # Each replica scales and applies in its own thread: told once.
    strategy = test_util.mirrored_strategy()
    with strategy.scope():
        var = tf.Variable(1.0)
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                        initial_scale=8)

    @tf.function
    def step():
        def replica_step():
            with tf.GradientTape() as tape:
                scaled = opt.get_scaled_loss(var * 2.0)
            grads = tape.gradient(scaled, [var])
            if unscaled:
                grads = opt.get_unscaled_gradients(grads)
            opt.apply_gradients(zip(grads, [var]))

        strategy.run(replica_step)

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        step()
    assert len(_loss_scaling_warnings(record)) == (0 if unscaled else 1)
