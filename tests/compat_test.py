"""Tests for tf_lso._src.compat: version checks and the private hooks.

Each private hook has a test here that fails when a TF/Keras release moves it.
"""

import builtins
import importlib
import inspect
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_lso._src import compat


def test_version_tuple():
    assert compat._version_tuple("2.21.0") == (2, 21)
    assert compat._version_tuple("2.16.0rc1") == (2, 16)


def test_missing_tensorflow_says_what_to_install(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "tensorflow":
            raise ImportError("No module named 'tensorflow'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match="pip install 'tensorflow>=2.16'"):
        compat.require_tensorflow()


def test_old_tensorflow_is_rejected(monkeypatch):
    monkeypatch.setattr(tf, "__version__", "2.15.1")
    with pytest.raises(ImportError, match="found TensorFlow 2.15.1"):
        compat.require_tensorflow()


def test_keras_before_3_8_is_rejected(monkeypatch):
    import keras

    monkeypatch.setattr(keras, "__version__", "3.7.0")
    with pytest.raises(ImportError, match=r"found Keras 3\.7\.0.*keras>=3\.8"):
        compat.require_tensorflow()


def test_legacy_create_all_weights_hook():
    tf_keras = pytest.importorskip("tf_keras")
    optimizer = tf_keras.optimizers.legacy.SGD(1.0, momentum=0.5)
    var = tf.Variable([1.0, 2.0], name="w")
    compat.legacy_create_all_weights(optimizer, [var])
    assert optimizer.get_slot(var, "momentum").shape == (2,)
    # Named under the optimizer's `_name`, as its apply_gradients names them.
    assert [v.name for v in optimizer.variables()] == [
        "SGD/iter:0", "SGD/w/momentum:0"]


def test_tf_keras_files_hold_hook(tmp_path):
    tf_keras = pytest.importorskip("tf_keras")

    class Held:
        def __init__(self):
            self.value = np.array([1.0, 2.0], np.float32)

        def save_own_variables(self, store):
            store["0"] = self.value

        def load_own_variables(self, store):
            self.value = np.array(store["0"])

    def round_trip(path):
        model = tf_keras.Sequential([tf_keras.layers.Dense(1)])
        model.build((None, 2))
        model.held = Held()
        model.save_weights(str(path))
        model.held.value = np.zeros(2, np.float32)
        model.load_weights(str(path))
        return model.held.value

    # tf_keras's saving visits its own classes only ...
    np.testing.assert_array_equal(round_trip(tmp_path / "a.weights.h5"),
                                  [0.0, 0.0])
    compat.tf_keras_files_hold(Held)
    # ... and then `Held` too; every other object as before.
    np.testing.assert_array_equal(round_trip(tmp_path / "b.weights.h5"),
                                  [1.0, 2.0])
    saving_lib = importlib.import_module("tf_keras.src.saving.saving_lib")
    assert saving_lib._is_keras_trackable(tf_keras.layers.Dense(1))
    assert not saving_lib._is_keras_trackable(
        tf_keras.optimizers.legacy.SGD())


def test_legacy_aggregate_gradients_hook():
    tf_keras = pytest.importorskip("tf_keras")
    seen = []

    class Transforming(tf_keras.optimizers.legacy.SGD):
        def _transform_unaggregated_gradients(self, grads_and_vars):
            seen.append("transform")
            return [(g + 1.0, v) for g, v in grads_and_vars]

    def aggregator(grads_and_vars):
        seen.append("aggregate")
        return [(g * 10.0, v) for g, v in grads_and_vars]

    optimizer = Transforming(1.0, gradient_aggregator=aggregator)
    var = tf.Variable(0.0)
    [(grad, got_var)] = compat.legacy_aggregate_gradients(
        optimizer, [(tf.constant(2.0), var)])
    assert seen == ["transform", "aggregate"]
    assert float(grad) == 30.0 and got_var is var


def test_tf_dynamic_loss_scale_counter_hook():
    loss_scale = tf.compat.v1.mixed_precision.DynamicLossScale(4.0, 10)
    loss_scale.update([tf.constant(1.0)])
    assert int(compat.tf_dynamic_loss_scale_counter(loss_scale)) == 1


def test_tf_keras_module_only_when_imported():
    assert compat.tf_keras_module() is sys.modules.get("tf_keras")


def test_trackable_protocol_hooks(tmp_path):
    module = tf.Module()
    module.v = tf.Variable(1.0)
    assert compat.trackable_children(module, "checkpoint")["v"] is module.v
    assert compat.lookup_dependency(module, "v") is module.v
    assert compat.deferred_dependencies(module) == {}
    assert isinstance(module, compat.Trackable)
    keys = [n for n, _ in tf.train.list_variables(
        tf.train.Checkpoint(m=module).write(str(tmp_path / "ckpt")))]
    assert "m/v/.ATTRIBUTES/" + compat.VARIABLE_VALUE in keys


def test_is_saved_model_tells_the_save_types_apart(tmp_path):
    seen = []

    class Spy(tf.Module):
        def _trackable_children(self, save_type="checkpoint", **kwargs):
            seen.append(compat.is_saved_model(save_type))
            return super()._trackable_children(save_type, **kwargs)

    module = tf.Module()
    module.spy = Spy()
    tf.train.Checkpoint(m=module).write(str(tmp_path / "ckpt"))
    assert seen and not any(seen)
    seen.clear()
    tf.saved_model.save(module, str(tmp_path / "saved_model"))
    assert any(seen)


def test_create_or_restore_slot_and_restore_position_hooks(tmp_path):
    tf_keras = pytest.importorskip("tf_keras")
    var = tf.Variable([1.0, 2.0])
    source = tf_keras.optimizers.legacy.SGD(1.0, momentum=0.5)
    source.apply_gradients([(tf.constant([1.0, 1.0]), var)])
    path = tf.train.Checkpoint(v=var, opt=source).write(str(tmp_path / "c"))
    restored = tf_keras.optimizers.legacy.SGD(1.0, momentum=0.5)
    calls = []
    real = compat.create_or_restore_slot

    class Spy(tf_keras.optimizers.legacy.SGD):
        def _create_or_restore_slot_variable(self, **kwargs):
            calls.append(kwargs["slot_name"])
            return real(restored, kwargs["slot_variable_position"],
                        kwargs["slot_name"], kwargs["variable"])

    tf.train.Checkpoint(v=var, opt=Spy(1.0)).read(path)
    assert calls == ["momentum"]
    assert restored.get_slot(var, "momentum").numpy().tolist() == [-1.0, -1.0]


def test_keras_optimizer_variable_index_hooks():
    import keras

    optimizer = keras.optimizers.SGD(1.0, momentum=0.5)
    a, b = tf.Variable(1.0), tf.Variable(2.0)
    optimizer.build([a, b])
    assert list(compat.keras_trainable_variables(optimizer)) == [a, b]


def test_restore_position_hook(tmp_path):
    # A slot's checkpoint position, kept until the slot exists (as KerasInner
    # keeps them for an optimizer not built yet), restores into it.
    tf_keras = pytest.importorskip("tf_keras")
    var = tf.Variable([1.0, 2.0])
    source = tf_keras.optimizers.legacy.SGD(1.0, momentum=0.5)
    source.apply_gradients([(tf.constant([1.0, 1.0]), var)])
    saved = source.get_slot(var, "momentum").numpy().tolist()
    path = tf.train.Checkpoint(v=var, opt=source).write(str(tmp_path / "c"))
    positions = []

    class Spy(tf_keras.optimizers.legacy.SGD):
        def _create_or_restore_slot_variable(self, **kwargs):
            positions.append(kwargs["slot_variable_position"])

    tf.train.Checkpoint(v=var, opt=Spy(1.0)).read(path)
    slot = tf.Variable([0.0, 0.0])
    compat.restore_position(positions[0], slot)
    assert slot.numpy().tolist() == saved != [0.0, 0.0]


def test_keras_ema_hooks():
    import keras

    optimizer = keras.optimizers.SGD(1.0, use_ema=True, ema_momentum=0.5)
    var = tf.Variable([2.0, 4.0])
    optimizer.build([var])
    averages = compat.keras_ema_averages(optimizer)
    assert len(averages) == 1 and averages[0].shape == var.shape
    averages[0].assign([10.0, 20.0])
    # Keras's apply leaves the averages alone while the hook is active ...
    with compat.keras_apply_without_ema(optimizer):
        optimizer.apply([tf.constant([1.0, 1.0])])
    assert averages[0].numpy().tolist() == [10.0, 20.0]
    assert var.numpy().tolist() == [1.0, 3.0]
    assert optimizer.use_ema
    # ... and moves them without it (Keras's own formula).
    optimizer.apply([tf.constant([1.0, 1.0])])
    assert averages[0].numpy().tolist() != [10.0, 20.0]
    compat.keras_overwrite_with_ema(optimizer)
    assert var.numpy().tolist() == averages[0].numpy().tolist()


def test_keras_uses_ema_reads_through_the_switch():
    import keras

    optimizer = keras.optimizers.SGD(1.0, use_ema=True)
    assert compat.keras_uses_ema(optimizer)
    with compat.keras_apply_without_ema(optimizer):
        assert not optimizer.use_ema  # What Keras's apply reads ...
        assert compat.keras_uses_ema(optimizer)  # ... and the setting.
    assert not compat.keras_uses_ema(keras.optimizers.SGD(1.0))


def test_merge_call_fails_in_cond_hook():
    import test_util

    strategy = test_util.mirrored_strategy()
    answers = []

    def merge_in_cond():
        answers.append(compat.merge_call_fails_in_cond())
        context = tf.distribute.get_replica_context()
        return tf.cond(tf.constant(True),
                       lambda: context.merge_call(lambda _: tf.constant(1)),
                       lambda: tf.constant(0))

    # Where it answers True, TensorFlow refuses a merge_call in a cond ...
    with pytest.raises(RuntimeError, match="merge_call"):
        tf.function(lambda: strategy.run(merge_in_cond))()
    assert answers and all(answers)
    # ... and where it answers False, it does not.
    answers.clear()
    strategy.run(merge_in_cond)
    assert answers and not any(answers)
    assert not tf.function(compat.merge_call_fails_in_cond)()


def test_keras_loss_scale_optimizer_file_state_hook():
    import keras

    inner = keras.optimizers.Adam(0.1)
    opt = keras.optimizers.LossScaleOptimizer(inner, initial_scale=64.0)
    var = tf.Variable([1.0, 2.0])
    opt.build([var])
    opt.dynamic_scale.assign(16.0)
    opt.step_counter.assign(3)
    store = {}
    opt.save_own_variables(store)  # What Keras writes in its files.
    scale, counter = compat.keras_loss_scale_optimizer_file_state(
        store, len(inner.variables))
    assert (float(scale), int(counter)) == (16.0, 3)
    # Another layout is not taken for it.
    assert compat.keras_loss_scale_optimizer_file_state(
        store, len(inner.variables) + 1) is None


def test_keras_set_trainable_variables_hook():
    import keras

    # Keras's own `apply()` without variables updates what the hook set.
    optimizer = keras.optimizers.SGD(1.0)
    a, b = tf.Variable(1.0), tf.Variable(2.0)
    optimizer.build([a, b])
    compat.keras_set_trainable_variables(optimizer, [b, a])
    optimizer.apply([tf.constant(1.0), tf.constant(0.0)])
    assert (float(a), float(b)) == (1.0, 1.0)


def test_keras_apply_without_all_reduce_hook():
    import keras

    import test_util

    strategy = test_util.mirrored_strategy()
    with strategy.scope():
        var = tf.Variable(0.0)
        optimizer = keras.optimizers.SGD(1.0)
        optimizer.build([var])

    def step():
        grad = tf.cast(test_util.replica_id() + 1, tf.float32)
        compat.keras_apply_without_all_reduce(optimizer, [(grad, var)])

    strategy.run(step)
    # Each replica applied its own gradient: nothing was summed.
    local = strategy.experimental_local_results(var)
    assert [float(v) for v in local] == [-1.0, -2.0]
    assert "_all_reduce_sum_gradients" not in vars(optimizer)


def test_keras_is_auto_name_hook():
    import keras

    classes = [keras.optimizers.SGD, keras.optimizers.Adam,
               keras.optimizers.AdamW, keras.optimizers.RMSprop,
               keras.optimizers.Adagrad, keras.optimizers.Nadam,
               keras.optimizers.Lion, keras.optimizers.LossScaleOptimizer]
    for cls in classes[:-1]:
        first, second = cls(), cls()
        assert compat.keras_is_auto_name(first), first.name
        assert compat.keras_is_auto_name(second), second.name
    assert not compat.keras_is_auto_name(keras.optimizers.SGD(name="mine"))
    assert not compat.keras_is_auto_name(keras.optimizers.SGD(name="sgd_x"))


def test_check_variables_are_known_hooks():
    import keras

    known, unknown = tf.Variable(1.0), tf.Variable(2.0)
    optimizer = keras.optimizers.SGD()
    optimizer.build([known])
    compat.keras_check_variables_are_known(optimizer, [known])
    with pytest.raises(ValueError, match="Unknown variable"):
        compat.keras_check_variables_are_known(optimizer, [unknown])
    tf_keras = pytest.importorskip("tf_keras")
    optimizer = tf_keras.optimizers.SGD()
    optimizer.build([known])
    compat.tf_keras_check_variables_are_known(optimizer, [known])
    with pytest.raises(KeyError, match="cannot recognize variable"):
        compat.tf_keras_check_variables_are_known(optimizer, [unknown])


def test_keras_learning_rate_schedule_hook():
    import keras

    schedule = keras.optimizers.schedules.ExponentialDecay(1.0, 1, 0.5)
    assert compat.keras_learning_rate_schedule(
        keras.optimizers.SGD(schedule)) is schedule
    assert compat.keras_learning_rate_schedule(keras.optimizers.SGD(0.1)) is None


def test_keras_optimizer_into_strategy_hook():
    import test_util

    strategy = test_util.mirrored_strategy()
    optimizer = keras.optimizers.SGD(0.5, momentum=0.9)  # Outside the scope.
    iterations = optimizer.iterations
    iterations.assign(3)
    with strategy.scope():
        var = tf.Variable([1.0, 2.0])
        compat.keras_optimizer_into_strategy(optimizer)
        optimizer.build([var])  # Slots: "Mixing different strategies" before.
    assert optimizer._distribution_strategy is strategy
    assert optimizer.iterations is iterations  # The same Keras variable,
    for variable in optimizer.variables:  # now stored in the strategy.
        assert strategy.extended.variable_created_in_scope(variable.value)
    assert test_util.local_values(strategy, iterations) == [3, 3]
    assert test_util.local_values(strategy, optimizer.learning_rate) == [
        0.5, 0.5]


def test_keras_accumulation_hooks():
    import keras

    import test_util

    if not test_util.keras_has_gradient_accumulation():
        pytest.skip("This Keras has no gradient_accumulation_steps.")

    var, other = tf.Variable([1.0, 2.0]), tf.Variable(3.0)
    optimizer = keras.optimizers.SGD(1.0, gradient_accumulation_steps=2)
    optimizer.build([other, var])
    counter = compat.keras_step_counter(optimizer)
    assert callable(getattr(counter, "assign_add", None))
    optimizer.apply_gradients([(tf.constant([1.0, 1.0]), var),
                               (tf.constant(1.0), other)])
    assert int(counter.numpy()) == 1
    accumulators = compat.keras_gradient_accumulators(optimizer, [var])
    assert [a.numpy().tolist() for a in accumulators] == [[1.0, 1.0]]


def test_is_variable_hook():
    import keras

    layer = keras.layers.Dense(1)
    layer.build((None, 2))
    assert compat.is_variable(layer.kernel)
    assert compat.is_variable(tf.Variable(1.0))
    assert not compat.is_variable(tf.constant(1.0))
    assert not compat.is_variable(layer.kernel + 0)


def test_in_xla_context_hook():
    seen = {}

    def probe(key):
        seen[key] = compat.in_xla_context()
        return tf.constant(0)

    tf.function(lambda: probe("function"))()
    tf.function(lambda: probe("jit"), jit_compile=True)()
    tf.function(lambda: tf.cond(tf.constant(True), lambda: probe("jit_cond"),
                                lambda: tf.constant(1)), jit_compile=True)()
    assert seen == {"function": False, "jit": True, "jit_cond": True}
    assert not compat.in_xla_context()  # Eager.


def test_init_dtype_policy_without_dtypes_hook():
    policy = keras.DTypePolicy.__new__(keras.DTypePolicy)
    compat.init_dtype_policy_without_dtypes(policy, "_infer")
    assert policy.name == "_infer"
    assert policy.compute_dtype is None
    assert policy.variable_dtype is None
    assert policy.quantization_mode is None


def test_legacy_hyperparameter_names_hook():
    tf_keras = pytest.importorskip("tf_keras")
    optimizer = tf_keras.optimizers.legacy.Adam(0.5)
    names = compat.legacy_hyperparameter_names(optimizer)
    assert {"learning_rate", "decay", "beta_1", "beta_2"} <= names
    assert "epsilon" not in names and "amsgrad" not in names


def test_keras_compile_owner_hook():
    # load_model compiles a loaded model only if its class's `compile` is
    # this class's (Trainer.compile_from_config).
    owner = compat.keras_compile_owner()
    assert keras.Model.compile is vars(owner)["compile"]
    assert issubclass(keras.Model, owner)
    assert f"{owner.__name__}.compile" in inspect.getsource(
        owner.compile_from_config)


def test_tf_keras_is_tf_keras_hook():
    # This process runs the Keras 3 route; legacy_keras_route_test.py checks
    # the other answer under TF_USE_LEGACY_KERAS=1.
    import keras

    assert tf.keras.Model is keras.Model
    assert compat.tf_keras_is_tf_keras() is False


def test_require_tf_keras_if_chosen(monkeypatch):
    # Issue 50: with TF_USE_LEGACY_KERAS=1 and no tf_keras, one line that
    # names the package and the command (TensorFlow's blames Keras).
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    compat._require_tf_keras_if_chosen()  # Not chosen: nothing to check.
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    minor = ".".join(tf.__version__.split(".")[:2])
    with pytest.raises(ImportError, match=(
            r"^TF_USE_LEGACY_KERAS=1 makes tf\.keras tf_keras, which is not "
            rf"installed\. Install it with `pip install 'tf_keras~={minor}"
            r"\.0'`")):
        compat._require_tf_keras_if_chosen()
