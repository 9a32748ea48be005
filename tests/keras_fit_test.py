"""Keras 3 `compile`/`fit`, `.keras` files and SavedModel with tf_lso."""

import warnings

import keras
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import tf_lso

import inner_kinds
import test_util

RNG = np.random.default_rng(0)
X = RNG.normal(size=(64, 4)).astype("float32")
Y = RNG.normal(size=(64, 1)).astype("float32")


def _model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([
        keras.Input((4,)),
        keras.layers.Dense(8, activation="tanh"),
        keras.layers.Dense(1),
    ])


def _lso(kind, inner, **kwargs):
    if kind == "v1":
        return tf_lso.experimental.LossScaleOptimizer(
            inner, tf_lso.experimental.DynamicLossScale(
                kwargs.get("initial_scale", 2.0**15),
                kwargs.get("dynamic_growth_steps", 2000),
            )
        )
    return tf_lso.LossScaleOptimizer(inner, **kwargs)


def _fit(model, optimizer, x=X, y=Y, **compile_kwargs):
    model.compile(optimizer, "mse", **compile_kwargs)
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    return [w.numpy() for w in model.weights]


class LegacyStepModel(keras.Sequential):
    """A train_step written the TF 2.x way."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
            scaled_loss = self.optimizer.get_scaled_loss(loss)
        grads = tape.gradient(scaled_loss, self.trainable_variables)
        grads = self.optimizer.get_unscaled_gradients(grads)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


class CompileTest(parameterized.TestCase):
    @parameterized.parameters("v2", "v1")
    def test_compile_keeps_our_optimizer_under_mixed_float16(self, kind):
        keras.mixed_precision.set_global_policy("mixed_float16")
        try:
            model = _model()
            opt = _lso(kind, keras.optimizers.SGD(0.1))
            model.compile(opt, "mse", auto_scale_loss=True)
            self.assertIs(model.optimizer, opt)
            model.fit(X, Y, batch_size=16, verbose=0)
            self.assertIs(model.optimizer, opt)
            self.assertTrue(all(np.isfinite(w.numpy()).all()
                                for w in model.weights))
        finally:
            keras.mixed_precision.set_global_policy("float32")

    @parameterized.parameters(*inner_kinds.TF_KERAS_NAMES)
    def test_tf_keras_compile_keeps_it(self, kind):
        # docs/routes.md: tf_keras's compile takes only tf_keras optimizers;
        # tf_lso's optimizer around a tf_keras optimizer is one, and
        # compile keeps it (it said "Could not interpret optimizer
        # identifier" before issue 41, and kept a face in front before
        # issue 50).
        tf_keras = test_util.tf_keras
        inner = inner_kinds.make(kind, "Adam")
        model = tf_keras.Sequential(
            [tf_keras.layers.Dense(1, input_shape=(4,))]
        )
        opt = tf_lso.LossScaleOptimizer(inner)
        model.compile(opt, "mse")
        self.assertIs(model.optimizer, opt)
        self.assertIsInstance(model.optimizer,
                              tf_keras.mixed_precision.LossScaleOptimizer)
        model.fit(X, Y, batch_size=16, verbose=0)
        self.assertEqual(test_util.num(opt.iterations), 4)


class FitTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("graph", {}), ("jit", {"jit_compile": True}),
        ("no_jit", {"jit_compile": False}), ("eager", {"run_eagerly": True}),
    )
    def test_fit_matches_bare_optimizer(self, compile_kwargs):
        expected = _fit(_model(), keras.optimizers.Adam(0.01),
                        **compile_kwargs)
        for kind in ("v2", "v1"):
            opt = _lso(kind, keras.optimizers.Adam(0.01), initial_scale=256,
                       dynamic_growth_steps=3)
            actual = _fit(_model(), opt, **compile_kwargs)
            for a, e in zip(actual, expected):
                np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
            self.assertEqual(int(opt.skipped_steps), 0)
            self.assertEqual(float(opt.loss_scale), 256.0 * 2**2)  # 8 steps

    @parameterized.named_parameters(
        ("graph", {}), ("eager", {"run_eagerly": True}),
    )
    def test_legacy_train_step_matches_bare_optimizer(self, compile_kwargs):
        def model():
            keras.utils.set_random_seed(1)
            return LegacyStepModel([
                keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                keras.layers.Dense(1),
            ])

        expected = _fit(_model(), keras.optimizers.Adam(0.01),
                        **compile_kwargs)
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.Adam(0.01),
                                        initial_scale=256)
        actual = _fit(model(), opt, **compile_kwargs)
        for a, e in zip(actual, expected):
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)

    @parameterized.named_parameters(
        ("graph", {}), ("jit", {"jit_compile": True}),
        ("eager", {"run_eagerly": True}),
    )
    def test_overflowing_batch_is_skipped(self, compile_kwargs):
        y = Y.copy()
        y[16:32] = 3e38  # The second batch's loss overflows to inf.
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.05),
                                        initial_scale=1024)
        actual = _fit(_model(), opt, y=y, **compile_kwargs)
        # SGD ignores `iterations`, so a skipped batch is as if it were not
        # in the data at all.
        keep = np.r_[0:16, 32:64]
        model = _model()
        model.compile(keras.optimizers.SGD(0.05), "mse", **compile_kwargs)
        for _ in range(2):
            model.fit(X[keep], Y[keep], batch_size=16, shuffle=False,
                      verbose=0)
        for a, e in zip(actual, model.weights):
            np.testing.assert_allclose(a, e.numpy(), rtol=1e-5, atol=1e-6)
        self.assertEqual(int(opt.skipped_steps), 2)
        self.assertEqual(float(opt.loss_scale), 256.0)
        self.assertEqual(test_util.num(opt.iterations), 8)

    @parameterized.named_parameters(
        ("graph", {}), ("jit", {"jit_compile": True}),
        ("eager", {"run_eagerly": True}),
    )
    def test_moving_average_skips_with_the_step(self, compile_kwargs):
        # Keras 3's `use_ema`: the average moves with applied steps only,
        # and `fit` ends by writing it into the model
        # (`finalize_variable_values`, forwarded to the inner optimizer).
        def sgd():
            return keras.optimizers.SGD(0.05, momentum=0.9, use_ema=True,
                                        ema_momentum=0.5)

        y = Y.copy()
        y[16:32] = np.nan
        opt = tf_lso.LossScaleOptimizer(sgd(), initial_scale=64)
        actual = _fit(_model(), opt, y=y, **compile_kwargs)
        keep = np.r_[0:16, 32:64]
        expected = _fit(_model(), sgd(), x=X[keep], y=Y[keep],
                        **compile_kwargs)
        for a, e in zip(actual, expected):
            np.testing.assert_array_equal(a, e)
        self.assertEqual(int(opt.skipped_steps), 2)
        without_average = _fit(
            _model(), keras.optimizers.SGD(0.05, momentum=0.9),
            x=X[keep], y=Y[keep], **compile_kwargs)
        self.assertFalse(np.array_equal(expected[0], without_average[0]))

    @parameterized.parameters("v2", "v1")
    def test_steps_per_execution_changes_nothing(self, kind):
        # Keras runs several train steps in one call; each step still
        # decides on its own whether it is skipped.
        x = X.copy()
        x[20, 0] = np.nan  # The second batch's gradients are NaN.
        results = []
        for steps in (1, 3):
            opt = _lso(kind, keras.optimizers.Adam(0.01), initial_scale=1024,
                       dynamic_growth_steps=2)
            weights = _fit(_model(), opt, x=x, steps_per_execution=steps)
            results.append((weights, [v.numpy() for v in opt.variables],
                            float(opt.loss_scale), int(opt.skipped_steps),
                            test_util.num(opt.iterations)))
        (weights, slots, *state), (weights3, slots3, *state3) = results
        # Per epoch: finite, NaN (halves), finite, finite (doubles).
        self.assertEqual(state, [1024.0, 2, 8])
        self.assertEqual(state3, state)
        for actual, expected in zip(weights3 + slots3, weights + slots):
            np.testing.assert_array_equal(actual, expected)

    @parameterized.named_parameters(
        ("graph", {}), ("jit", {"jit_compile": True}),
    )
    def test_float8_scales_are_not_unscaled(self, compile_kwargs):
        # A float8 model keeps its scales and amax histories in variables
        # with `overwrite_with_gradient`: their "gradients" are new values.
        # (Keras's float8 layers fail under run_eagerly, with or without a
        # loss scale optimizer.)
        def fit(optimizer):
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input((4,)),
                                      keras.layers.Dense(8, name="a"),
                                      keras.layers.Dense(1, name="b")])
            with warnings.catch_warnings():  # "InputLayer ... quantize".
                warnings.simplefilter("ignore", UserWarning)
                model.quantize("float8")
            model.compile(optimizer, "mse", **compile_kwargs)
            model.fit(X[:16], Y[:16], batch_size=16, verbose=0)
            return {v.path.split("/", 1)[1]: v.numpy()  # "a/kernel_scale"
                    for v in model.variables
                    if getattr(v, "overwrite_with_gradient", False)}

        scale = 2.0**15
        actual = fit(tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1)))
        bare = fit(keras.optimizers.SGD(0.1))
        self.assertLen(actual, 12)
        for name, value in actual.items():
            if "outputs_grad" in name and "amax" in name:
                # The amax of the gradient that reached the layer: scaled.
                np.testing.assert_array_equal(value, bare[name] * scale)
            elif "outputs_grad" in name:
                np.testing.assert_array_equal(value, bare[name])
            else:  # Forward-pass scales: the loss scale plays no part.
                np.testing.assert_array_equal(value, bare[name], err_msg=name)

    def test_scale_never_underflows_after_many_overflows(self):
        # Keras 3's own LossScaleOptimizer halves without a floor: after
        # ~150 overflowing steps its scale is 0 and NaN reaches the weights.
        x = np.ones((200, 4), "float32")
        y = np.full((200, 1), 3e38, "float32")
        model = _model()
        initial = [w.numpy() for w in model.weights]
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        model.compile(opt, "mse")
        model.fit(x, y, batch_size=1, verbose=0)
        self.assertEqual(int(opt.skipped_steps), 200)
        self.assertEqual(float(opt.loss_scale), 1.0)
        for w, w0 in zip(model.weights, initial):
            np.testing.assert_array_equal(w.numpy(), w0)


class LossScaleMonitorTest(tf.test.TestCase):
    def test_history_and_tensorboard(self):
        y = Y.copy()
        y[16:32] = 3e38
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.05),
                                        initial_scale=1024)
        model = _model()
        model.compile(opt, "mse")
        log_dir = self.create_tempdir().full_path
        history = model.fit(
            X, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
            callbacks=[tf_lso.callbacks.LossScaleMonitor(),
                       keras.callbacks.TensorBoard(log_dir)],
        )
        self.assertEqual(history.history["loss_scale"], [512.0, 256.0])
        self.assertEqual(history.history["skipped_steps"], [1, 2])
        tags = set()
        for path in tf.io.gfile.glob(log_dir + "/train/*"):
            for event in tf.compat.v1.train.summary_iterator(path):
                tags.update(v.tag for v in event.summary.value)
        self.assertIn("epoch_loss_scale", tags)
        self.assertIn("epoch_skipped_steps", tags)
        self.assertIn("epoch_last_overflow_count", tags)
        # Each bad batch overflows in all four weights (two Dense layers).
        self.assertEqual(history.history["last_overflow_count"], [4, 4])

    def test_batch_frequency(self):
        logged = []
        model = _model()
        model.compile(tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.05),
                                                initial_scale=8,
                                                dynamic_growth_steps=1), "mse")
        model.fit(X, Y, batch_size=16, verbose=0, callbacks=[
            tf_lso.callbacks.LossScaleMonitor(update_freq=2),
            keras.callbacks.LambdaCallback(
                on_train_batch_end=lambda b, logs: logged.append(
                    logs.get("loss_scale"))),
        ])
        self.assertEqual(logged, [None, 32.0, None, 128.0])

    def test_errors(self):
        with self.assertRaisesRegex(ValueError, "update_freq"):
            tf_lso.callbacks.LossScaleMonitor(update_freq=0)
        model = _model()
        model.compile(keras.optimizers.SGD(0.1), "mse")
        with self.assertRaisesRegex(ValueError, "tf_lso optimizer"):
            model.fit(X, Y, verbose=0,
                      callbacks=[tf_lso.callbacks.LossScaleMonitor()])


class SavingTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters("v2", "v1")
    def test_keras_file_round_trip(self, kind):
        opt = _lso(kind, keras.optimizers.Adam(0.01), initial_scale=8,
                   dynamic_growth_steps=3)
        model = _model()
        _fit(model, opt)
        path = self.create_tempdir().full_path + "/m.keras"
        model.save(path)
        loaded = keras.models.load_model(path)
        new = loaded.optimizer
        self.assertIs(type(new), type(opt))
        self.assertEqual(new.get_config(), opt.get_config())
        for name in ("loss_scale", "dynamic_counter", "iterations"):
            self.assertEqual(test_util.num(getattr(new, name)),
                             test_util.num(getattr(opt, name)))
        self.assertEqual(float(new.loss_scale), 8.0 * 2**2)
        for a, b in zip(new.inner_optimizer.variables,
                        opt.inner_optimizer.variables):
            self.assertAllEqual(a, b)
        # Training continues exactly as it would have.
        model.fit(X, Y, batch_size=16, shuffle=False, verbose=0)
        loaded.fit(X, Y, batch_size=16, shuffle=False, verbose=0)
        for a, b in zip(loaded.weights, model.weights):
            self.assertAllEqual(a, b)
        self.assertEqual(float(new.loss_scale), float(opt.loss_scale))

    def test_fixed_scale_round_trip(self):
        model = _model()
        _fit(model, tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(0.1), dynamic=False, initial_scale=64))
        path = self.create_tempdir().full_path + "/m.keras"
        model.save(path)
        new = keras.models.load_model(path).optimizer
        self.assertFalse(new.dynamic)
        self.assertEqual(float(new.loss_scale), 64.0)

    @parameterized.parameters("v2", "v1")
    def test_h5_file_loads_weights_and_config(self, kind):
        # TF 2.4's test_save_model_with_dynamic_loss_scaling (h5 cases): the
        # weights, the optimizer's class and its config load. (A loss object:
        # Keras 3.15 cannot load "mse" from an HDF5 file.)
        opt = _lso(kind, keras.optimizers.SGD(0.1), initial_scale=1.0,
                   dynamic_growth_steps=2)
        model = _model()
        model.compile(opt, keras.losses.MeanSquaredError())
        model.fit(X, Y, batch_size=16, shuffle=False, verbose=0)
        path = self.create_tempdir().full_path + "/m.h5"
        model.save(path)
        loaded = keras.models.load_model(path)
        self.assertIs(type(loaded.optimizer), type(opt))
        self.assertEqual(loaded.optimizer.get_config(), opt.get_config())
        for a, b in zip(loaded.weights, model.weights):
            self.assertAllEqual(a, b)
        # Resuming needs a new optimizer (docs/migration.md): Keras 3's
        # HDF5 loader builds the optimizer with no variables, so `fit`
        # fails as it does for a bare Keras optimizer.
        bare = _model()
        bare.compile(keras.optimizers.SGD(0.1), keras.losses.MeanSquaredError())
        bare.fit(X, Y, batch_size=16, shuffle=False, verbose=0)
        bare.save(path)
        for resumed in (loaded, keras.models.load_model(path)):
            with self.assertRaises((ValueError, NotImplementedError)):
                resumed.fit(X, Y, batch_size=16, shuffle=False, verbose=0)
        resumed = keras.models.load_model(path, compile=False)
        resumed.compile(_lso(kind, keras.optimizers.SGD(0.1)), "mse")
        resumed.fit(X, Y, batch_size=16, shuffle=False, verbose=0)
        self.assertEqual(test_util.num(resumed.optimizer.iterations), 4)

    def test_saved_model(self):
        model = _model()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.Adam(0.01))
        _fit(model, opt)
        module = tf.Module()
        module.model = model
        module.optimizer = opt
        module.predict = tf.function(
            lambda x: model(x), input_signature=[tf.TensorSpec([None, 4])]
        )
        path = self.create_tempdir().full_path
        tf.saved_model.save(module, path)
        restored = tf.saved_model.load(path)
        self.assertAllClose(restored.predict(X[:3]), model(X[:3]))
        self.assertIn(
            "optimizer/loss_scale/current_loss_scale/.ATTRIBUTES/"
            "VARIABLE_VALUE",
            [n for n, _ in tf.train.list_variables(path + "/variables/variables")],
        )


if __name__ == "__main__":
    tf.test.main()
