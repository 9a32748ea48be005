"""Checkpoints: tf_lso's TF 2.3+ layout and every layout it restores."""

import gc

import h5py
import keras
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import tf_lso

import checkpoint_fixtures as fixtures
import inner_kinds
import test_util

NAN = float("nan")
INF = float("inf")

tf_keras = test_util.tf_keras

# Gradient multipliers per step: inf makes the step overflow.
FACTORS = (1.0, 1.0, np.inf, 1.0, 1.0, 1.0, np.inf, 1.0)


def _keys(path):
    return sorted(
        name for name, _ in tf.train.list_variables(path)
        if name.startswith("optimizer/") or ".OPTIMIZER_SLOT" in name
    )


def _state(model, opt):
    """Everything a resumed run must get back, as numpy values."""
    state = {
        "weights": [v.numpy().tolist() for v in model.variables],
        "iterations": test_util.num(opt.iterations),
    }
    if hasattr(opt, "loss_scale"):
        state["loss_scale"] = test_util.num(opt.loss_scale)
    if getattr(opt, "dynamic_counter", None) is not None:
        state["counter"] = test_util.num(opt.dynamic_counter)
    inner = opt.inner_optimizer if hasattr(opt, "inner_optimizer") else opt
    variables = inner.variables
    variables = variables() if callable(variables) else variables
    # Sorted: a legacy optimizer lists slots in creation order, which
    # differs when a restore creates them.
    # Legacy names get the optimizer's name scope when created in a step.
    scope = type(inner).__name__ + "/"
    state["optimizer"] = sorted(
        (v.name.removeprefix(scope), repr(np.asarray(v.numpy()).tolist()))
        for v in variables
    )
    return state


def _slots(opt, model, name):
    return [opt.get_slot(v, name).numpy() for v in model.variables]


class LayoutTest(tf.test.TestCase):
    def test_keras3_inner_is_saved_like_the_bare_inner_plus_loss_scale(self):
        _, lso_path = fixtures.train_and_save(
            self.create_tempdir().full_path,
            tf_lso.LossScaleOptimizer(keras.optimizers.Adam(0.1)),
        )
        _, bare_path = fixtures.train_and_save(
            self.create_tempdir().full_path, keras.optimizers.Adam(0.1)
        )
        self.assertEqual(
            _keys(lso_path),
            sorted(_keys(bare_path) + [
                ("optimizer/loss_scale/current_loss_scale/.ATTRIBUTES/"
                 "VARIABLE_VALUE"),
                "optimizer/loss_scale/good_steps/.ATTRIBUTES/VARIABLE_VALUE",
            ]),
        )

    def test_legacy_inner_is_saved_exactly_like_tf_keras(self):
        _, ours = fixtures.train_and_save(
            self.create_tempdir().full_path,
            tf_lso.LossScaleOptimizer(
                tf_keras.optimizers.legacy.SGD(0.1, momentum=0.9)
            ),
        )
        _, theirs = fixtures.train_and_save(
            self.create_tempdir().full_path,
            fixtures.tf_keras_lso(tf_keras.optimizers.legacy.SGD(0.1, 0.9)),
        )
        self.assertEqual(_keys(ours), _keys(theirs))
        self.assertIn("model/w/.OPTIMIZER_SLOT/optimizer/momentum/.ATTRIBUTES/"
                      "VARIABLE_VALUE", _keys(ours))

    def test_fixed_scale_has_no_loss_scale_node(self):
        _, path = fixtures.train_and_save(
            self.create_tempdir().full_path,
            tf_lso.LossScaleOptimizer(
                keras.optimizers.SGD(0.1), dynamic=False, initial_scale=8
            ),
        )
        self.assertFalse([k for k in _keys(path) if "loss_scale" in k])

    def test_tf2_2_fixture_has_tf2_2_layout(self):
        # Spec 2.7, as in TF's `lso_ckpt_tf2.2` test checkpoint.
        _, _, path = fixtures.tf2_2_checkpoint(self.create_tempdir().full_path)
        keys = _keys(path)
        for key in ("optimizer/base_optimizer/iter",
                    "optimizer/loss_scale/current_loss_scale",
                    "optimizer/loss_scale/good_steps",
                    "model/w/.OPTIMIZER_SLOT/optimizer/base_optimizer/momentum"):
            self.assertIn(key + "/.ATTRIBUTES/VARIABLE_VALUE", keys)

    def test_nothing_is_hidden_on_a_keras3_inner_optimizer(self):
        inner = keras.optimizers.SGD(0.1, momentum=0.9)
        opt = tf_lso.LossScaleOptimizer(inner)
        fixtures.train(fixtures.Linear(), opt)
        path = tf.train.Checkpoint(optimizer=inner).save(
            self.create_tempdir().full_path + "/inner"
        )
        self.assertFalse([k for k in _keys(path) if "loss_scale" in k])


class ResumeTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(
        (f"{kind}_adam_{mode}", kind, mode == "function")
        for kind in inner_kinds.names("keras", "tf_keras_legacy")
        for mode in ("eager", "function")
    )
    def test_resumed_run_is_bit_identical(self, kind, use_tf_function):
        def make():
            inner = inner_kinds.make(kind, "Adam", 0.01)
            return fixtures.Linear(), tf_lso.LossScaleOptimizer(
                inner, initial_scale=4, dynamic_growth_steps=2
            )

        model, opt = make()
        fixtures.train(model, opt, FACTORS, use_tf_function)
        expected = _state(model, opt)

        model, opt = make()
        fixtures.train(model, opt, FACTORS[:5], use_tf_function)
        # 4 -> (finite, finite) 8 -> (overflow) 4 -> (finite, finite) 8.
        self.assertEqual(test_util.num(opt.loss_scale), 8.0)
        manager = tf.train.CheckpointManager(
            tf.train.Checkpoint(model=model, optimizer=opt),
            self.create_tempdir().full_path, max_to_keep=1,
        )
        manager.save()
        model, opt = make()
        checkpoint = tf.train.Checkpoint(model=model, optimizer=opt)
        status = checkpoint.restore(manager.latest_checkpoint)
        fixtures.train(model, opt, FACTORS[5:], use_tf_function)
        status.assert_consumed()
        self.assertEqual(_state(model, opt), expected)

    def test_resume_under_mirrored_strategy(self):
        strategy = test_util.mirrored_strategy()

        def make():
            with strategy.scope():
                return fixtures.Linear(), tf_lso.LossScaleOptimizer(
                    keras.optimizers.SGD(0.1, momentum=0.9), initial_scale=4,
                    dynamic_growth_steps=2,
                )

        model, opt = make()
        fixtures.train(model, opt, FACTORS, True, strategy)
        expected = _state(model, opt)
        model, opt = make()
        fixtures.train(model, opt, FACTORS[:5], True, strategy)
        path = tf.train.Checkpoint(model=model, optimizer=opt).save(
            self.create_tempdir().full_path + "/ckpt"
        )
        model, opt = make()
        tf.train.Checkpoint(model=model, optimizer=opt).restore(path)
        fixtures.train(model, opt, FACTORS[5:], True, strategy)
        self.assertEqual(_state(model, opt), expected)


class QuietRestoreTest(tf.test.TestCase, parameterized.TestCase):
    """The restore pattern docs/keras.md shows: no false alarm, every slot.

    Restored into an optimizer that was never built, a checkpoint's slots
    wait for their variables; if the objects are deleted before a step
    creates them, TensorFlow warns "Value in checkpoint could not be found
    in the restored object" for each. Building the optimizer first restores
    every slot at once.
    """

    def _trained(self, kind):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                                  keras.layers.Dense(1)])
        opt = (tf_lso.LossScaleOptimizer(keras.optimizers.Adam(0.01),
                                         initial_scale=64)
               if kind == "v2" else tf_lso.experimental.LossScaleOptimizer(
                   keras.optimizers.Adam(0.01), "dynamic"))
        return model, opt

    @parameterized.parameters("v2", "v1")
    def test_build_then_restore_restores_every_slot_quietly(self, kind):
        model, opt = self._trained(kind)
        model.compile(opt, "mse")
        model.fit(np.ones((8, 4)), np.full((8, 1), 0.5), batch_size=4,
                  verbose=0)
        path = tf.train.Checkpoint(model=model, optimizer=opt).save(
            self.get_temp_dir() + "/ckpt")
        expected = [v.numpy() for v in opt.variables]
        self.assertLen(expected, 2 + 2 * 4)  # iterations, lr, m and v x 4.

        with self.assertNoLogs("tensorflow", level="WARNING"):
            restored_model, restored = self._trained(kind)
            restored.build(restored_model.trainable_variables)
            status = tf.train.Checkpoint(
                model=restored_model, optimizer=restored).restore(path)
            status.assert_consumed()
            for actual, value in zip(restored.variables, expected):
                self.assertAllEqual(actual, value)
            self.assertEqual(float(restored.loss_scale),
                             float(opt.loss_scale))
            del restored_model, restored, status
            gc.collect()


class KerasFormatCountersTest(tf.test.TestCase, parameterized.TestCase):
    """`.keras` and `.weights.h5` files (hence BackupAndRestore and
    ModelCheckpoint) hold `skipped_steps` too."""

    def _fit(self, kind="dynamic"):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        opt = tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(0.01),
            **({"initial_scale": 64} if kind == "dynamic" else
               {"dynamic": False, "initial_scale": 8}))
        model.compile(opt, "mse")
        y = np.ones((16, 1), "float32")
        y[4] = y[12] = 3e38  # Batches 1 and 3 overflow.
        model.fit(np.ones((16, 4)), y, batch_size=4, shuffle=False,
                  verbose=0)
        return model, opt

    @parameterized.parameters("keras", "weights.h5")
    def test_skipped_steps_survive(self, suffix):
        model, opt = self._fit()
        self.assertEqual(int(opt.skipped_steps.numpy()), 2)
        path = f"{self.get_temp_dir()}/model.{suffix}"
        if suffix == "keras":
            model.save(path)
            restored = keras.models.load_model(path).optimizer
        else:
            model.save_weights(path)
            new_model, restored = self._fit_free_copy()
            new_model.load_weights(path)
        self.assertEqual(int(restored.skipped_steps.numpy()), 2)
        self.assertEqual(float(restored.loss_scale), float(opt.loss_scale))
        self.assertEqual(int(restored.dynamic_counter.numpy()),
                         int(opt.dynamic_counter.numpy()))

    def _fit_free_copy(self):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.01),
                                        initial_scale=64)
        model.compile(opt, "mse")
        opt.build(model.trainable_variables)
        return model, opt

    def test_fixed_scale_keeps_its_count(self):
        model, opt = self._fit("fixed")
        path = f"{self.get_temp_dir()}/fixed.keras"
        model.save(path)
        restored = keras.models.load_model(path).optimizer
        self.assertEqual(int(restored.skipped_steps.numpy()), 0)
        self.assertEqual(float(restored.loss_scale), 8.0)

    def test_files_written_without_the_count_still_load(self):
        # tf_lso's earlier files held the loss scale's variables only.
        _, opt = self._fit_free_copy()
        opt.load_own_variables({"0": np.float32(16.0), "1": np.int64(3)})
        self.assertEqual(float(opt.loss_scale), 16.0)
        self.assertEqual(int(opt.dynamic_counter.numpy()), 3)
        self.assertEqual(int(opt.skipped_steps.numpy()), 0)


class LegacyLayoutTest(tf.test.TestCase, parameterized.TestCase):
    """Checkpoints written by tf_keras (TF 2.3/2.4 layout) and TF 2.2."""

    def _tf_keras_checkpoint(self, inner):
        opt = fixtures.tf_keras_lso(inner, initial_scale=4, growth_steps=2)
        model, path = fixtures.train_and_save(
            self.create_tempdir().full_path, opt, FACTORS[:5]
        )
        return path, model, opt

    def _expect_restored(self, model, opt, source_model, source):
        for var, source_var in zip(model.variables, source_model.variables):
            self.assertAllEqual(var, source_var)
        self.assertEqual(test_util.num(opt.loss_scale), 8.0)
        self.assertEqual(test_util.num(opt.loss_scale),
                         test_util.num(source.loss_scale))
        self.assertEqual(test_util.num(opt.dynamic_counter),
                         test_util.num(source.dynamic_counter))
        self.assertEqual(test_util.num(opt.iterations), 5)

    def test_tf_keras_checkpoint_into_tf_lso_with_legacy_inner(self):
        path, source_model, source = self._tf_keras_checkpoint(
            tf_keras.optimizers.legacy.SGD(0.1, momentum=0.9)
        )
        model = fixtures.Linear()
        opt = tf_lso.LossScaleOptimizer(
            tf_keras.optimizers.legacy.SGD(0.1, momentum=0.9),
            initial_scale=1, dynamic_growth_steps=2,
        )
        status = tf.train.Checkpoint(model=model, optimizer=opt).restore(path)
        opt.build(model.variables)  # Creates the slots: restored then.
        status.assert_consumed()
        self._expect_restored(model, opt, source_model, source)
        for var, source_var in zip(model.variables, source_model.variables):
            self.assertAllEqual(opt.get_slot(var, "momentum"),
                                source.get_slot(source_var, "momentum"))
        self.assertEqual(test_util.num(opt.learning_rate), np.float32(0.1))

    @parameterized.named_parameters(
        ("sgd", lambda: tf_keras.optimizers.legacy.SGD(0.1, momentum=0.9),
         lambda: keras.optimizers.SGD(0.5, momentum=0.9), {"momentum": 0}),
        ("adam", lambda: tf_keras.optimizers.legacy.Adam(0.1, amsgrad=True),
         lambda: keras.optimizers.Adam(0.5, amsgrad=True),
         {"m": 0, "v": 1, "vhat": 2}),
        ("rmsprop", lambda: tf_keras.optimizers.legacy.RMSprop(
            0.1, momentum=0.5, centered=True),
         lambda: keras.optimizers.RMSprop(0.5, momentum=0.5, centered=True),
         {"rms": 0, "momentum": 1, "mg": 2}),
    )
    def test_tf_keras_checkpoint_into_tf_lso_with_keras3_inner(
        self, legacy, new, slot_names
    ):
        path, source_model, source = self._tf_keras_checkpoint(legacy())
        for build_first in (True, False):
            model = fixtures.Linear()
            opt = tf_lso.LossScaleOptimizer(
                new(), initial_scale=1, dynamic_growth_steps=2
            )
            if build_first:
                opt.build(model.variables)
            status = tf.train.Checkpoint(model=model, optimizer=opt).restore(
                path
            )
            opt.build(model.variables)
            status.assert_existing_objects_matched()
            self._expect_restored(model, opt, source_model, source)
            self.assertEqual(test_util.num(opt.learning_rate), np.float32(0.1))
            for legacy_name in slot_names:
                expected = _slots(source, source_model, legacy_name)
                for var, value in zip(model.variables, expected):
                    self.assertAllEqual(
                        fixtures.keras3_slot(opt.inner_optimizer, var,
                                             legacy_name), value)

    def test_tf_lso_checkpoint_into_tf_keras(self):
        opt = tf_lso.LossScaleOptimizer(
            tf_keras.optimizers.legacy.SGD(0.1, momentum=0.9),
            initial_scale=4, dynamic_growth_steps=2,
        )
        _, path = fixtures.train_and_save(
            self.create_tempdir().full_path, opt, FACTORS[:5]
        )
        restored_model = fixtures.Linear()
        theirs = fixtures.tf_keras_lso(
            tf_keras.optimizers.legacy.SGD(0.1, momentum=0.9)
        )
        status = tf.train.Checkpoint(
            model=restored_model, optimizer=theirs
        ).restore(path)
        fixtures.train(restored_model, theirs, [0.0])
        status.assert_consumed()
        self.assertEqual(float(theirs.loss_scale), float(opt.loss_scale))
        self.assertEqual(int(theirs.dynamic_counter), 1)

    @parameterized.named_parameters(
        (f"{kind}_inner",
         lambda kind=kind: inner_kinds.sgd(kind, 0.1, momentum=0.9))
        for kind in inner_kinds.names("tf_keras_legacy", "keras")
    )
    def test_tf2_2_checkpoint(self, make_inner):
        source_model, source, path = fixtures.tf2_2_checkpoint(
            self.create_tempdir().full_path
        )
        model = fixtures.Linear()
        opt = tf_lso.LossScaleOptimizer(make_inner())
        status = tf.train.Checkpoint(model=model, optimizer=opt).restore(path)
        opt.build(model.variables)
        status.assert_existing_objects_matched()
        self.assertEqual(test_util.num(opt.loss_scale), 32768.0)
        self.assertEqual(test_util.num(opt.dynamic_counter), 1)
        self.assertEqual(test_util.num(opt.iterations), 1)
        for var, source_var in zip(model.variables, source_model.variables):
            self.assertAllEqual(
                fixtures.keras3_slot(opt.inner_optimizer, var, "momentum")
                if isinstance(opt.inner_optimizer, keras.optimizers.Optimizer)
                else opt.get_slot(var, "momentum"),
                source.get_slot(source_var, "momentum"),
            )


class KerasLossScaleOptimizerLayoutTest(tf.test.TestCase):
    def test_keras3_lso_checkpoint_into_tf_lso(self):
        source = keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.25, momentum=0.9), initial_scale=4.0,
            dynamic_growth_steps=2,
        )
        source_model, path = fixtures.train_and_save(
            self.create_tempdir().full_path, source, FACTORS[:5]
        )
        model = fixtures.Linear()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.5, 0.9))
        tf.train.Checkpoint(model=model, optimizer=opt).restore(
            path
        ).assert_existing_objects_matched()
        opt.build(model.variables)
        self.assertEqual(test_util.num(opt.loss_scale),
                         test_util.num(source.dynamic_scale))
        self.assertEqual(test_util.num(opt.dynamic_counter),
                         test_util.num(source.step_counter))
        # Keras 3's class does not count skipped steps: 4 of 5. (Its own
        # `iterations` reads the inner optimizer's from Keras 3.9 on; 3.8's
        # reads the wrapper's, which stays 0.)
        self.assertEqual(test_util.num(opt.iterations), 4)
        self.assertEqual(test_util.num(source.inner_optimizer.iterations), 4)
        self.assertEqual(test_util.num(opt.learning_rate), 0.25)
        self.assertEqual(_state(model, opt)["optimizer"],
                         _state(source_model, source.inner_optimizer)
                         ["optimizer"])


class CrossRestoreTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(
        (kind, lambda kind=kind: inner_kinds.sgd(kind, 0.1, momentum=0.9))
        for kind in inner_kinds.names("keras", "tf_keras_legacy")
    )
    def test_lso_checkpoint_into_plain_optimizer(self, make_inner):
        opt = tf_lso.LossScaleOptimizer(make_inner(), initial_scale=4)
        model, path = fixtures.train_and_save(
            self.create_tempdir().full_path, opt, FACTORS[:3]
        )
        plain_model, plain = fixtures.Linear(), make_inner()
        status = tf.train.Checkpoint(
            model=plain_model, optimizer=plain
        ).restore(path).expect_partial()
        fixtures.build(plain, plain_model.variables)
        status.assert_existing_objects_matched()
        self.assertEqual(test_util.num(plain.iterations), 3)
        self.assertEqual(_state(plain_model, plain)["optimizer"],
                         _state(model, opt)["optimizer"])

    @parameterized.named_parameters(
        (kind, lambda kind=kind: inner_kinds.sgd(kind, 0.1, momentum=0.9))
        for kind in inner_kinds.names("keras", "tf_keras_legacy")
    )
    def test_plain_checkpoint_into_lso(self, make_inner):
        plain = make_inner()
        model, path = fixtures.train_and_save(
            self.create_tempdir().full_path, plain, FACTORS[:2]
        )
        restored = fixtures.Linear()
        opt = tf_lso.LossScaleOptimizer(make_inner(), initial_scale=4)
        status = tf.train.Checkpoint(model=restored, optimizer=opt).restore(
            path
        )
        opt.build(restored.variables)
        # The loss scale is not in the checkpoint, so not everything matches.
        status.assert_nontrivial_match()
        self.assertEqual(test_util.num(opt.loss_scale), 4.0)
        self.assertEqual(test_util.num(opt.dynamic_counter), 0)
        self.assertEqual(test_util.num(opt.iterations), 2)
        self.assertEqual(_state(restored, opt)["optimizer"],
                         _state(model, plain)["optimizer"])


class CorruptScaleTest(tf.test.TestCase, parameterized.TestCase):
    """A checkpoint whose loss scale is not a usable number."""

    def _restored(self, value):
        """A fresh optimizer and variable restored from a scale of `value`."""
        var = tf.Variable(1.0)
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                        initial_scale=8, dynamic_growth_steps=2)
        opt.apply_gradients([(tf.constant(0.5), var)])
        opt._loss_scale.current_loss_scale.assign(value)
        path = tf.train.Checkpoint(opt=opt, var=var).save(
            self.create_tempdir().full_path + "/ckpt")
        var = tf.Variable(0.0)
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0),
                                        initial_scale=8, dynamic_growth_steps=2)
        tf.train.Checkpoint(opt=opt, var=var).restore(path).assert_consumed()
        return opt, var

    def _step(self, opt, var, mode):
        def step():
            with tf.GradientTape() as tape:
                loss = opt.get_scaled_loss(var * 0.25)
            grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
            opt.apply_gradients(zip(grads, [var]))

        if mode != "eager":
            step = tf.function(step, jit_compile=mode == "jit")
        step()

    def _state(self, opt, var):
        return [float(var), float(opt.loss_scale),
                test_util.num(opt.dynamic_counter),
                test_util.num(opt.iterations)]

    @parameterized.product(value=[NAN, INF, 0.0, -4.0],
                           mode=["eager", "tf_function"])
    def test_unusable_scale_raises_on_the_first_apply(self, value, mode):
        # NaN, inf (also what a value above float32's maximum becomes), 0 and
        # negative values: none is a loss scale.
        opt, var = self._restored(value)
        before = self._state(opt, var)
        error = ValueError if mode == "eager" else tf.errors.InvalidArgumentError
        with self.assertRaisesRegex(error, "corrupt checkpoint"):
            self._step(opt, var, mode)
        if mode == "eager":
            message = self._message(opt, var)
            self.assertIn(f"The loss scale is {value}", message)
            self.assertIn("must be positive and finite", message)
        # Nothing changed: the error came before any update.
        self.assertAllEqual(self._state(opt, var), before)

    def _message(self, opt, var):
        try:
            self._step(opt, var, "eager")
        except ValueError as e:
            return str(e)
        return ""

    @parameterized.parameters(NAN, INF, 0.0, -4.0)
    def test_unusable_scale_restarts_under_xla(self, value):
        # XLA drops assertions: the step is skipped and the scale restarts
        # from its initial value, so training goes on.
        opt, var = self._restored(value)
        self._step(opt, var, "jit")
        self.assertEqual(self._state(opt, var), [0.5, 8.0, 0, 2])
        self._step(opt, var, "jit")
        self.assertEqual(self._state(opt, var), [0.25, 8.0, 1, 3])

    @parameterized.named_parameters(
        # TensorFlow's own errors, pinned rather than wrapped (tf_lso is not
        # on the path of `restore`); docs/keras.md explains both. Neither
        # names the file.
        ("data", ".data-00000-of-00001", IndexError,
         "Read less bytes than requested"),
        ("index", ".index", tf.errors.OpError,
         r"not an sstable \(bad magic number\)"),
    )
    def test_truncated_checkpoint_file_is_tensorflows_error(
            self, suffix, error, message):
        var = tf.Variable(1.0)
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.Adam(0.1))
        opt.apply_gradients([(tf.constant(0.5), var)])
        path = tf.train.Checkpoint(opt=opt, var=var).save(
            self.create_tempdir().full_path + "/ckpt")
        with open(path + suffix, "rb") as f:
            content = f.read()
        with open(path + suffix, "wb") as f:
            f.write(content[: len(content) // 2])
        with self.assertRaisesRegex(error, message):
            tf.train.Checkpoint(opt=opt, var=var).restore(path)


class InnerKindTest(tf.test.TestCase, parameterized.TestCase):
    """State written around one kind of inner optimizer, read around
    another."""

    def _model(self, inner):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(tf_lso.LossScaleOptimizer(inner, initial_scale=64),
                      "mse")
        model.fit(np.ones((4, 4)), np.ones((4, 1)), verbose=0)
        return model

    @parameterized.parameters(
        # Fewer variables (Keras alone would warn and skip) and as many
        # (Keras alone would load Adam's slots into Adamax's, silently).
        lambda: keras.optimizers.SGD(0.1, momentum=0.9),
        lambda: keras.optimizers.Adamax(0.1),
    )
    def test_keras_file_names_both_kinds(self, make_inner):
        path = f"{self.get_temp_dir()}/adam.weights.h5"
        model = self._model(keras.optimizers.Adam(0.1))
        model.optimizer._loss_scale.current_loss_scale.assign(512.0)
        model.save_weights(path)
        other = self._model(make_inner())
        kind = type(other.optimizer.inner_optimizer).__name__
        with self.assertRaisesRegex(
                ValueError, "written by a loss scale optimizer around Adam, "
                f"and this one is around {kind}"):
            other.load_weights(path)
        # The loss scale state was not loaded.
        self.assertEqual(float(other.optimizer.loss_scale), 64.0)

    def test_keras_file_of_the_same_kind_loads(self):
        path = f"{self.get_temp_dir()}/adam.weights.h5"
        model = self._model(keras.optimizers.Adam(0.1))
        model.optimizer._loss_scale.current_loss_scale.assign(512.0)
        model.save_weights(path)
        other = self._model(keras.optimizers.Adam(0.5))
        other.load_weights(path)
        self.assertEqual(float(other.optimizer.loss_scale), 512.0)
        for got, want in zip(other.optimizer.variables,
                             model.optimizer.variables):
            self.assertAllEqual(got, want)

    def test_tf_checkpoint_with_other_variables_fails_assert_consumed(self):
        # TF 2.4's checkpoint layout has no room for the inner kind, and
        # Keras 3 numbers the inner optimizer's variables: when the counts
        # differ, `assert_consumed` names the one left over (docs/keras.md).
        var = tf.Variable([1.0, 2.0])
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.Adam(0.1))
        opt.apply_gradients([(tf.constant([0.5, 0.5]), var)])
        path = tf.train.Checkpoint(opt=opt, var=var).save(
            self.create_tempdir().full_path + "/ckpt")
        other = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        other.build([var])
        status = tf.train.Checkpoint(opt=other, var=var).restore(path)
        with self.assertRaisesRegex(
                AssertionError,
                r"(?s)Unresolved object in checkpoint.*full_name: \"adam"):
            status.assert_consumed()


class KerasFileCorruptScaleTest(tf.test.TestCase, parameterized.TestCase):
    """A `.keras` or `.weights.h5` file with unusable loss scale state."""

    @parameterized.named_parameters(
        ("nan_scale", {"0": NAN}, "loss scale .*nan"),
        ("inf_scale", {"0": INF}, "loss scale .*inf"),
        ("huge_scale", {"0": 1e39}, "loss scale .*inf"),
        ("zero_scale", {"0": 0.0}, "loss scale .*0.0"),
        ("negative_scale", {"0": -2.0}, "loss scale .*-2.0"),
        ("negative_counter", {"1": -1}, "good_steps .*-1"),
        ("negative_skipped_steps", {"2": -5}, "skipped_steps .*-5"),
    )
    def test_load_names_the_bad_value(self, values, message):
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1),
                                        initial_scale=64)
        store = {"0": np.float32(64.0), "1": np.int64(0), "2": np.int64(0)}
        store.update({k: np.asarray(v) for k, v in values.items()})
        with self.assertRaisesRegex(ValueError, message):
            opt.load_own_variables(store)
        # Nothing was assigned.
        self.assertEqual(float(opt.loss_scale), 64.0)
        self.assertEqual(int(opt.dynamic_counter.numpy()), 0)
        self.assertEqual(int(opt.skipped_steps.numpy()), 0)

    def test_damaged_weights_file_fails_to_load(self):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
                      "mse")
        model.fit(np.ones((4, 4)), np.ones((4, 1)), verbose=0)
        path = f"{self.get_temp_dir()}/damaged.weights.h5"
        model.save_weights(path)
        with h5py.File(path, "r+") as f:
            f["optimizer/vars/0"][()] = np.float32("nan")
        # Keras gathers the error and raises it when the rest has loaded.
        with self.assertRaisesRegex(
                ValueError, "current_loss_scale is nan, which must be "
                "positive and finite"):
            model.load_weights(path)
        self.assertEqual(float(model.optimizer.loss_scale), 32768.0)


class SavedModelTest(tf.test.TestCase, parameterized.TestCase):
    """`tf.saved_model.save` of a traced training step, then loading it."""

    @parameterized.product(kind=inner_kinds.names("keras", "tf_keras_legacy"),
                           cls=["LossScaleOptimizer", "experimental"])
    def test_exported_training_step_trains_and_skips(self, kind, cls):
        # A step that captures the optimizer's state exports only if every
        # variable it captures is tracked, skipped_steps and the overflow
        # record included (they are not in checkpoints, whose layout stays
        # TF 2.4's). Bare Keras 3 and tf_keras optimizers export.
        inner = inner_kinds.sgd(kind, 0.5)
        if cls == "experimental":
            opt = tf_lso.experimental.LossScaleOptimizer(
                inner, tf_lso.experimental.DynamicLossScale(8.0, 1))
        else:
            opt = tf_lso.LossScaleOptimizer(inner, initial_scale=8.0,
                                            dynamic_growth_steps=1)
        module = tf.Module()
        module.var = tf.Variable([1.0, 2.0])
        module.opt = opt

        @tf.function(input_signature=[tf.TensorSpec([2], tf.float32)])
        def train(grad):
            scaled = tf.convert_to_tensor(opt.loss_scale) * grad
            grads = opt.get_unscaled_gradients([scaled])
            opt.apply_gradients(zip(grads, [module.var]))
            return module.var.read_value()

        module.train = train
        self.assertAllEqual(train(tf.constant([1.0, 1.0])), [0.5, 1.5])
        path = self.get_temp_dir()
        tf.saved_model.save(module, path)
        # Saving added nothing to the TF 2.4 checkpoint layout.
        checkpoint_path = tf.train.Checkpoint(optimizer=opt).save(
            self.get_temp_dir() + "/ckpt")
        self.assertEmpty([k for k in _keys(checkpoint_path)
                          if "overflow" in k or "skipped" in k])

        loaded = tf.saved_model.load(path)
        self.assertAllEqual(loaded.train(tf.constant([1.0, 1.0])), [0.0, 1.0])
        self.assertAllEqual(loaded.train(tf.constant([INF, 1.0])), [0.0, 1.0])
        self.assertAllEqual(loaded.train(tf.constant([2.0, 2.0])),
                            [-1.0, 0.0])
        # The original optimizer is untouched by the loaded copy's steps.
        self.assertAllEqual(module.var, [0.5, 1.5])
        self.assertEqual(test_util.num(opt.skipped_steps), 0)


if __name__ == "__main__":
    tf.test.main()
