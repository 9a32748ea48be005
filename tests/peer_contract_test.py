"""The peers' promises, kept by tf_lso's classes.

Under `tf_lso.install()` `keras.mixed_precision.LossScaleOptimizer` *is*
`tf_lso.LossScaleOptimizer`, so the class keeps the contract of Keras 3's
class as well as TF 2.4's. This file checks, on tf_lso's classes, what the
peers' own test suites check of theirs (the tests are written here; their
code stays theirs):

- Keras 3's `keras/src/optimizers/loss_scale_optimizer_test.py`
  (`KerasLossScaleOptimizerTest`);
- what Keras 3's `keras/src/optimizers/optimizer_test.py` checks of an
  optimizer that a wrapper must pass on (`WrappedKerasOptimizerTest`);
- tf_keras's `tf_keras/mixed_precision/loss_scale_optimizer_test.py`
  (keras-team/tf-keras; `TfKerasLossScaleOptimizerTest`).

A behaviour about the wrapper runs with each kind of inner optimizer: Keras
3, tf_keras and tf_keras legacy. One that tf_lso changes on purpose is a
strict xfail whose reason is its row in docs/migration.md (checked by
`test_every_deliberate_difference_is_documented`). Left out: Keras 3's
stateless tests (TensorFlow has no `stateless_apply`; tf_lso raises as Keras
3's TensorFlow optimizers do, see loss_scale_optimizer_test.py) and
tf_keras's `convert_to_legacy_optimizer` (a tf_keras function for tf_keras
optimizers).
"""

import os
import pathlib
import pickle
import re
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

import tf_lso

import inner_kinds
import test_util

INF, NAN = float("inf"), float("nan")
KINDS = inner_kinds.NAMES
MIGRATION = pathlib.Path(__file__).parents[1] / "docs" / "migration.md"
_DELIBERATE = []


def _deliberate(row):
    """A strict xfail: tf_lso differs on purpose, as `row` of the docs says."""
    _DELIBERATE.append(row)
    return pytest.mark.xfail(
        strict=True, reason=f"docs/migration.md, row {row!r}")


_sgd = inner_kinds.sgd


def _kinds_and_modes():
    return parameterized.named_parameters(
        (f"{kind}_{mode}", kind, mode == "tf_function")
        for kind in KINDS for mode in ("eager", "tf_function"))


def _kinds():
    return parameterized.named_parameters((kind, kind) for kind in KINDS)


class KerasLossScaleOptimizerTest(tf.test.TestCase, parameterized.TestCase):
    """Keras 3's loss_scale_optimizer_test.py, on tf_lso's class."""

    @_kinds()
    def test_config(self, kind):
        inner = _sgd(kind, learning_rate=0.5, momentum=0.06, nesterov=True)
        opt = tf_lso.LossScaleOptimizer(inner, name="lso")
        config = opt.get_config()
        restored = tf_lso.LossScaleOptimizer.from_config(config)
        self.assertEqual(restored.get_config(), config)
        self.assertEqual(dir(restored), dir(opt))
        serialized = keras.optimizers.deserialize(
            keras.optimizers.serialize(opt))
        # Around a tf_keras optimizer: tf_lso's class as tf_keras takes it
        # (a subclass, issue 50), as `opt` itself is.
        self.assertIs(type(serialized), type(opt))
        self.assertIsInstance(serialized, tf_lso.LossScaleOptimizer)
        self.assertEqual(serialized.get_config(), config)
        revived = keras.saving.deserialize_keras_object(
            keras.saving.serialize_keras_object(opt))
        self.assertEqual(revived.get_config(), config)

    @_kinds_and_modes()
    def test_apply_with_no_vars(self, kind, use_tf_function):
        opt = tf_lso.LossScaleOptimizer(_sgd(kind, learning_rate=0.5))
        var = tf.Variable([1.0, 2.0, 3.0, 4.0])
        opt.build([var])
        grads = [tf.constant([1.0, 6.0, 7.0, 2.0]) * opt.initial_scale]
        test_util.maybe_function(lambda: opt.apply(grads), use_tf_function)()
        self.assertAllEqual(var, [0.5, -1.0, -0.5, 3.0])

    @_kinds_and_modes()
    def test_finite_step(self, kind, use_tf_function):
        opt = tf_lso.LossScaleOptimizer(_sgd(kind, learning_rate=0.5))
        var = tf.Variable([1.0, 2.0, 3.0, 4.0])
        grads = [tf.constant([1.0, 6.0, 7.0, 2.0]) * opt.initial_scale]
        test_util.maybe_function(lambda: opt.apply(grads, [var]),
                                 use_tf_function)()
        self.assertAllEqual(var, [0.5, -1.0, -0.5, 3.0])

    @_deliberate("Inner optimizer with `loss_scale_factor`")
    def test_finite_step_with_inner_loss_scale(self):
        inner = keras.optimizers.SGD(learning_rate=0.5, loss_scale_factor=100)
        opt = tf_lso.LossScaleOptimizer(inner)
        var = tf.Variable([1.0, 2.0, 3.0, 4.0])
        opt.apply([tf.constant([1.0, 6.0, 7.0, 2.0]) * opt.initial_scale],
                  [var])
        self.assertAllEqual(var, [0.5, -1.0, -0.5, 3.0])

    @_kinds_and_modes()
    def test_infinite_step(self, kind, use_tf_function):
        opt = tf_lso.LossScaleOptimizer(_sgd(kind, learning_rate=0.5))
        var = tf.Variable([1.0, 2.0, 3.0, 4.0])
        test_util.maybe_function(
            lambda: opt.apply([tf.fill([4], INF)], [var]), use_tf_function)()
        self.assertAllEqual(var, [1.0, 2.0, 3.0, 4.0])
        self.assertEqual(float(opt.loss_scale), 2.0**14)

    @test_util.EAGER_AND_FUNCTION
    def test_finite_step_with_overwrite(self, use_tf_function):
        # With a second, ordinary variable: Keras 3.8's own optimizers raise
        # "No gradients provided" when every variable is overwritten.
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.5))
        var = keras.Variable([1.0, 2.0, 3.0, 4.0])
        var.overwrite_with_gradient = True
        other = keras.Variable([1.0, 2.0, 3.0, 4.0])
        grads = [tf.constant([1.0, 6.0, 7.0, 2.0])] * 2
        test_util.maybe_function(lambda: opt.apply(grads, [var, other]),
                                 use_tf_function)()
        self.assertAllEqual(var, grads[0])
        self.assertAllEqual(other, [1.0, 2.0, 3.0, 4.0] - grads[0] / 2**16)

    @_kinds_and_modes()
    def test_downscaling(self, kind, use_tf_function):
        opt = tf_lso.LossScaleOptimizer(_sgd(kind, learning_rate=0.5),
                                        initial_scale=400.0)
        var = tf.Variable([1.0, 2.0, 3.0, 4.0])
        opt.build([var])
        step = test_util.maybe_function(
            lambda: opt.apply([tf.fill([4], INF)], [var]), use_tf_function)
        for _ in range(4):
            step()
        self.assertEqual(float(opt.scale_loss(1.0)), 25.0)

    @_kinds_and_modes()
    def test_upscaling(self, kind, use_tf_function):
        opt = tf_lso.LossScaleOptimizer(_sgd(kind, learning_rate=0.5),
                                        initial_scale=2.0,
                                        dynamic_growth_steps=2)
        var = tf.Variable([1.0, 2.0, 3.0, 4.0])
        opt.build([var])
        step = test_util.maybe_function(
            lambda: opt.apply([tf.constant([1.0, 6.0, 7.0, 2.0])], [var]),
            use_tf_function)
        for _ in range(8):
            step()
        self.assertEqual(float(opt.scale_loss(1.0)), 32.0)

    @_kinds_and_modes()
    def test_iterations_update(self, kind, use_tf_function):
        opt = tf_lso.LossScaleOptimizer(_sgd(kind, learning_rate=0.5))
        var = tf.Variable([1.0, 2.0, 3.0, 4.0])
        opt.build([var])
        self.assertEqual(test_util.num(opt.iterations), 0)
        step = test_util.maybe_function(
            lambda: opt.apply([tf.constant([1.0, 6.0, 7.0, 2.0])], [var]),
            use_tf_function)
        for i in range(3):
            step()
            self.assertEqual(test_util.num(opt.iterations), i + 1)

    @_deliberate("`iterations` on a skipped step")
    def test_a_skipped_step_is_not_counted(self):
        # Keras 3's class counts only the steps that apply.
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.5))
        var = tf.Variable([1.0, 2.0])
        opt.build([var])
        opt.apply([tf.constant([INF, 1.0])], [var])
        self.assertEqual(test_util.num(opt.iterations), 0)

    def test_serialization(self):
        opt = tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(learning_rate=0.5), initial_scale=3.0,
            dynamic_growth_steps=2, name="test_opt")
        config = opt.get_config()
        self.assertEqual(config["name"], "test_opt")
        self.assertEqual(config["initial_scale"], 3.0)
        self.assertEqual(config["dynamic_growth_steps"], 2)
        self.assertIn("inner_optimizer", config)
        restored = tf_lso.LossScaleOptimizer.from_config(config)
        self.assertEqual(restored.name, "test_opt")

    @_deliberate("`get_config()`")
    def test_serialization_has_keras_keys_only(self):
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(), name="x")
        self.assertLen(opt.get_config(), 4)

    def test_init_dynamic_true(self):
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.5),
                                        dynamic=True)
        self.assertTrue(opt.dynamic)

    @_deliberate("`dynamic=False`")
    def test_init_dynamic_false_is_refused(self):
        with self.assertRaisesRegex(ValueError, "set `loss_scale_factor`"):
            tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.5),
                                      dynamic=False, initial_scale=2)

    def test_init_unsupported_arg(self):
        with self.assertRaisesRegex(ValueError, "arguments: `foo`, `bar`"):
            tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.5), foo=True,
                                      bar=3)

    @parameterized.named_parameters(
        ("weight_decay", "weight_decay", 0.5), ("clipnorm", "clipnorm", 0.5),
        ("global_clipnorm", "global_clipnorm", 0.5),
        ("clipvalue", "clipvalue", 0.5), ("use_ema", "use_ema", True),
        ("ema_momentum", "ema_momentum", 0.5),
        ("ema_overwrite_frequency", "ema_overwrite_frequency", 2),
        ("loss_scale_factor", "loss_scale_factor", 0.5),
        ("gradient_accumulation_steps", "gradient_accumulation_steps", 2),
    )
    def test_init_base_optimizer_unsupported_args(self, name, value):
        with self.assertRaisesRegex(ValueError, "on the `inner_optimizer`"):
            tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.5),
                                      **{name: value})

    def test_deserialization_backwards_compatibility(self):
        # A Keras 3.0-3.3 config, with the base optimizer's settings.
        base = {"weight_decay": None, "clipnorm": None,
                "global_clipnorm": None, "clipvalue": None, "use_ema": False,
                "ema_momentum": 0.99, "ema_overwrite_frequency": None,
                "loss_scale_factor": None,
                "gradient_accumulation_steps": None}
        config = {
            "name": "loss_scale_optimizer", **base,
            "inner_optimizer": {
                "module": "keras.optimizers", "class_name": "SGD",
                "config": {"name": "SGD", "learning_rate": 0.5, **base,
                           "momentum": 0.0, "nesterov": False},
                "registered_name": None,
            },
            "initial_scale": 2.0, "dynamic_growth_steps": 2,
        }
        opt = tf_lso.LossScaleOptimizer.from_config(config)
        self.assertEqual((opt.name, opt.initial_scale,
                          opt.dynamic_growth_steps),
                         ("loss_scale_optimizer", 2.0, 2))
        self.assertEqual(float(opt.learning_rate), 0.5)


class WrappedKerasOptimizerTest(tf.test.TestCase, parameterized.TestCase):
    """What Keras 3's optimizer_test.py checks, through the wrapper."""

    @_kinds()
    def test_empty_gradients(self, kind):
        opt = tf_lso.LossScaleOptimizer(_sgd(kind, 1.0), initial_scale=1)
        var = tf.Variable([[3.0, 4.0], [5.0, 6.0]])
        with self.assertRaisesRegex(
                ValueError, "No gradients provided for any variable"):
            opt.apply_gradients([(None, var)])
        other = tf.Variable([[3.0, 4.0], [5.0, 6.0]])
        with warnings.catch_warnings():
            # Keras 3 warns (UserWarning), tf_keras logs.
            warnings.simplefilter("ignore", UserWarning)
            opt.apply_gradients([(None, var), (tf.ones([2, 2]), other)])
        self.assertAllEqual(var, [[3.0, 4.0], [5.0, 6.0]])
        self.assertAllEqual(other, [[2.0, 3.0], [4.0, 5.0]])

    def test_partly_empty_gradients_warn_as_keras_does(self):
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.Adam(1.0))
        var, other = keras.Variable([[1.0, 2.0]]), tf.Variable([[1.0, 2.0]])
        opt.apply_gradients([(tf.ones([1, 2]), var), (tf.ones([1, 2]), other)])
        with self.assertWarnsRegex(UserWarning,
                                   "Gradients do not exist for variables"):
            opt.apply_gradients([(tf.ones([1, 2]), var), (None, other)])
        self.assertEqual(test_util.num(opt.iterations), 2)

    @test_util.EAGER_AND_FUNCTION
    def test_ema(self, use_tf_function):
        inner = keras.optimizers.SGD(learning_rate=1.0, use_ema=True,
                                     ema_momentum=0.9,
                                     ema_overwrite_frequency=3)
        opt = tf_lso.LossScaleOptimizer(inner, initial_scale=1)
        var = keras.Variable([[3.0, 4.0], [5.0, 6.0]])
        step = test_util.maybe_function(
            lambda: opt.apply_gradients([(tf.ones([2, 2]), var)]),
            use_tf_function)
        step()
        self.assertAllClose(var, [[2.0, 3.0], [4.0, 5.0]])
        step()
        self.assertAllClose(var, [[1.0, 2.0], [3.0, 4.0]])
        step()  # The third step writes the moving average into `var`.
        self.assertAllClose(var, [[1.71, 2.71], [3.71, 4.71]])

    def test_ema_with_model_fit(self):
        inner = keras.optimizers.SGD(learning_rate=0.1, use_ema=True,
                                     ema_momentum=0.9)
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(
            2, kernel_initializer="ones", use_bias=False)])
        model.compile(tf_lso.LossScaleOptimizer(inner), "mse",
                      run_eagerly=True)
        model.fit(np.ones((1, 1)), np.zeros((1, 1)), batch_size=1, epochs=2,
                  verbose=0)
        self.assertAllClose(model.trainable_variables[0], [[0.891, 0.891]],
                            atol=1e-5)

    def test_constraints_are_applied(self):
        var = keras.Variable(np.random.default_rng(0).random((2, 2)) - 1.0)
        var.constraint = keras.constraints.NonNeg()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1e-4))
        opt.apply_gradients([(tf.zeros([2, 2]), var)])
        self.assertEqual(float(np.min(var)), 0.0)

    def test_set_weights(self):
        var = keras.Variable([[1.0, 2.0], [3.0, 4.0]])
        first = tf_lso.LossScaleOptimizer(keras.optimizers.Adam())
        first.apply_gradients([(tf.constant([[1.0, 2.0], [3.0, 4.0]]), var)])
        second = tf_lso.LossScaleOptimizer(keras.optimizers.Adam())
        with self.assertRaisesRegex(ValueError, "You are calling"):
            second.set_weights(first.variables)
        second.build([var])
        second.set_weights(first.variables)
        for a, b in zip(first.variables, second.variables):
            self.assertAllEqual(a, b)

    @test_util.EAGER_AND_FUNCTION
    def test_gradient_accumulation(self, use_tf_function):
        inner = keras.optimizers.SGD(learning_rate=1.0,
                                     gradient_accumulation_steps=3)
        opt = tf_lso.LossScaleOptimizer(inner, initial_scale=1)
        self.assertEqual(opt.gradient_accumulation_steps, 3)
        var = keras.Variable([[1.0, 2.0], [3.0, 4.0]])
        step = test_util.maybe_function(
            lambda: opt.apply_gradients([(tf.ones([2, 2]), var)]),
            use_tf_function)
        expected = [[[1.0, 2.0], [3.0, 4.0]]] * 2 + [[[0.0, 1.0], [2.0, 3.0]]] * 2
        for i, value in enumerate(expected):
            step()
            self.assertAllEqual(var, value)
            self.assertEqual(test_util.num(opt.iterations), (i + 1) // 3)

    def test_overwrite_with_gradient_with_gradient_accumulation(self):
        inner = keras.optimizers.SGD(learning_rate=1.0,
                                     gradient_accumulation_steps=2)
        opt = tf_lso.LossScaleOptimizer(inner, initial_scale=1)
        value = keras.Variable([[1.0, 2.0], [3.0, 4.0]])
        value.overwrite_with_gradient = True
        var = keras.Variable([[1.0, 2.0], [3.0, 4.0]])
        ones, twos = tf.ones([2, 2]), tf.fill([2, 2], 2.0)
        opt.apply_gradients([(ones, value), (ones, var)])
        self.assertAllEqual(value, [[1.0, 2.0], [3.0, 4.0]])
        self.assertAllEqual(var, [[1.0, 2.0], [3.0, 4.0]])
        opt.apply_gradients([(twos, value), (twos, var)])
        self.assertAllEqual(value, [[2.0, 2.0], [2.0, 2.0]])  # The maximum.
        self.assertAllEqual(var, [[-0.5, 0.5], [1.5, 2.5]])  # The mean.
        opt.apply_gradients([(ones, value), (ones, var)])
        self.assertAllEqual(value, [[2.0, 2.0], [2.0, 2.0]])
        self.assertEqual(test_util.num(opt.iterations), 1)

    def test_tf_checkpointing(self):
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.Adam())
        x, y = np.ones((1, 2)), np.full((1, 2), 0.5)
        model.compile(opt, "mse")
        model.train_on_batch(x, y)
        expected = model.predict(x, verbose=0)
        checkpoint = tf.train.Checkpoint(model, optimizer=opt)
        path = checkpoint.save(os.path.join(self.get_temp_dir(), "ckpt"))
        model.train_on_batch(x, y)
        self.assertNotAllClose(model.predict(x, verbose=0), expected)
        checkpoint.restore(path)
        self.assertAllEqual(model.predict(x, verbose=0), expected)

    def test_callable_learning_rate(self):
        opt = tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(learning_rate=lambda: 0.1), initial_scale=1)
        var = keras.Variable([[1.0, 2.0], [3.0, 4.0]])
        opt.apply_gradients([(tf.ones([2, 2]), var)])
        self.assertAllClose(var, [[0.9, 1.9], [2.9, 3.9]])
        self.assertEqual(test_util.num(opt.iterations), 1)

    @_kinds()
    def test_pickleable(self, kind):
        opt = tf_lso.LossScaleOptimizer(_sgd(kind, 0.5), initial_scale=8)
        reloaded = pickle.loads(pickle.dumps(opt))
        # type(opt): around a tf_keras optimizer, a subclass (issue 50).
        self.assertIs(type(reloaded), type(opt))
        self.assertIsInstance(reloaded, tf_lso.LossScaleOptimizer)
        self.assertEqual(reloaded.get_config(), opt.get_config())

    def test_mixed_with_tf_variables(self):
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.Adam(1.0))
        var, tf_var = keras.Variable([[1.0, 2.0]]), tf.Variable([[1.0, 2.0]])
        opt.apply_gradients([(tf.ones([1, 2]), var),
                             (tf.ones([1, 2]), tf_var)])
        self.assertEqual(test_util.num(opt.iterations), 1)

    def test_auto_naming(self):
        first = tf_lso.LossScaleOptimizer(keras.optimizers.SGD())
        second = tf_lso.LossScaleOptimizer(keras.optimizers.SGD())
        self.assertRegex(first.name, r"^loss_scale_optimizer(_\d+)?$")
        self.assertNotEqual(first.name, second.name)

    @test_util.EAGER_AND_FUNCTION
    def test_sparse_gradients_match_the_bare_optimizer(self, use_tf_function):
        # An Embedding's gradient is IndexedSlices; only its rows change.
        results = []
        for wrap in (False, True):
            table = keras.Variable(np.arange(12.0).reshape(4, 3))
            inner = keras.optimizers.Adam(0.1)
            opt = (tf_lso.LossScaleOptimizer(inner, initial_scale=8) if wrap
                   else inner)

            opt.build([table])
            test_util.maybe_function(_sparse_step(opt, table),
                                     use_tf_function)()
            results.append(np.asarray(table))
        self.assertAllEqual(results[1], results[0])
        self.assertAllEqual(results[1][[0, 1, 3]],
                            np.arange(12.0).reshape(4, 3)[[0, 1, 3]])


def _sparse_step(opt, table):
    """Applies a gradient to row 2 of `table` (captured, not an argument)."""

    def step():
        grad = tf.IndexedSlices(tf.constant([[1.0, 2.0, 3.0]]),
                                tf.constant([2]), tf.constant([4, 3]))
        opt.apply_gradients([(grad, table)])

    return step


def _grad_check_step(strategy, opt, var, expected_grad):
    """tf_keras's `_run_fn_with_grad_check`: minimize through a check."""
    check = test_util.create_identity_with_grad_check_fn(expected_grad)

    def step():
        opt.minimize(lambda: check(var) / strategy.num_replicas_in_sync,
                     var_list=[var])

    return step


def _strategy_cases():
    return parameterized.named_parameters(
        (f"{kind}_{strategy}_{mode}", kind, strategy, mode == "tf_function")
        for kind in KINDS for strategy in ("default", "mirrored")
        for mode in ("eager", "tf_function"))


class TfKerasLossScaleOptimizerTest(tf.test.TestCase,
                                    parameterized.TestCase):
    """tf_keras's loss_scale_optimizer_test.py, on tf_lso's class."""

    def _run(self, strategy, step, use_tf_function):
        run = test_util.maybe_function(lambda: strategy.run(step),
                                       use_tf_function)
        run()
        return run

    @_kinds()
    def test_is_instance(self, kind):
        opt = tf_lso.LossScaleOptimizer(_sgd(kind))
        self.assertIsInstance(opt, keras.optimizers.LossScaleOptimizer)

    @_strategy_cases()
    def test_fixed_loss_scale_applied_to_loss_with_minimize(
            self, kind, strategy_name, use_tf_function):
        strategy = test_util.STRATEGIES[strategy_name]()
        with strategy.scope():
            var = tf.Variable([5.0])
            opt = tf_lso.LossScaleOptimizer(_sgd(kind, 2.0), dynamic=False,
                                            initial_scale=10.0)
        self.assertEqual(float(opt.loss_scale), 10.0)
        self.assertIsInstance(opt.loss_scale, tf.Tensor)
        self._run(strategy, _grad_check_step(
            strategy, opt, var, 10.0 / strategy.num_replicas_in_sync),
            use_tf_function)
        self.assertAllEqual(test_util.local_values(strategy, var),
                            [[3.0]] * strategy.num_replicas_in_sync)

    @_kinds()
    def test_dynamic_attrs_with_fixed_loss_scale(self, kind):
        opt = tf_lso.LossScaleOptimizer(_sgd(kind), dynamic=False,
                                        initial_scale=2.0)
        self.assertFalse(opt.dynamic)
        self.assertIsNone(opt.dynamic_counter)
        self.assertIsNone(opt.dynamic_growth_steps)

    @_kinds()
    def test_get_scaled_loss(self, kind):
        opt = tf_lso.LossScaleOptimizer(_sgd(kind), dynamic=False,
                                        initial_scale=2.0)
        for dtype in ("float32", "float16"):
            loss = tf.constant(5.0, dtype)
            self.assertEqual(float(opt.get_scaled_loss(loss)), 10.0)
            self.assertEqual(
                float(opt.get_scaled_loss(lambda loss=loss: loss)()), 10.0)
            self.assertEqual(opt.get_scaled_loss(loss).dtype, dtype)

    @_kinds()
    def test_get_unscaled_gradients(self, kind):
        opt = tf_lso.LossScaleOptimizer(_sgd(kind), dynamic=False,
                                        initial_scale=2)
        grads = opt.get_unscaled_gradients(
            [tf.constant(3.0), None, tf.constant(-4.0, "float16")])
        self.assertEqual([None if g is None else float(g) for g in grads],
                         [1.5, None, -2.0])
        self.assertEqual(grads[2].dtype, tf.float16)
        sparse = opt.get_unscaled_gradients([tf.IndexedSlices(
            tf.constant([[4.0, 2.0], [8.0, 5.0]]), tf.constant([1, 3]),
            dense_shape=tf.constant([5, 2]))])[0]
        self.assertIsInstance(sparse, tf.IndexedSlices)
        self.assertAllEqual(sparse.values, [[2.0, 1.0], [4.0, 2.5]])

    @_strategy_cases()
    def test_dynamic_loss_scale(self, kind, strategy_name, use_tf_function):
        strategy = test_util.STRATEGIES[strategy_name]()
        replicas = strategy.num_replicas_in_sync
        expected = tf.Variable(2.0 / replicas)
        with strategy.scope():
            var = tf.Variable([5.0])
            opt = tf_lso.LossScaleOptimizer(_sgd(kind, 2.0), initial_scale=2,
                                            dynamic_growth_steps=1)
        self.assertIsInstance(opt.initial_scale, float)
        self.assertIsInstance(opt.dynamic_growth_steps, int)
        run = self._run(strategy, _grad_check_step(strategy, opt, var,
                                                   expected), use_tf_function)
        self.assertAllEqual(test_util.local_values(strategy, var)[0], [3.0])
        # The scale doubled, and so did the gradient that reaches the loss.
        expected.assign(4.0 / replicas)
        run()
        self.assertAllEqual(test_util.local_values(strategy, var)[0], [1.0])

    @_kinds()
    def test_dynamic_loss_scale_default_values(self, kind):
        opt = tf_lso.LossScaleOptimizer(_sgd(kind))
        self.assertEqual((opt.initial_scale, opt.dynamic_growth_steps),
                         (2.0**15, 2000))
        self.assertEqual(float(opt.loss_scale), 2.0**15)

    @parameterized.named_parameters(
        (f"{kind}_{clip}", kind, clip) for kind in KINDS
        for clip in ("clipnorm", "global_clipnorm", "clipvalue"))
    def test_clipping(self, kind, clip):
        var = tf.Variable([5.0])
        opt = tf_lso.LossScaleOptimizer(_sgd(kind, 2.0, **{clip: 2.0}),
                                        initial_scale=2,
                                        dynamic_growth_steps=1)
        self.assertEqual(getattr(opt, clip), 2.0)
        opt.minimize(lambda: var * 4.0, [var])  # Gradient 4, clipped to 2.
        self.assertAllEqual(var, [1.0])
        self.assertEqual(float(opt.loss_scale), 4.0)
        setattr(opt, clip, 3.0)
        self.assertEqual(getattr(opt.inner_optimizer, clip), 3.0)
        opt.minimize(lambda: var * 4.0, [var])
        self.assertAllEqual(var, [-5.0])
        self.assertEqual(float(opt.loss_scale), 8.0)
        opt.minimize(lambda: var * INF, [var])  # Skipped, not clipped.
        self.assertAllEqual(var, [-5.0])
        self.assertEqual(float(opt.loss_scale), 4.0)

    @_strategy_cases()
    def test_dynamic_update(self, kind, strategy_name, use_tf_function):
        strategy = test_util.STRATEGIES[strategy_name]()
        replicas = strategy.num_replicas_in_sync
        with strategy.scope():
            var = tf.Variable([1.0, 2.0])
            opt = tf_lso.LossScaleOptimizer(_sgd(kind, 1.0), initial_scale=2,
                                            dynamic_growth_steps=1)
        self._run(strategy, lambda: opt.minimize(
            lambda: var * 2.0 / replicas, [var]), use_tf_function)
        self.assertAllEqual(test_util.local_values(strategy, var)[0],
                            [-1.0, 0.0])
        self.assertEqual(float(opt.loss_scale), 4.0)
        self._run(strategy, lambda: opt.minimize(lambda: var * NAN, [var]),
                  use_tf_function)
        self.assertAllEqual(test_util.local_values(strategy, var)[0],
                            [-1.0, 0.0])
        self.assertEqual(float(opt.loss_scale), 2.0)

    @_kinds_and_modes()
    def test_dynamic_loss_scale_with_float16_loss(self, kind, use_tf_function):
        var = tf.Variable([5.0])
        opt = tf_lso.LossScaleOptimizer(_sgd(kind, 2.0), initial_scale=2,
                                        dynamic_growth_steps=1)
        test_util.maybe_function(lambda: opt.minimize(
            lambda: tf.cast(var, "float16"), [var]), use_tf_function)()
        self.assertAllEqual(var, [3.0])

    @test_util.EAGER_AND_FUNCTION
    def test_nan_on_one_replica_only(self, use_tf_function):
        strategy = test_util.mirrored_strategy()
        for kind in KINDS:
            with strategy.scope():
                var = tf.Variable([1.0, 2.0])
                opt = tf_lso.LossScaleOptimizer(_sgd(kind, 1.0),
                                                initial_scale=2,
                                                dynamic_growth_steps=2)

            def loss(var=var):
                last = test_util.value_on_replica_0(1.0, NAN)
                return var * tf.stack([2.0, last])

            self._run(strategy, lambda opt=opt, var=var, loss=loss:
                      opt.minimize(loss, [var]), use_tf_function)
            self.assertAllEqual(test_util.local_values(strategy, var),
                                [[1.0, 2.0], [1.0, 2.0]])
            self.assertEqual(float(opt.loss_scale), 1.0)

    @test_util.EAGER_AND_FUNCTION
    def test_custom_aggregator(self, use_tf_function):
        def aggregator(grads_and_vars):
            # As an all-reduce where a replica has a NaN gradient.
            grads_and_vars = list(grads_and_vars)
            grad, var = grads_and_vars[-1]
            grads_and_vars[-1] = (grad * NAN, var)
            return grads_and_vars

        var = tf.Variable([1.0, 2.0])
        opt = tf_lso.LossScaleOptimizer(
            test_util.tf_keras.optimizers.legacy.SGD(
                1.0, gradient_aggregator=aggregator),
            initial_scale=2, dynamic_growth_steps=2)
        test_util.maybe_function(lambda: opt.minimize(lambda: var * 2, [var]),
                                 use_tf_function)()
        self.assertAllEqual(var, [1.0, 2.0])
        self.assertEqual(float(opt.loss_scale), 1.0)

    @_strategy_cases()
    def test_dynamic_loss_scale_with_slots(self, kind, strategy_name,
                                           use_tf_function):
        strategy = test_util.STRATEGIES[strategy_name]()
        with strategy.scope():
            var = tf.Variable([1.0, 2.0])
            opt = tf_lso.LossScaleOptimizer(_sgd(kind, 1.0, momentum=1.0),
                                            initial_scale=2.0,
                                            dynamic_growth_steps=1)
        run = self._run(strategy, lambda: opt.minimize(
            lambda: var / strategy.num_replicas_in_sync, [var]),
            use_tf_function)
        self.assertAllEqual(test_util.local_values(strategy, var)[0],
                            [0.0, 1.0])
        self.assertEqual(float(opt.loss_scale), 4.0)
        run()  # The momentum is 2 now.
        self.assertAllEqual(test_util.local_values(strategy, var)[0],
                            [-2.0, -1.0])
        self.assertEqual(float(opt.loss_scale), 8.0)
        if kind == "tf_keras_legacy":
            self.assertEqual(opt.get_slot_names(), ["momentum"])

    @_kinds()
    def test_iterations(self, kind):
        inner = _sgd(kind, 2.0)
        opt = tf_lso.LossScaleOptimizer(inner, dynamic=False,
                                        initial_scale=10.0)
        opt.iterations = 7
        self.assertEqual(test_util.num(opt.iterations), 7)
        self.assertEqual(test_util.num(inner.iterations), 7)

    @_strategy_cases()
    def test_iterations_incremented(self, kind, strategy_name,
                                    use_tf_function):
        strategy = test_util.STRATEGIES[strategy_name]()
        with strategy.scope():
            opt = tf_lso.LossScaleOptimizer(_sgd(kind, 1.0))
            var = tf.Variable([5.0])
        self._run(strategy, lambda: opt.minimize(
            lambda: var * 2.0 / strategy.num_replicas_in_sync, [var]),
            use_tf_function)
        self.assertAllEqual(test_util.local_values(strategy, var)[0], [3.0])
        self.assertEqual(test_util.num(opt.iterations), 1)
        self._run(strategy, lambda: opt.minimize(lambda: var * NAN, [var]),
                  use_tf_function)
        self.assertAllEqual(test_util.local_values(strategy, var)[0], [3.0])
        self.assertEqual(test_util.num(opt.iterations), 2)

    def test_weight_methods(self):
        var = tf.Variable([1.0])
        opt = tf_lso.LossScaleOptimizer(
            test_util.tf_keras.optimizers.legacy.SGD(1.0), initial_scale=2.0,
            dynamic_growth_steps=1)
        opt.minimize(lambda: var * 2, [var])
        self.assertLen(opt.weights, 1)  # `iterations`.
        self.assertEqual(int(opt.weights[0]), 1)
        self.assertEqual(opt.get_weights()[0], 1)
        self.assertEqual(int(opt.variables()[0]), 1)
        opt.set_weights([np.array(2)])
        self.assertEqual(int(opt.variables()[0]), 2)

    def test_hyperparameters_exposed_tf_keras(self):
        # tf_keras's optimizer ("LSO V3"): attributes read and set through.
        inner = test_util.tf_keras.optimizers.Adam(learning_rate=1.0,
                                                   beta_1=0.5, beta_2=0.9)
        opt = tf_lso.LossScaleOptimizer(inner)
        opt.learning_rate = tf.Variable(0.005)
        self.assertAllClose(opt.learning_rate, 0.005)
        self.assertIs(opt.learning_rate, inner.learning_rate)
        opt.use_ema = True
        self.assertTrue(opt.use_ema and inner.use_ema)
        opt.ema_momentum = 0.88
        self.assertEqual((opt.ema_momentum, inner.ema_momentum), (0.88, 0.88))

    def test_hyperparameters_exposed_legacy(self):
        inner = test_util.tf_keras.optimizers.legacy.Adam(
            learning_rate=1.0, beta_1=0.5, beta_2=0.9)
        opt = tf_lso.LossScaleOptimizer(inner)
        inner.lr  # noqa: B018 - creates the hyperparameter variables.
        self.assertEqual(float(opt.beta_1), 0.5)
        self.assertIsInstance(opt.beta_1, tf.Variable)
        self.assertIs(opt.lr, inner.lr)
        self.assertIs(opt.lr, opt.learning_rate)
        opt.beta_1 = 0.25
        self.assertEqual(float(inner.beta_1), 0.25)
        self.assertIs(opt.beta_1, inner.beta_1)
        inner.beta_1 = 0.75
        self.assertEqual(float(opt.beta_1), 0.75)
        opt.lr = 2.0
        self.assertEqual(float(inner.learning_rate), 2.0)

        class WithLossScale(test_util.tf_keras.optimizers.legacy.SGD):
            def __init__(self):
                super().__init__()
                self._set_hyper("loss_scale", 123.0)

        with self.assertRaises(AttributeError):
            tf_lso.LossScaleOptimizer(WithLossScale()).loss_scale = 2.0

    @_kinds()
    def test_arbitrary_attributes_not_exposed(self, kind):
        inner = _sgd(kind)
        opt = tf_lso.LossScaleOptimizer(inner)
        self.assertFalse(inner.nesterov)
        # Python's wording, with the object's class: around a tf_keras
        # optimizer tf_lso's class as tf_keras takes it (issue 50), as
        # tf_keras's own says 'LossScaleOptimizerV3' there.
        with self.assertRaisesRegex(
                AttributeError,
                f"'{type(opt).__name__}' object has no attribute 'nesterov'"):
            opt.nesterov  # noqa: B018 - the attribute read is the test.
        opt.nesterov = True
        self.assertTrue(opt.nesterov)
        self.assertFalse(inner.nesterov)

    @_kinds()
    def test_dir(self, kind):
        opt = tf_lso.LossScaleOptimizer(_sgd(kind))
        names = dir(opt)
        for name in ("learning_rate", "lr", "minimize", "loss_scale"):
            self.assertIn(name, names)
        self.assertNotIn("nesterov", names)
        self.assertIn("nesterov", dir(opt.inner_optimizer))

    @parameterized.named_parameters(
        (f"{kind}_{save}_{restore}", kind, save, restore) for kind in KINDS
        for save, restore in ((True, True), (True, False), (False, True)))
    def test_checkpoint(self, kind, save_with_ls, restore_with_ls):
        def make(with_ls):
            var = tf.Variable([2.0])
            inner = _sgd(kind, 1.0, momentum=1.0)
            inner.my_var = tf.Variable(0.0)  # Tracked by the optimizer.
            opt = inner
            if with_ls:
                opt = tf_lso.LossScaleOptimizer(inner, initial_scale=1.0,
                                                dynamic_growth_steps=2)
            return var, inner, opt

        def minimize(opt, var):
            # Keras 3 optimizers have no `minimize`.
            with tf.GradientTape() as tape:
                loss = var + 1.0
            opt.apply_gradients([(tape.gradient(loss, var), var)])

        var, inner, opt = make(save_with_ls)
        minimize(opt, var)
        self.assertAllEqual(var, [1.0])
        if save_with_ls:
            self.assertEqual(float(opt.loss_scale), 1.0)
            self.assertEqual(int(opt.dynamic_counter), 1)
        self.assertEqual(test_util.num(opt.iterations), 1)
        inner.my_var.assign(1.0)
        path = tf.train.Checkpoint(optimizer=opt, var=var).save(
            os.path.join(self.get_temp_dir(), "ckpt"))

        var, inner, opt = make(restore_with_ls)
        checkpoint = tf.train.Checkpoint(optimizer=opt, var=var)
        status = checkpoint.restore(path)
        if save_with_ls:
            status.assert_existing_objects_matched()
        else:
            status.assert_nontrivial_match()
        self.assertAllEqual(var, [1.0])
        if restore_with_ls:
            self.assertEqual(float(opt.loss_scale), 1.0)
            self.assertEqual(int(opt.dynamic_counter),
                             1 if save_with_ls else 0)
        self.assertEqual(test_util.num(opt.iterations), 1)
        minimize(opt, var)
        self.assertAllEqual(var, [-1.0])  # The momentum was restored.
        self.assertEqual(test_util.num(opt.iterations), 2)
        if kind != "tf_keras_legacy":  # OptimizerV2 does not track attributes.
            self.assertEqual(float(inner.my_var), 1.0)

    @parameterized.named_parameters(
        [(f"{scale}_{kind}", kind, scale == "dynamic")
         for scale in ("fixed", "dynamic") for kind in KINDS]
        + [("fixed_tf2_3", "tf2_3", False), ("dynamic_tf2_3", "tf2_3", True)]
    )
    def test_get_config(self, kind, dynamic):
        settings = ({"initial_scale": 2, "dynamic_growth_steps": 3} if dynamic
                    else {"dynamic": False, "initial_scale": 2})
        if kind == "tf2_3":
            loss_scale = ({"class_name": "DynamicLossScale", "config": {
                "initial_loss_scale": 2.0, "increment_period": 3,
                "multiplier": 2.0}} if dynamic else {
                "class_name": "FixedLossScale",
                "config": {"loss_scale_value": 2.0}})
            config = {"optimizer": {"class_name": "SGD", "config": {
                "learning_rate": 2.0, "momentum": 0.5, "decay": 0.0,
                "nesterov": False, "name": "SGD"}}, "loss_scale": loss_scale}
        else:
            config = tf_lso.LossScaleOptimizer(
                _sgd(kind, 2.0, momentum=0.5), **settings).get_config()
        opt = tf_lso.LossScaleOptimizer.from_config(config)
        self.assertEqual(float(opt.learning_rate), 2.0)
        self.assertEqual(float(opt.inner_optimizer.learning_rate), 2.0)
        self.assertEqual(float(opt.inner_optimizer.momentum), 0.5)
        self.assertEqual(float(opt.loss_scale), 2.0)
        self.assertEqual(opt.initial_scale, 2.0)
        self.assertEqual(opt.dynamic, dynamic)
        self.assertEqual(opt.dynamic_growth_steps, 3 if dynamic else None)
        var = tf.Variable([5.0])
        _grad_check_step(tf.distribute.get_strategy(), opt, var, 2.0)()
        self.assertAllEqual(var, [3.0])
        if dynamic:
            self.assertEqual(int(opt.dynamic_counter), 1)
        else:
            self.assertIsNone(opt.dynamic_counter)

    def test_from_config_with_invalid_multiplier(self):
        config = {
            "optimizer": {"class_name": "SGD", "config": {
                "learning_rate": 2.0, "momentum": 0.5, "decay": 0.0,
                "nesterov": False, "name": "SGD"}},
            "loss_scale": {"class_name": "DynamicLossScale", "config": {
                "initial_loss_scale": 2.0, "increment_period": 3,
                "multiplier": 4.0}},
        }
        with self.assertRaisesRegex(
                ValueError, "Cannot deserialize LossScaleOptimizer with a "
                "DynamicLossScale whose multiplier is not 2. Got "
                r"DynamicLossScale: DynamicLossScale\("):
            tf_lso.LossScaleOptimizer.from_config(config)

    @parameterized.named_parameters(
        (f"{kind}_{name}", kind, name) for kind in KINDS
        for name in ("LossScaleOptimizer", "LossScaleOptimizerV1"))
    def test_serialization_with_built_in_optimizer(self, kind, class_name):
        opt = tf_lso.LossScaleOptimizer(_sgd(kind, 2.0, momentum=0.5),
                                        initial_scale=2.0,
                                        dynamic_growth_steps=3.0)
        config = keras.optimizers.serialize(opt)
        config["class_name"] = class_name  # TF 2.4's older V1 name too.
        expected_type = type(opt)  # A subclass for tf_keras (issue 50).
        opt = keras.optimizers.deserialize(config)
        self.assertIs(type(opt), expected_type)
        self.assertIsInstance(opt, tf_lso.LossScaleOptimizer)
        self.assertEqual(float(opt.learning_rate), 2.0)
        self.assertEqual(float(opt.inner_optimizer.momentum), 0.5)
        self.assertEqual(float(opt.loss_scale), 2.0)
        self.assertEqual(opt.dynamic_growth_steps, 3)
        self.assertTrue(opt.dynamic)
        var = tf.Variable([5.0])
        _grad_check_step(tf.distribute.get_strategy(), opt, var, 2.0)()
        self.assertAllEqual(var, [3.0])
        self.assertEqual(int(opt.dynamic_counter), 1)

    @_kinds()
    def test_serialization_with_custom_optimizer(self, kind):
        class MySGD(type(_sgd(kind))):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.my_attribute = 123

        opt = tf_lso.LossScaleOptimizer(MySGD(2.0, momentum=0.5),
                                        initial_scale=2.0,
                                        dynamic_growth_steps=3.0)
        opt = keras.optimizers.deserialize(keras.optimizers.serialize(opt),
                                           custom_objects={"MySGD": MySGD})
        self.assertEqual(float(opt.learning_rate), 2.0)
        self.assertEqual(float(opt.inner_optimizer.momentum), 0.5)
        self.assertEqual(float(opt.loss_scale), 2.0)
        self.assertEqual(opt.dynamic_growth_steps, 3)
        self.assertEqual(opt.inner_optimizer.my_attribute, 123)

    @_kinds()
    def test_unsupported_strategy(self, kind):
        strategy = tf.distribute.experimental.CentralStorageStrategy()
        message = ("Loss scaling is not supported with the "
                   "tf.distribute.Strategy: CentralStorageStrategy. Try using "
                   "a different Strategy, e.g. a MirroredStrategy")
        with strategy.scope(), self.assertRaisesRegex(ValueError, message):
            tf_lso.LossScaleOptimizer(_sgd(kind))
        opt = tf_lso.LossScaleOptimizer(_sgd(kind))
        with strategy.scope():
            var = tf.Variable(1.0)
            with self.assertRaisesRegex(ValueError, message):
                strategy.run(lambda: opt.minimize(lambda: var * 2.0, [var]))

    @_kinds()
    def test_invalid_args_with_fixed_loss_scale(self, kind):
        with self.assertRaisesRegex(
                ValueError,
                '"initial_scale" must be specified if "dynamic" is False'):
            tf_lso.LossScaleOptimizer(_sgd(kind), dynamic=False)
        with self.assertRaisesRegex(
                ValueError, '"dynamic_growth_steps" must be None if "dynamic" '
                "is False, but got: 2"):
            tf_lso.LossScaleOptimizer(_sgd(kind), dynamic=False,
                                      initial_scale=1, dynamic_growth_steps=2)

    @_kinds()
    def test_dynamic_must_be_bool(self, kind):
        with self.assertRaisesRegex(
                TypeError, '"dynamic" argument to LossScaleOptimizer.__init__ '
                "must be a bool, but got: 'dynamic'"):
            tf_lso.LossScaleOptimizer(_sgd(kind), "dynamic")

    @_deliberate("\"You forgot to call\" warnings")
    def test_scaling_warning(self):
        # TF 2.9+ and tf_keras log it when apply_gradients comes before
        # get_scaled_loss and get_unscaled_gradients; TF 2.4 did not.
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD())
        with self.assertLogs(level="WARNING") as logs:
            opt.apply_gradients([(tf.constant(1.0), tf.Variable(1.0))])
        self.assertIn("You forgot to call", logs.output[0])

    @_kinds()
    def test_error_when_nesting(self, kind):
        opt = tf_lso.LossScaleOptimizer(_sgd(kind))
        with self.assertRaisesRegex(
                TypeError,
                "LossScaleOptimizer cannot wrap another LossScaleOptimizer"):
            tf_lso.LossScaleOptimizer(opt)

    @_kinds()
    def test_error_wrapping_same_optimizer_multiple_times(self, kind):
        inner = _sgd(kind)
        tf_lso.LossScaleOptimizer(inner)
        with self.assertRaisesRegex(
                ValueError,
                '"inner_optimizer" is already wrapped by a LossScaleOptimizer'):
            tf_lso.LossScaleOptimizer(inner)

    def test_error_when_wrapping_non_optimizer(self):
        with self.assertRaisesRegex(
                TypeError, '"inner_optimizer" must be an instance of '
                "`tf.keras.optimizers.Optimizer`.*but got: 1"):
            tf_lso.LossScaleOptimizer(1)

    @_deliberate("Wrapping a tf_keras optimizer")
    def test_error_when_one_class_wraps_the_other_kind(self):
        with self.assertRaises(TypeError):
            tf_lso.LossScaleOptimizer(test_util.tf_keras.optimizers.SGD())


def test_every_deliberate_difference_is_documented():
    rows = re.findall(r"^\| ([^|]+?) \|", MIGRATION.read_text(), re.M)
    assert _DELIBERATE
    for row in _DELIBERATE:
        assert row in rows, row


if __name__ == "__main__":
    tf.test.main()
