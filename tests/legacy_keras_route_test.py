"""The legacy-Keras route: `TF_USE_LEGACY_KERAS=1`, `tf.keras` is tf_keras.

These tests run only where `tf.keras` is tf_keras 2.x: the nox sessions
`legacy_keras` set `TF_USE_LEGACY_KERAS=1` before TensorFlow starts (the
README's test command runs them on the oldest and the newest pair).
Elsewhere they skip.
"""

import itertools
import os
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf_lso
from tf_lso._src import compat

import inner_kinds
import test_util

pytestmark = pytest.mark.skipif(
    not compat.tf_keras_is_tf_keras(),
    reason="tf.keras is Keras 3 here; run with TF_USE_LEGACY_KERAS=1 "
           "(nox -s legacy_keras).")

ROOT = pathlib.Path(__file__).parents[1]
EXAMPLES = ROOT / "examples" / "legacy"


@pytest.fixture(autouse=True)
def _uninstall():
    yield
    tf_lso.uninstall()
    tf.keras.mixed_precision.set_global_policy("float32")
    import keras

    keras.mixed_precision.set_global_policy("float32")


def _data(rows=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) / 3).astype("float32")


def _model():
    tf.keras.utils.set_random_seed(1)
    return tf.keras.Sequential([
        tf.keras.layers.Dense(4, activation="relu", input_shape=(3,)),
        tf.keras.layers.Dense(1),
        tf.keras.layers.Activation("linear", dtype="float32"),
    ])


def _fit(model, optimizer, epochs=2, **kwargs):
    x, y = _data()
    model.compile(optimizer, "mse")
    history = model.fit(x, y, batch_size=8, epochs=epochs, shuffle=False,
                        verbose=0, **kwargs)
    return history.history["loss"], [w.numpy() for w in model.weights]


def test_the_route_is_told_apart():
    import tf_keras

    assert tf.keras.Model is tf_keras.Model
    assert compat.tf_keras_is_tf_keras() is True


# -- 1. install() leaves what tf_keras has alone ---------------------------

def test_install_leaves_tf_keras_names_alone():
    tf_keras_lso = tf.keras.mixed_precision.LossScaleOptimizer
    assert tf_keras_lso.__module__.startswith("tf_keras.")
    tf_lso.install()
    assert tf.keras.mixed_precision.LossScaleOptimizer is tf_keras_lso
    from tensorflow.keras import mixed_precision

    assert mixed_precision.LossScaleOptimizer is tf_keras_lso
    # What tf_keras lacks is there.
    assert mixed_precision.experimental.LossScaleOptimizer is (
        tf_lso.experimental.LossScaleOptimizer)
    assert tf.mixed_precision.experimental.DynamicLossScale is (
        tf_lso.experimental.DynamicLossScale)
    opt = tf.keras.mixed_precision.LossScaleOptimizer(
        tf.keras.optimizers.SGD(0.1))
    assert isinstance(opt, tf_keras_lso)
    model = _model()
    model.compile(opt, "mse")  # Was: Could not interpret optimizer identifier.
    assert model.optimizer is opt
    tf_lso.uninstall()
    assert not hasattr(tf.keras.mixed_precision, "experimental")


# The TF 2.4 mixed precision guide's code, as tf_keras still runs it.
_GUIDE = """
import numpy as np
import tensorflow as tf
from tensorflow.keras import mixed_precision

mixed_precision.set_global_policy('mixed_float16')
tf.keras.utils.set_random_seed(0)
inputs = tf.keras.Input(shape=(16,))
x = tf.keras.layers.Dense(32, activation='relu')(inputs)
x = tf.keras.layers.Dense(1)(x)
outputs = tf.keras.layers.Activation('linear', dtype='float32')(x)
model = tf.keras.Model(inputs, outputs)
rng = np.random.default_rng(0)
x_train = rng.normal(size=(256, 16)).astype('float32')
y_train = x_train[:, :1] * 1e3
model.compile(loss='mse',
              optimizer=mixed_precision.LossScaleOptimizer(
                  tf.keras.optimizers.SGD(1e-4)))
history = model.fit(x_train, y_train, batch_size=32, epochs=2,
                    shuffle=False, verbose=0)
print('fit', [float(v) for v in history.history['loss']])

optimizer = mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(1e-4))
@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
        scaled_loss = optimizer.get_scaled_loss(loss)
    grads = optimizer.get_unscaled_gradients(
        tape.gradient(scaled_loss, model.trainable_variables))
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss
print('loop', [float(train_step(x_train[i:i + 32], y_train[i:i + 32]))
               for i in range(0, 256, 32)])
print('scale', float(optimizer.loss_scale), float(model.optimizer.loss_scale))
print('weights', [w.numpy().tolist() for w in model.weights])
print('compute', model.layers[1].compute_dtype)
"""


def _run_script(tmp_path, source, *prefix):
    script = tmp_path / "script.py"
    script.write_text(source)
    done = subprocess.run(
        [sys.executable, *prefix, str(script)], capture_output=True,
        text=True, timeout=300,
        env={**os.environ, "TF_USE_LEGACY_KERAS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_tf24_guide_runs_the_same_through_run(tmp_path):
    alone = _run_script(tmp_path, _GUIDE)
    through_run = _run_script(tmp_path, _GUIDE, "-m", "tf_lso", "run")
    assert "compute float16" in alone
    assert through_run == alone


# -- 2. The experimental policy drives tf_keras's --------------------------

def test_set_policy_makes_tf_keras_layers_compute_in_float16():
    tf_lso.install()
    mp = tf.keras.mixed_precision.experimental
    policy = mp.Policy("mixed_float16")
    mp.set_policy(policy)
    layer = tf.keras.layers.Dense(1)
    assert (layer.compute_dtype, layer.variable_dtype) == (
        "float16", "float32")
    assert layer(tf.ones((1, 2))).dtype == tf.float16
    assert tf.keras.mixed_precision.global_policy().name == "mixed_float16"
    assert mp.global_policy().name == "mixed_float16"
    assert mp.global_policy().loss_scale is not None
    assert mp.get_layer_policy(layer).name == "mixed_float16"
    mp.set_policy("float32")
    assert tf.keras.layers.Dense(1).compute_dtype == "float32"
    # tf_keras's own setter counts too.
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    assert mp.global_policy().name == "mixed_float16"


# -- 3. tf_lso's optimizers with tf_keras's compile/fit ---------------------

def _tf_keras_lso(**kwargs):
    return tf.keras.mixed_precision.LossScaleOptimizer(
        tf.keras.optimizers.SGD(0.05, momentum=0.5), **kwargs)


@pytest.mark.parametrize("experimental", [True, False])
@pytest.mark.parametrize("kind", inner_kinds.TF_KERAS_NAMES)
def test_compile_fit_bit_equal_to_tf_keras_class(experimental, kind):
    optimizers = inner_kinds.get(kind).optimizers()

    def sgd():
        return optimizers.SGD(0.05, momentum=0.5)

    tf_lso.install()
    tf.keras.mixed_precision.experimental.set_policy("mixed_float16")
    opt = (tf_lso.experimental.LossScaleOptimizer(sgd(), "dynamic")
           if experimental else tf_lso.LossScaleOptimizer(sgd()))
    losses, weights = _fit(_model(), opt)
    model_optimizer_state = (float(opt.loss_scale), int(opt.iterations))
    expected_losses, expected_weights = _fit(
        _model(), tf.keras.mixed_precision.LossScaleOptimizer(sgd()))
    assert losses == expected_losses
    for got, expected in zip(weights, expected_weights):
        np.testing.assert_array_equal(got, expected)
    assert model_optimizer_state == (32768.0, 8)


def test_compile_takes_tf_lso_optimizers_without_install():
    # Changing the imports (migration way 1; what `check --fix` writes)
    # needs no install(): wrapping a tf_keras optimizer is enough, as Keras
    # 3's compile takes tf_lso's Keras 3 classes with no hook at all.
    opt = tf_lso.experimental.LossScaleOptimizer(
        tf.keras.optimizers.SGD(0.05), "dynamic")
    model = _model()
    _fit(model, opt, epochs=1)
    assert model.optimizer is opt
    assert not hasattr(tf.keras.mixed_precision, "experimental")


def test_the_model_optimizer_is_the_users():
    tf_lso.install()
    opt = tf_lso.experimental.LossScaleOptimizer(
        tf.keras.optimizers.SGD(0.05), 64)
    model = _model()
    _fit(model, opt, epochs=1)
    assert model.optimizer is opt
    assert isinstance(model.optimizer,
                      tf.keras.mixed_precision.LossScaleOptimizer)
    assert float(model.optimizer.loss_scale()) == 64.0
    assert model.optimizer.iterations is opt.iterations
    assert int(model.optimizer.skipped_steps) == 0


def test_an_overflowing_batch_is_skipped_in_fit():
    tf_lso.install()
    x, y = _data()
    y_bad = y.copy()
    y_bad[2] = np.inf  # The first batch of 8.
    opt = tf_lso.LossScaleOptimizer(tf.keras.optimizers.SGD(0.05),
                                    initial_scale=8)
    model = _model()
    model.compile(opt, "mse")
    model.fit(x, y_bad, batch_size=8, shuffle=False, verbose=0)
    assert int(opt.skipped_steps) == 1
    assert float(opt.loss_scale) == 4.0
    reference = _model()
    reference.compile(tf.keras.optimizers.SGD(0.05), "mse")
    reference.fit(x[8:], y[8:], batch_size=8, shuffle=False, verbose=0)
    for got, expected in zip(model.weights, reference.weights):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("loss_scale, dynamic, scale", [
    ("auto", True, 32768.0), (128, False, 128.0), (None, False, 1.0)])
def test_compile_honours_the_policy_loss_scale(loss_scale, dynamic, scale):
    tf_lso.install()
    mp = tf.keras.mixed_precision.experimental
    mp.set_policy(mp.Policy("mixed_float16", loss_scale=loss_scale))
    model = _model()
    _fit(model, "sgd", epochs=1)
    optimizer = model.optimizer
    assert isinstance(optimizer, tf_lso.experimental.LossScaleOptimizer)
    assert optimizer.dynamic is dynamic
    assert float(optimizer.loss_scale()) == scale
    assert model.layers[0].compute_dtype == "float16"


def test_a_keras3_inner_optimizer_is_refused_with_what_to_do():
    import keras

    tf_lso.install()
    with pytest.raises(TypeError, match=r"tf_lso\.LossScaleOptimizer\("
                                        r"tf\.keras\.optimizers\.SGD"):
        _model().compile(tf_lso.LossScaleOptimizer(keras.optimizers.SGD()),
                         "mse")


def test_checkpoint_layout_is_tf_keras_lso(tmp_path):
    tf_lso.install()
    opt = tf_lso.LossScaleOptimizer(
        tf.keras.optimizers.legacy.SGD(0.05, momentum=0.5), initial_scale=8)
    model = _model()
    _fit(model, opt, epochs=1)
    reference = _model()
    _fit(reference, tf.keras.mixed_precision.LossScaleOptimizer(
        tf.keras.optimizers.legacy.SGD(0.05, momentum=0.5),
        initial_scale=8), epochs=1)

    def keys(m, tmp):
        prefix = tf.train.Checkpoint(model=m, optimizer=m.optimizer).save(tmp)
        return sorted(name for name, _ in tf.train.list_variables(prefix))

    assert keys(model, str(tmp_path / "a")) == keys(reference,
                                                     str(tmp_path / "b"))


@pytest.mark.parametrize("kind", inner_kinds.TF_KERAS_NAMES)
def test_model_save_and_load(tmp_path, kind):
    optimizers = inner_kinds.get(kind).optimizers()
    legacy_inner = kind == "tf_keras_legacy"
    tf_lso.install()
    opt = tf_lso.LossScaleOptimizer(optimizers.SGD(0.05, momentum=0.5),
                                    initial_scale=8)
    model = _model()
    _fit(model, opt, epochs=1)
    for path in (tmp_path / "m.h5", tmp_path / "saved_model"):
        model.save(str(path))
        loaded = tf.keras.models.load_model(str(path))
        assert type(loaded.optimizer) is type(model.optimizer)
        assert loaded.optimizer.get_config() == model.optimizer.get_config()
        for got, expected in zip(loaded.weights, model.weights):
            np.testing.assert_array_equal(got, expected)
        if path.suffix == ".h5":
            # HDF5 holds the inner optimizer's state (tf_keras's own class
            # around a new optimizer drops it), not the loss scale (as in
            # TF 2.x).
            assert int(loaded.optimizer.iterations) == 4
            for got, expected in zip(loaded.optimizer.get_weights(),
                                     opt.inner_optimizer.variables
                                     if not legacy_inner
                                     else opt.inner_optimizer.weights):
                np.testing.assert_array_equal(got, expected)


# -- The examples, unmodified -------------------------------------------------

_CHECK_COMPUTE = """
import runpy, sys
example = sys.argv[1]
sys.argv = sys.argv[1:]
globals_ = runpy.run_path(example, run_name="__main__")
model = globals_.get("model")
if model is not None:
    print("compute dtypes", sorted({layer.compute_dtype
                                    for layer in model.layers}))
"""


@pytest.mark.parametrize("example", sorted(
    p.name for p in EXAMPLES.glob("*.py")))
def test_legacy_examples_run_unmodified(tmp_path, example):
    script = tmp_path / "check.py"
    script.write_text(_CHECK_COMPUTE)
    done = subprocess.run(
        [sys.executable, "-m", "tf_lso", "run", str(script),
         str(EXAMPLES / example)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "TF_USE_LEGACY_KERAS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "result loss_scale" in done.stdout
    source = (EXAMPLES / example).read_text()
    if "set_policy" in source:
        assert "compute dtypes ['float16', 'float32']" in done.stdout


def test_mirrored_fit_skips_on_every_replica_as_tf_keras_class():
    # A NaN in one replica's half of the first batch: both replicas skip.
    strategy = test_util.mirrored_strategy()
    x, y = _data()
    y[6] = np.nan

    def fit(make_optimizer):
        with strategy.scope():
            model = _model()
            optimizer = make_optimizer()
            model.compile(optimizer, "mse")
        model.fit(x, y, batch_size=8, shuffle=False, verbose=0)
        return model, optimizer

    tf_lso.install()
    model, opt = fit(lambda: tf_lso.LossScaleOptimizer(
        tf.keras.optimizers.SGD(0.05, momentum=0.5), initial_scale=8))
    reference, ref_opt = fit(lambda: _tf_keras_lso(initial_scale=8))
    num = test_util.num
    assert num(opt.skipped_steps) == 1
    assert num(opt.loss_scale) == num(ref_opt.loss_scale) == 4.0
    assert num(opt.iterations) == num(ref_opt.iterations) == 4
    for got, expected in zip(model.weights, reference.weights):
        for replica_got, replica_expected in zip(
                strategy.experimental_local_results(got),
                strategy.experimental_local_results(expected)):
            np.testing.assert_array_equal(replica_got, replica_expected)


@pytest.mark.parametrize("kind", inner_kinds.TF_KERAS_NAMES)
def test_a_tf24_checkpoint_restores_into_a_compiled_model(tmp_path, kind):
    # TF 2.4's LossScaleOptimizer, as tf_keras keeps it, writes the file.
    optimizers = inner_kinds.get(kind).optimizers()
    x, y = _data()
    writer = _model()
    writer.compile(tf.keras.mixed_precision.LossScaleOptimizer(
        optimizers.SGD(0.05, momentum=0.5), initial_scale=8,
        dynamic_growth_steps=2), "mse")
    writer.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    prefix = tf.train.Checkpoint(model=writer,
                                 optimizer=writer.optimizer).save(
        str(tmp_path / "tf24"))
    tf_lso.install()
    reader = _model()
    opt = tf_lso.LossScaleOptimizer(optimizers.SGD(0.05, momentum=0.5),
                                    initial_scale=8, dynamic_growth_steps=2)
    reader.compile(opt, "mse")
    opt.build(reader.trainable_variables)
    status = tf.train.Checkpoint(model=reader,
                                 optimizer=reader.optimizer).restore(prefix)
    status.assert_consumed()
    assert float(opt.loss_scale) == float(writer.optimizer.loss_scale)
    assert int(opt.dynamic_counter) == int(writer.optimizer.dynamic_counter)
    assert int(opt.iterations) == int(writer.optimizer.iterations) == 4
    # Both train on alike.
    for model in (writer, reader):
        model.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    for got, expected in zip(reader.weights, writer.weights):
        np.testing.assert_array_equal(got, expected)
    assert float(opt.loss_scale) == float(writer.optimizer.loss_scale)


def test_a_nonfinite_loss_is_reported_through_the_face():
    # Issue 43's cause reaches tf_keras's fit: the face's minimize is the
    # tf_lso optimizer's, which sees the loss before scaling it.
    x, y = _data()
    y[2] = np.nan  # The first batch's loss.
    opt = tf_lso.LossScaleOptimizer(tf.keras.optimizers.SGD(0.05),
                                    initial_scale=8)
    model = _model()
    model.compile(opt, "mse")
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    assert opt.last_overflow.cause == "loss"
    assert int(opt.nonfinite_loss_steps) == int(opt.skipped_steps) == 1


def test_loss_scale_monitor_in_tf_keras_fit():
    x, y = _data()
    y[2] = np.inf  # The first batch overflows.
    opt = tf_lso.LossScaleOptimizer(tf.keras.optimizers.SGD(0.05),
                                    initial_scale=8)
    model = _model()
    model.compile(opt, "mse")
    logged = []
    history = model.fit(x, y, batch_size=8, shuffle=False, verbose=0,
                        callbacks=[
                            tf_lso.callbacks.LossScaleMonitor(update_freq=1),
                            tf.keras.callbacks.LambdaCallback(
                                on_train_batch_end=lambda batch, logs:
                                logged.append((logs["loss_scale"],
                                               logs["skipped_steps"])))])
    assert logged == [(4.0, 1), (4.0, 1), (4.0, 1), (4.0, 1)]
    assert history.history["loss_scale"] == [4.0]
    assert history.history["skipped_steps"] == [1]


# -- 4. model.optimizer is the optimizer passed (issue 50) --------------------

def _make(experimental, optimizers, **kwargs):
    sgd = optimizers.SGD(0.05, momentum=0.5)
    if experimental:
        return tf_lso.experimental.LossScaleOptimizer(
            sgd, kwargs.pop("loss_scale", "dynamic"))
    return tf_lso.LossScaleOptimizer(sgd, **kwargs)


@pytest.mark.parametrize("installed", [True, False])
@pytest.mark.parametrize("experimental", [True, False])
@pytest.mark.parametrize("kind", inner_kinds.TF_KERAS_NAMES)
def test_compile_keeps_the_optimizer_passed(installed, experimental, kind):
    if installed:
        tf_lso.install()
    opt = _make(experimental, inner_kinds.get(kind).optimizers())
    config = opt.get_config()
    model = _model()
    _fit(model, opt, epochs=1)
    assert model.optimizer is opt
    assert isinstance(model.optimizer, type(opt))
    assert isinstance(model.optimizer, tf_lso.LossScaleOptimizer)
    # tf_keras's own class too: its compile never wraps it again.
    assert isinstance(model.optimizer,
                      tf.keras.mixed_precision.LossScaleOptimizer)
    if installed and experimental:
        assert isinstance(
            model.optimizer,
            tf.keras.mixed_precision.experimental.LossScaleOptimizer)
    assert model.optimizer.get_config() == opt.get_config()
    assert config.keys() == opt.get_config().keys()
    assert int(opt.iterations) == 4


def test_the_policy_wrap_is_tf_lso_experimental_class():
    tf_lso.install()
    mp = tf.keras.mixed_precision.experimental
    mp.set_policy(mp.Policy("mixed_float16", loss_scale=128))
    model = _model()
    _fit(model, "sgd", epochs=1)
    assert isinstance(model.optimizer, mp.LossScaleOptimizer)
    assert type(model.optimizer.inner_optimizer) is type(
        tf.keras.optimizers.get("sgd"))
    expected = mp.LossScaleOptimizer(tf.keras.optimizers.get("sgd"), 128)
    assert model.optimizer.get_config() == expected.get_config()
    assert float(model.optimizer.loss_scale()) == 128.0



def test_a_recompile_keeps_the_wrapper_only_while_the_policy_does():
    # The one rule of both routes (compile_hook_test.py has Keras 3's): the
    # same optimizer recompiled keeps its wrapper while that wrapper's loss
    # scale is the policy's; under another loss scale it is not reused
    # (before, tf_keras's route kept it, silently ignoring the new scale).
    tf_lso.install()
    mp = tf.keras.mixed_precision.experimental
    mp.set_policy(mp.Policy("mixed_float16", loss_scale=128))
    inner = tf.keras.optimizers.SGD()
    model = _model()
    model.compile(inner, "mse")
    wrapper = model.optimizer
    assert isinstance(wrapper, mp.LossScaleOptimizer)
    assert wrapper.inner_optimizer is inner
    model.compile(inner, "mse")
    assert model.optimizer is wrapper
    mp.set_policy(mp.Policy("mixed_float16", loss_scale=256))
    with pytest.raises(ValueError, match="already wrapped"):
        model.compile(inner, "mse")
    assert float(model.optimizer.loss_scale()) == 128.0

@pytest.mark.parametrize("experimental", [True, False])
@pytest.mark.parametrize("kind", inner_kinds.TF_KERAS_NAMES)
def test_tf_keras_serialize_round_trip_trains_alike(experimental, kind):
    tf_lso.install()
    opt = _make(experimental, inner_kinds.get(kind).optimizers(),
                **({} if experimental else {"initial_scale": 8,
                                            "dynamic_growth_steps": 2}))
    config = tf.keras.optimizers.serialize(opt)
    clone = tf.keras.optimizers.deserialize(config)
    assert type(clone) is type(opt)
    assert clone.get_config() == opt.get_config()
    assert tf.keras.optimizers.serialize(clone) == config
    x, y = _data()
    y[2] = np.inf  # One skipped step: the loss scale state moves.
    runs = []
    for optimizer in (opt, clone):
        model = _model()
        model.compile(optimizer, "mse")
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        runs.append((model.get_weights(), float(optimizer.loss_scale),
                     int(optimizer.iterations)))
    for got, expected in zip(runs[1][0], runs[0][0]):
        np.testing.assert_array_equal(got, expected)
    assert runs[1][1:] == runs[0][1:]


_TF23_SGD = {"class_name": "SGD", "config": {
    "name": "SGD", "learning_rate": 0.05, "decay": 0.0, "momentum": 0.5,
    "nesterov": False}}


@pytest.mark.parametrize("tf23", [True, False])
def test_a_tf2x_config_builds_a_tf_keras_inner(tf23):
    tf_lso.install()
    if tf23:
        cls = tf.keras.mixed_precision.experimental.LossScaleOptimizer
        config = {"optimizer": _TF23_SGD, "loss_scale": {
            "class_name": "DynamicLossScale", "config": {
                "initial_loss_scale": 8.0, "increment_period": 2,
                "multiplier": 2.0}}}
    else:
        cls = tf_lso.LossScaleOptimizer
        config = {"inner_optimizer": _TF23_SGD, "dynamic": True,
                  "initial_scale": 8.0, "dynamic_growth_steps": 2}
    opt = cls.from_config(config)
    # As tf_keras's own class builds it from the same config.
    reference = type(tf.keras.mixed_precision.LossScaleOptimizer(
        tf.keras.optimizers.legacy.SGD())).from_config(config)
    assert type(opt.inner_optimizer) is type(reference.inner_optimizer)
    assert isinstance(opt.inner_optimizer, tf.keras.optimizers.legacy.SGD)
    x, y = _data()
    y[2] = np.inf
    runs = []
    for optimizer in (opt, reference):
        model = _model()
        model.compile(optimizer, "mse")
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        runs.append((model.get_weights(), float(optimizer.loss_scale()
                                                if callable(
                                                    optimizer.loss_scale)
                                                else optimizer.loss_scale)))
    for got, expected in zip(runs[0][0], runs[1][0]):
        np.testing.assert_array_equal(got, expected)
    assert runs[0][1] == runs[1][1]


def _loss_scale_state(optimizer):
    """The loss scale, its counter and `iterations`, of either class."""
    num = test_util.num
    if isinstance(optimizer, tf_lso.experimental.LossScaleOptimizer):
        return (num(optimizer.loss_scale()),
                num(optimizer.loss_scale._num_good_steps),
                num(optimizer.iterations))
    return (num(optimizer.loss_scale), num(optimizer.dynamic_counter),
            num(optimizer.iterations))


def _inner_variables(optimizer, strategy):
    """The inner optimizer's variables, per replica of `strategy`."""
    inner = optimizer.inner_optimizer
    variables = (inner.variables() if callable(inner.variables)
                 else inner.variables)
    return [value.numpy() for variable in variables
            for value in strategy.experimental_local_results(variable)]


def _resumed_from_keras_file(tmp_path, compiled, strategy=None):
    """(uninterrupted, resumed): two epochs of `compiled()`, and one epoch,
    a `.keras` round trip, then the second epoch; both with one step
    skipped in the first epoch (the loss scale state is not its initial)."""
    x, y = _data()
    y[10] = np.inf
    strategy = strategy or tf.distribute.get_strategy()

    def fit(model):
        model.fit(x, y, batch_size=8, shuffle=False, verbose=0)

    with strategy.scope():
        uninterrupted = compiled()
    fit(uninterrupted)
    fit(uninterrupted)
    with strategy.scope():
        model = compiled()
    fit(model)
    path = str(tmp_path / "m.keras")
    model.save(path)
    with strategy.scope():
        loaded = tf.keras.models.load_model(path)
    assert type(loaded.optimizer) is type(model.optimizer)
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    assert _loss_scale_state(loaded.optimizer) == _loss_scale_state(
        model.optimizer)
    if not isinstance(loaded.optimizer.inner_optimizer,
                      tf.keras.optimizers.legacy.Optimizer):
        # (A legacy optimizer's slots are loaded when it is built, at its
        # first step: tf_keras builds none on load.)
        _assert_same_inner_variables(loaded, model, strategy)
    fit(loaded)
    return uninterrupted, loaded


def _assert_same_inner_variables(model, reference, strategy):
    got = _inner_variables(model.optimizer, strategy)
    expected = _inner_variables(reference.optimizer, strategy)
    assert len(got) == len(expected)
    for got_value, expected_value in zip(got, expected):
        np.testing.assert_array_equal(got_value, expected_value)


def _assert_resumed_bit_equal(uninterrupted, resumed, strategy=None):
    assert _loss_scale_state(resumed.optimizer) == _loss_scale_state(
        uninterrupted.optimizer)
    _assert_same_inner_variables(resumed, uninterrupted,
                                 strategy or tf.distribute.get_strategy())
    for got_value, expected_value in zip(resumed.weights,
                                         uninterrupted.weights):
        np.testing.assert_array_equal(got_value, expected_value)


@pytest.mark.parametrize("experimental", [True, False])
@pytest.mark.parametrize("kind", inner_kinds.TF_KERAS_NAMES)
def test_keras_file_round_trip_resumes_bit_equal(tmp_path, experimental,
                                                  kind):
    tf_lso.install()
    optimizers = inner_kinds.get(kind).optimizers()

    def compiled():
        model = _model()
        if experimental:
            model.compile(tf_lso.experimental.LossScaleOptimizer(
                optimizers.SGD(0.05, momentum=0.5),
                tf_lso.experimental.DynamicLossScale(8, 3)), "mse")
        else:
            model.compile(tf_lso.LossScaleOptimizer(
                optimizers.SGD(0.05, momentum=0.5), initial_scale=8,
                dynamic_growth_steps=3), "mse")
        return model

    uninterrupted, resumed = _resumed_from_keras_file(tmp_path, compiled)
    _assert_resumed_bit_equal(uninterrupted, resumed)


@pytest.mark.parametrize("kind", inner_kinds.TF_KERAS_NAMES)
def test_keras_file_round_trip_of_the_policy_wrap(tmp_path, kind):
    # compile wraps the optimizer for a TF 2.1-2.3 Policy's loss scale.
    tf_lso.install()
    mp = tf.keras.mixed_precision.experimental
    mp.set_policy(mp.Policy("mixed_float16",
                            loss_scale=tf_lso.experimental.DynamicLossScale(
                                8, 3)))
    optimizers = inner_kinds.get(kind).optimizers()

    def compiled():
        model = _model()
        model.compile(optimizers.SGD(0.05, momentum=0.5), "mse")
        return model

    uninterrupted, resumed = _resumed_from_keras_file(tmp_path, compiled)
    assert isinstance(resumed.optimizer, mp.LossScaleOptimizer)
    assert resumed.layers[0].compute_dtype == "float16"
    _assert_resumed_bit_equal(uninterrupted, resumed)


@pytest.mark.parametrize("kind", inner_kinds.TF_KERAS_NAMES)
def test_keras_file_round_trip_under_mirrored_strategy(tmp_path, kind):
    # A legacy optimizer's slots are loaded at its first step, which runs
    # on both replicas: each replica's slots must be the file's.
    strategy = test_util.mirrored_strategy()
    tf_lso.install()
    optimizers = inner_kinds.get(kind).optimizers()

    def compiled():
        model = _model()
        model.compile(tf_lso.LossScaleOptimizer(
            optimizers.SGD(0.05, momentum=0.5), initial_scale=8,
            dynamic_growth_steps=3), "mse")
        return model

    uninterrupted, resumed = _resumed_from_keras_file(tmp_path, compiled,
                                                      strategy)
    _assert_resumed_bit_equal(uninterrupted, resumed, strategy)


def test_a_file_for_other_variables_skips_the_inner_state(tmp_path):
    tf_lso.install()
    optimizers = inner_kinds.get("tf_keras_legacy").optimizers()

    def compiled():
        model = _model()
        model.compile(tf_lso.LossScaleOptimizer(
            optimizers.SGD(0.05, momentum=0.5), initial_scale=8), "mse")
        return model

    model = compiled()
    model.fit(*_data(), batch_size=8, shuffle=False, verbose=0)
    path = str(tmp_path / "m.weights.h5")
    model.save_weights(path)
    other = compiled()
    other.optimizer.build(other.trainable_variables[:2])  # Built for less.
    with pytest.warns(UserWarning, match=(
            r"^Skipping loading the inner optimizer's state of optimizer "
            r"'\w+': the file holds 5 of its "
            r"variables but it has 3\.$")):
        other.load_weights(path)
    assert int(other.optimizer.iterations) == 0
    assert float(other.optimizer.loss_scale) == float(
        model.optimizer.loss_scale)


def _guarded_model(lso_class):
    # EfficientDet's (google/automl) train_step: the loss is scaled only if
    # the optimizer `compile` set is a loss scale optimizer.
    class Guarded(tf.keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compiled_loss(y, self(x, training=True))
                if isinstance(self.optimizer, lso_class):
                    scaled_loss = self.optimizer.get_scaled_loss(loss)
                else:
                    scaled_loss = loss
            grads = tape.gradient(scaled_loss, self.trainable_variables)
            if isinstance(self.optimizer, lso_class):
                grads = self.optimizer.get_unscaled_gradients(grads)
            self.optimizer.apply_gradients(
                zip(grads, self.trainable_variables))
            return {"loss": loss}

    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input(shape=(16,))
    hidden = tf.keras.layers.Dense(32, activation="relu")(inputs)
    hidden = tf.keras.layers.Dense(1)(hidden)
    outputs = tf.keras.layers.Activation("linear", dtype="float32")(hidden)
    return Guarded(inputs, outputs)


@pytest.mark.parametrize("how", ["experimental", "policy"])
def test_an_isinstance_guarded_train_step_scales_its_loss(how):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 16)).astype("float32")
    y = x[:, :1] * 1e3  # Gradients overflow float16 at a scale of 2**15.
    tf_lso.install()
    mp = tf.keras.mixed_precision.experimental
    if how == "policy":
        mp.set_policy(mp.Policy("mixed_float16", loss_scale="dynamic"))
    else:
        mp.set_policy("mixed_float16")
    model = _guarded_model(mp.LossScaleOptimizer)
    model.compile(
        "sgd" if how == "policy" else mp.LossScaleOptimizer(
            tf.keras.optimizers.SGD(), "dynamic"), "mse")
    history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False,
                        verbose=0)
    opt = model.optimizer
    assert isinstance(opt, mp.LossScaleOptimizer)
    assert int(opt.skipped_steps) > 0  # The loss was scaled.
    tf_lso.uninstall()
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    reference = _guarded_model(tf.keras.mixed_precision.LossScaleOptimizer)
    reference.compile(tf.keras.mixed_precision.LossScaleOptimizer(
        tf.keras.optimizers.SGD()), "mse")
    expected = reference.fit(x, y, batch_size=32, epochs=2, shuffle=False,
                             verbose=0)
    assert history.history["loss"] == expected.history["loss"]
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_array_equal(got, want)
    assert float(opt.loss_scale()) == float(
        reference.optimizer.loss_scale)


# -- 5. No tf_keras: one line that says what to install (issue 50) ------------

_NO_TF_KERAS = '''
import sys


class NoTfKeras:
    """As if tf_keras were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "tf_keras":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoTfKeras())
'''


@pytest.mark.parametrize("command", [
    ["-m", "tf_lso", "run", "script.py"],
    ["-c", "import tf_lso; tf_lso.install()"]])
def test_without_tf_keras_one_line_says_what_to_install(tmp_path, command):
    (tmp_path / "sitecustomize.py").write_text(_NO_TF_KERAS)
    (tmp_path / "script.py").write_text("print('ran')\n")
    done = subprocess.run(
        [sys.executable, *command], capture_output=True, text=True,
        timeout=300, cwd=tmp_path,
        env={**os.environ, "TF_USE_LEGACY_KERAS": "1",
             "PYTHONPATH": os.pathsep.join(
                 [str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    assert done.returncode == 1
    assert "ran" not in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    minor = ".".join(tf.__version__.split(".")[:2])
    assert (
        "TF_USE_LEGACY_KERAS=1 makes tf.keras tf_keras, which is not "
        "installed. Install it with `pip install 'tf_keras~="
        f"{minor}.0'`") in last, done.stderr[-2000:]
    if command[0] == "-m":
        assert done.stderr.strip() == "python -m tf_lso run: error: " + (
            done.stderr.strip().split("error: ", 1)[1])
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("suffix", [".h5", ".keras"])
def test_a_file_loads_in_a_new_process(tmp_path, suffix):
    # The classes tf_keras takes are made on first use; install() makes
    # them known to load_model in a process that made none yet.
    tf_lso.install()
    opt = tf_lso.experimental.LossScaleOptimizer(
        tf.keras.optimizers.SGD(0.05, momentum=0.5), 64)
    model = _model()
    _fit(model, opt, epochs=1)
    path = tmp_path / f"m{suffix}"
    model.save(str(path))
    out = _run_script(tmp_path, f"""
import tensorflow as tf
import tf_lso
tf_lso.install()
optimizer = tf.keras.models.load_model({str(path)!r}).optimizer
print(isinstance(optimizer, tf_lso.experimental.LossScaleOptimizer),
      float(optimizer.loss_scale()), int(optimizer.iterations))
print(optimizer.get_config())
""")
    assert out.splitlines()[0] == "True 64.0 4"
    assert out.splitlines()[1] == str(opt.get_config())


# -- 6. Nothing silently wrong, round 3 (issue 59) ---------------------------

def _inner_sgd(legacy, *args, **kwargs):
    optimizers = tf.keras.optimizers.legacy if legacy else tf.keras.optimizers
    return optimizers.SGD(*args, **kwargs)


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("experimental", [True, False])
def test_every_class_rebuilds_from_its_own_config(experimental, legacy):
    # The config checks TF 2.1-2.3 code runs: type(opt).from_config built
    # an object whose inner_optimizer raised AttributeError.
    tf_lso.install()
    inner = _inner_sgd(legacy, 2.0, momentum=0.5)
    if experimental:
        public = tf.keras.mixed_precision.experimental.LossScaleOptimizer
        opt = public(inner,
                     tf.mixed_precision.experimental.DynamicLossScale(2, 3))
        classes = {type(opt), public, tf_lso.experimental.LossScaleOptimizer}
    else:
        opt = tf_lso.LossScaleOptimizer(inner, initial_scale=2,
                                        dynamic_growth_steps=3)
        classes = {type(opt), tf_lso.LossScaleOptimizer}
    test_util.assert_rebuilds_alike(opt, classes)


@pytest.mark.parametrize("use_tf_function", [False, True])
@pytest.mark.parametrize("legacy", [False, True])
def test_a_wrapper_made_outside_the_scope_updates_its_state_once(
        legacy, use_tf_function):
    # TensorSpeech/TensorFlowTTS: variables and inner optimizer in the
    # scope, the wrapper outside. Two replicas; replica 1's loss is NaN on
    # the second step.
    tf_lso.install()
    strategy = test_util.mirrored_strategy()
    with strategy.scope():
        var = tf.Variable([1.0, 2.0], name="var")
        inner = _inner_sgd(legacy, 0.25)
    opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
        inner, tf.mixed_precision.experimental.DynamicLossScale(32768.0, 2))

    def replica_step(bad):
        x = tf.where(bad & (test_util.replica_id() > 0), float("nan"), 1.0)
        with tf.GradientTape() as tape:
            scaled = opt.get_scaled_loss(tf.reduce_sum(var * x))
        grads = opt.get_unscaled_gradients(tape.gradient(scaled, [var]))
        opt.apply_gradients(zip(grads, [var]))

    run = test_util.maybe_function(
        lambda bad: strategy.run(replica_step, args=(bad,)), use_tf_function)
    states = []
    for bad in (False, True, False, False):
        run(tf.constant(bad))
        states.append((float(opt.loss_scale()),
                       test_util.num(opt.dynamic_counter),
                       test_util.num(opt.iterations),
                       test_util.num(opt.skipped_steps),
                       test_util.local_values(strategy, var)[1].tolist()))
    # As one replica taking the summed gradient, 2.0 per element.
    assert states == [(32768.0, 1, 1, 0, [0.5, 1.5]),
                      (16384.0, 0, 2, 1, [0.5, 1.5]),
                      (16384.0, 1, 3, 1, [0.0, 1.0]),
                      (32768.0, 0, 4, 1, [-0.5, 0.5])]


@pytest.mark.parametrize("place", ["eager", "tf_function", "mirrored"])
@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("experimental", [True, False])
def test_apply_gradients_passes_its_name_in_the_place_of_name(
        experimental, legacy, place):
    # TensorFlowTTS's AdamWeightDecay takes a clip norm where tf.keras's
    # apply_gradients takes `name`; TF 2.4 passed `name` there, with each
    # replica's gradients (clipped, then summed by its super()).
    class ClippingSGD(type(_inner_sgd(legacy))):
        def apply_gradients(self, grads_and_vars, clip_norm=0.5, name=None):
            grads, variables = zip(*grads_and_vars)
            grads, _ = tf.clip_by_global_norm(grads, clip_norm)
            return super().apply_gradients(zip(grads, variables))

    strategy = test_util.STRATEGIES[
        "mirrored" if place == "mirrored" else "default"]()
    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        var = tf.Variable(5.0)
        inner = ClippingSGD(1.0)
        opt = (tf_lso.experimental.LossScaleOptimizer(inner, "dynamic")
               if experimental else
               tf_lso.LossScaleOptimizer(inner, initial_scale=4))
    # Each replica's gradient is 2.0 / replicas.
    step = test_util.maybe_function(
        lambda clip: strategy.run(lambda: opt.apply_gradients(
            [(tf.constant(2.0 / replicas), var)], clip)),
        place != "eager")
    step(1.0)
    assert test_util.local_values(strategy, var) == [
        5.0 - min(1.0, 2.0 / replicas) * replicas] * replicas
    step(None)  # No name: the override's default, 0.5.
    assert test_util.local_values(strategy, var) == [
        5.0 - min(1.0, 2.0 / replicas) * replicas - 0.5 * replicas
    ] * replicas


@pytest.mark.parametrize("experimental, legacy, place", [
    (True, False, "eager"), (True, True, "eager"), (False, False, "eager"),
    (False, True, "eager"), (True, False, "mirrored"),
    (False, True, "mirrored")])
def test_every_order_of_the_two_protocols(experimental, legacy, place):
    # get_scaled_loss or scale_loss, get_unscaled_gradients or not, apply
    # or apply_gradients: the true gradient is applied once, except where
    # TF 2.4's apply_gradients gets gradients of get_scaled_loss's loss that
    # were never unscaled (applied as given, with a LossScalingWarning).
    strategy = test_util.STRATEGIES[
        "mirrored" if place == "mirrored" else "default"]()
    replicas = strategy.num_replicas_in_sync
    for scale, unscale, apply in itertools.product(
            ("get_scaled_loss", "scale_loss"), (True, False),
            ("apply_gradients", "apply")):
        with strategy.scope():
            var = tf.Variable(1.0)
            inner = _inner_sgd(legacy, 0.25)
            opt = (tf_lso.experimental.LossScaleOptimizer(inner, 1024)
                   if experimental else
                   tf_lso.LossScaleOptimizer(inner, dynamic=False,
                                             initial_scale=1024))

        def step(opt=opt, var=var, scale=scale, unscale=unscale,
                 apply=apply):
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
            test_util.maybe_function(lambda step=step: strategy.run(step),
                                     place == "mirrored")()
        warned = any(issubclass(w.category, tf_lso.LossScalingWarning)
                     for w in record)
        never_unscaled = (scale, unscale, apply) == (
            "get_scaled_loss", False, "apply_gradients")
        gradient = 1024.0 if never_unscaled else 1.0
        assert test_util.local_values(strategy, var) == [
            1.0 - 0.25 * 2.0 * replicas * gradient] * replicas, (
            scale, unscale, apply)
        assert warned == never_unscaled, (scale, unscale, apply)
