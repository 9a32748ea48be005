"""Tests for tf_lso._src.legacy_api.install and `python -m tf_lso run`."""

import importlib
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_lso
from tf_lso import __main__ as cli
from tf_lso._src import compat
from tf_lso._src.legacy_api import install as install_lib

KERAS_LSO = keras.optimizers.LossScaleOptimizer


@pytest.fixture(autouse=True)
def _uninstall():
    yield
    tf_lso.uninstall()
    keras.mixed_precision.set_global_policy("float32")


def _snapshot():
    return (
        getattr(tf, "mixed_precision", None),
        dict(vars(tf.train.experimental)),
        dict(vars(tf.keras.mixed_precision)),
        dict(vars(keras.mixed_precision)),
        {k: v for k, v in sys.modules.items() if "mixed_precision" in k},
        vars(compat.keras_compile_owner()).get("compile"),
    )


def test_names_resolve_to_tf_lso():
    tf_lso.install()
    experimental = tf.keras.mixed_precision.experimental
    assert experimental.LossScaleOptimizer is (
        tf_lso.experimental.LossScaleOptimizer)
    for name in ("Policy", "set_policy", "global_policy", "get_layer_policy",
                 "LossScale", "FixedLossScale", "DynamicLossScale"):
        assert getattr(experimental, name) is getattr(tf_lso.experimental,
                                                      name)
    for module in (tf.mixed_precision.experimental, tf.train.experimental):
        for name in ("LossScale", "FixedLossScale", "DynamicLossScale"):
            assert getattr(module, name) is getattr(tf_lso.experimental, name)
    assert tf.keras.mixed_precision.LossScaleOptimizer is (
        tf_lso.LossScaleOptimizer)
    # The one table that `check --fix` rewrites, too: loss scale helpers
    # (get, serialize, deserialize) included.
    assert sorted(install_lib.installed_names()) == sorted(
        [f"tf.keras.mixed_precision.experimental.{n}" for n in (
            "LossScaleOptimizer", "Policy", "set_policy", "global_policy",
            "get_layer_policy", "LossScale", "FixedLossScale",
            "DynamicLossScale", "get", "serialize", "deserialize")]
        + [f"tf.mixed_precision.experimental.{n}" for n in (
            "LossScale", "FixedLossScale", "DynamicLossScale", "get",
            "serialize", "deserialize")]
        + [f"tf.train.experimental.{n}"
           for n in ("LossScale", "FixedLossScale", "DynamicLossScale")]
        + ["tf.keras.mixed_precision.LossScaleOptimizer"]
        + [f"tf.train.experimental.{f}_mixed_precision_graph_rewrite"
           for f in ("enable", "disable")])


def test_install_provides_every_public_name_fix_rewrites():
    # One table: what `python -m tf_lso run` resolves is what `--fix`
    # rewrites to, name for name.
    from tf_lso_migration import legacy_names as rules

    tf_lso.install()
    public = [n for n in rules.LEGACY_NAMES if not n.startswith("tf.python.")]
    assert sorted(install_lib.installed_names()) == sorted(public)
    for name in public:
        value = tf
        for part in name.split(".")[1:]:
            value = getattr(value, part)
        target = tf_lso
        for part in rules.LEGACY_NAMES[name].split(".")[1:]:
            target = getattr(target, part)
        assert value is target, name


def test_import_statements_of_old_scripts_work():
    tf_lso.install()
    from tensorflow.keras.mixed_precision import experimental as mp

    assert mp.Policy is tf_lso.experimental.Policy
    module = importlib.import_module("tensorflow.mixed_precision.experimental")
    assert module.DynamicLossScale is tf_lso.experimental.DynamicLossScale


def test_tf24_import_statements_get_the_tf24_class():
    # `import tensorflow.keras.mixed_precision` can bind a module object
    # other than `tf.keras.mixed_precision` (Keras 3's tf_keras facade), so
    # this runs in fresh interpreters, before and after tf.keras was first
    # touched.
    checks = "; ".join([
        "from tensorflow.keras.mixed_precision import LossScaleOptimizer as L",
        "assert L is tf_lso.LossScaleOptimizer, L",
        "from tensorflow.keras import mixed_precision as mp",
        "assert mp.LossScaleOptimizer is tf_lso.LossScaleOptimizer",
        "import tensorflow.keras.mixed_precision as mp",
        "assert mp.LossScaleOptimizer is tf_lso.LossScaleOptimizer",
        "from tensorflow.keras.mixed_precision import experimental as e",
        "assert e.LossScaleOptimizer is tf_lso.experimental.LossScaleOptimizer",
        "tf_lso.uninstall()",
        "from tensorflow.keras.mixed_precision import LossScaleOptimizer as L",
        "from keras.optimizers import LossScaleOptimizer as K",
        "assert L is K, L",
    ])
    for touch in ("", "tf.keras.mixed_precision; "):
        code = "import tensorflow as tf, tf_lso; " + touch
        code += "tf_lso.install(); " + checks
        done = subprocess.run([sys.executable, "-c", code],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (code, done.stderr[-2000:])


def test_tf24_class_keeps_its_signature_and_is_a_keras_lso():
    tf_lso.install()
    opt = tf.keras.mixed_precision.LossScaleOptimizer(
        tf.keras.optimizers.SGD(), dynamic=False, initial_scale=8)
    assert isinstance(opt, KERAS_LSO)
    assert float(opt.loss_scale) == 8.0


def test_install_is_idempotent_and_uninstall_restores_everything():
    before = _snapshot()
    assert not hasattr(tf.keras.mixed_precision, "experimental")
    tf_lso.install()
    tf_lso.install()
    assert _snapshot() != before
    tf_lso.uninstall()
    assert _snapshot() == before
    assert tf.keras.mixed_precision.LossScaleOptimizer is KERAS_LSO
    tf_lso.uninstall()  # a second uninstall changes nothing
    assert _snapshot() == before


def _mixed_precision_modules():
    """Every module object reachable as `tf.keras.mixed_precision`."""
    from tensorflow.keras import mixed_precision as from_import

    return [tf.keras.mixed_precision, keras.mixed_precision, from_import,
            importlib.import_module("tensorflow.keras.mixed_precision"),
            importlib.import_module("keras.mixed_precision")]


def test_every_module_object_shows_the_installed_names():
    # `keras.mixed_precision` and `tf.keras.mixed_precision` are different
    # module objects with a plain `pip install tensorflow keras`.
    tf_lso.install()
    prefix = "tf.keras.mixed_precision."
    names = [n[len(prefix):] for n in install_lib.installed_names()
             if n.startswith(prefix)]
    names.append("LossScaleOptimizer")
    for module in _mixed_precision_modules():
        for name in names:
            value = module
            for part in name.split("."):
                value = getattr(value, part)
            assert value is install_lib._tf_lso_object(
                install_lib.legacy.LEGACY_NAMES[prefix + name]), (
                    module.__name__, name)
    # What `check` calls fixable runs under install(): TF 2.4's signature.
    opt = keras.mixed_precision.LossScaleOptimizer(
        keras.optimizers.SGD(), dynamic=False, initial_scale=128)
    assert float(opt.loss_scale) == 128.0
    tf_lso.uninstall()
    for module in _mixed_precision_modules():
        assert module.LossScaleOptimizer is KERAS_LSO
        assert not hasattr(module, "experimental")


def test_compile_under_mixed_float16_uses_tf24_class_when_installed():
    def compiled_optimizer():
        keras.mixed_precision.set_global_policy("mixed_float16")
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(), "mse")
        return model.optimizer

    tf_lso.install()
    assert type(compiled_optimizer()) is tf_lso.LossScaleOptimizer
    tf_lso.uninstall()
    assert type(compiled_optimizer()) is KERAS_LSO


def test_compile_names_its_wrapper_as_keras_does():
    def compiled_optimizer():
        keras.mixed_precision.set_global_policy("mixed_float16")
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(), "mse")
        return model.optimizer

    keras_names = [compiled_optimizer().name for _ in range(2)]
    assert keras_names == ["loss_scale_optimizer"] * 2
    tf_lso.install()
    wrappers = [compiled_optimizer() for _ in range(3)]
    assert [type(w) for w in wrappers] == [tf_lso.LossScaleOptimizer] * 3
    assert [w.name for w in wrappers] == ["loss_scale_optimizer"] * 3
    # The name is in the config, as in Keras 3's, so a loaded model keeps it.
    assert wrappers[0].get_config()["name"] == "loss_scale_optimizer"
    assert tf_lso.LossScaleOptimizer.from_config(
        wrappers[0].get_config()).name == "loss_scale_optimizer"


def test_run_command(tmp_path, capsys):
    script = tmp_path / "old.py"
    helper = tmp_path / "old_helper.py"
    helper.write_text("VALUE = 42\n")
    script.write_text(
        "import sys\n"
        "import tensorflow as tf\n"
        "import old_helper\n"
        "opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(\n"
        "    tf.keras.optimizers.SGD(), loss_scale=8)\n"
        "print('argv', sys.argv[1:], __name__, old_helper.VALUE,\n"
        "      float(opt.loss_scale()))\n"
    )
    argv = list(sys.argv)
    try:
        assert cli.main(["run", str(script), "--flag", "x"]) == 0
    finally:
        sys.argv = argv
        sys.path.remove(str(tmp_path))
    assert capsys.readouterr().out == (
        "argv ['--flag', 'x'] __main__ 42 8.0\n")


def test_run_command_needs_a_script(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run"])
    assert "script" in capsys.readouterr().err


# A `.keras` file saved from a compiled model, loaded under install() (in this
# process, or in a script run by `python -m tf_lso run`), trains on exactly
# as the model that was never saved.
_RESUME_SCRIPT = """
import sys
import keras
import numpy as np
path, out, policy = sys.argv[1:]
keras.mixed_precision.set_global_policy(policy)
data = np.load(path + ".data.npz")
model = keras.models.load_model(path)
model.fit(data["x"], data["y"], batch_size=8, shuffle=False, verbose=0)
np.savez(out, *[np.asarray(v) for v in model.optimizer.variables],
         *[np.asarray(w) for w in model.weights],
         loss_scale=np.asarray(model.optimizer.loss_scale)
         if hasattr(model.optimizer, "loss_scale") else np.float32(0))
"""


def _resume_data():
    rng = np.random.default_rng(3)
    return (rng.normal(size=(32, 3)).astype("float32") * 1e3,
            rng.normal(size=(32, 2)).astype("float32"))


def _compiled_model(policy):
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                              keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def _state(model):
    opt = model.optimizer
    return ([np.asarray(v) for v in opt.variables]
            + [np.asarray(w) for w in model.weights],
            float(opt.loss_scale) if hasattr(opt, "loss_scale") else 0.0)


def _keras_3_model(seed=4):
    keras.mixed_precision.set_global_policy("mixed_float16")
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                              keras.layers.Dense(2, dtype="float32")])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def _keras_3_state(model):
    """Weights, the inner optimizer's variables, the scale and the counter."""
    opt = model.optimizer
    if isinstance(opt, tf_lso.LossScaleOptimizer):
        scale, counter = opt.loss_scale, opt.dynamic_counter
    else:
        scale, counter = opt.dynamic_scale, opt.step_counter
    return ([np.asarray(w) for w in model.weights]
            + [np.asarray(v) for v in opt.inner_optimizer.variables],
            float(scale), int(np.asarray(counter)))


@pytest.fixture
def keras_3_file(tmp_path):
    """A `.keras` file and a `.weights.h5` file written by Keras 3's own
    LossScaleOptimizer (what `compile` makes under mixed_float16 without
    tf_lso), after its scale moved; and plain Keras 3's state after loading
    it and resuming `fit`."""
    x, y = _resume_data()
    bad = y.copy()
    bad[0] = 6e4  # Its batch overflows in float16: the scale halves.
    model = _keras_3_model()
    assert type(model.optimizer) is keras.optimizers.LossScaleOptimizer
    model.fit(x / 1e3, bad, batch_size=8, shuffle=False, verbose=0)
    saved_scale = float(model.optimizer.dynamic_scale)
    saved_counter = int(model.optimizer.step_counter)
    assert saved_scale < 2.0**15 and saved_counter > 0
    path = str(tmp_path / "m.keras")
    model.save(path)
    weights = str(tmp_path / "m.weights.h5")
    model.save_weights(weights)
    reference = keras.models.load_model(path)
    assert float(reference.optimizer.dynamic_scale) == saved_scale
    reference.fit(x / 1e3, y, batch_size=8, shuffle=False, verbose=0)
    return path, weights, saved_scale, saved_counter, _keras_3_state(
        reference)


def _assert_resumes_as_keras_3(model, x, y, expected):
    model.fit(x / 1e3, y, batch_size=8, shuffle=False, verbose=0)
    got_vars, got_scale, got_counter = _keras_3_state(model)
    expected_vars, expected_scale, expected_counter = expected
    assert (got_scale, got_counter) == (expected_scale, expected_counter)
    assert len(got_vars) == len(expected_vars)
    for got, want in zip(got_vars, expected_vars):
        np.testing.assert_array_equal(got, want)


def test_a_keras_3_file_resumes_under_install(keras_3_file):
    # The inner optimizer's `iterations` agrees: no step of the resumed run
    # is skipped (Keras 3 does not count a skipped step; TF 2.4 does).
    path, _, saved_scale, saved_counter, expected = keras_3_file
    tf_lso.install()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is tf_lso.LossScaleOptimizer
    assert float(loaded.optimizer.loss_scale) == saved_scale
    assert int(loaded.optimizer.dynamic_counter) == saved_counter
    _assert_resumes_as_keras_3(loaded, *_resume_data(), expected)


def test_keras_3_weights_load_into_tf_lso(keras_3_file):
    _, weights, saved_scale, saved_counter, expected = keras_3_file
    tf_lso.install()
    model = _keras_3_model(seed=9)  # Other weights: all of them load.
    model.optimizer.build(model.trainable_variables)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        model.load_weights(weights)
    assert float(model.optimizer.loss_scale) == saved_scale
    assert int(model.optimizer.dynamic_counter) == saved_counter
    _assert_resumes_as_keras_3(model, *_resume_data(), expected)


def test_a_keras_3_file_into_a_fixed_scale_raises(keras_3_file):
    _, weights, *_ = keras_3_file
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                              keras.layers.Dense(2, dtype="float32")])
    opt = tf_lso.LossScaleOptimizer(keras.optimizers.Adam(0.01),
                                    dynamic=False, initial_scale=64)
    model.compile(opt, "mse")
    opt.build(model.trainable_variables)
    with pytest.raises(ValueError, match=r"Keras 3's LossScaleOptimizer.*"
                                         r"dynamic.*has no dynamic scale"):
        model.load_weights(weights)
    assert float(opt.loss_scale) == 64


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_load_model_under_install_resumes_training(tmp_path, policy):
    x, y = _resume_data()
    tf_lso.install()
    model = _compiled_model(policy)
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0)  # Never saved.
    expected_vars, expected_scale = _state(model)
    if policy == "mixed_float16":
        assert isinstance(model.optimizer, tf_lso.LossScaleOptimizer)
        # The first batches overflow: the run tests a restored loss scale.
        assert int(model.optimizer.skipped_steps) > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # "compile() was not..."
        loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is type(model.optimizer)
    loaded.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    got_vars, got_scale = _state(loaded)
    assert got_scale == expected_scale
    assert len(got_vars) == len(expected_vars)
    for got, expected in zip(got_vars, expected_vars):
        np.testing.assert_array_equal(got, expected)

    # The same file, resumed by a script under `python -m tf_lso run`.
    np.savez(path + ".data.npz", x=x, y=y)
    script = tmp_path / "resume.py"
    script.write_text(_RESUME_SCRIPT)
    out = str(tmp_path / "resumed.npz")
    done = subprocess.run(
        [sys.executable, "-W", "error::UserWarning:keras", "-m", "tf_lso",
         "run", str(script), path, out, policy],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(out) as resumed:
        assert float(resumed["loss_scale"]) == expected_scale
        arrays = [resumed[f"arr_{i}"] for i in range(len(expected_vars))]
    for got, expected in zip(arrays, expected_vars):
        np.testing.assert_array_equal(got, expected)
