"""Tests for tf_lso._src.legacy_api.compile_hook: its two switches.

What `compile` does under each policy is tested in policy_test.py and
install_test.py.
"""

import keras
import pytest

import tf_lso
from tf_lso._src.legacy_api import compile_hook


@pytest.fixture(autouse=True)
def _restore():
    yield
    keras.mixed_precision.set_global_policy("float32")
    compile_hook.disable()


def _compiled_optimizer(optimizer):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer, "mse")
    return model.optimizer


def test_enable_and_disable_are_idempotent():
    keras_compile = keras.Model.compile
    compile_hook.disable()
    assert keras.Model.compile is keras_compile
    compile_hook.enable()
    hooked = keras.Model.compile
    compile_hook.enable()
    assert keras.Model.compile is hooked is not keras_compile
    assert keras.Model.compile is hooked
    compile_hook.disable()
    compile_hook.disable()
    assert keras.Model.compile is keras_compile
    assert keras.Model.compile is not hooked


@pytest.mark.parametrize("wrap, expected", [
    (False, keras.optimizers.LossScaleOptimizer),
    (True, tf_lso.LossScaleOptimizer),
])
def test_wrap_mixed_float16_switch(wrap, expected):
    keras.mixed_precision.set_global_policy("mixed_float16")
    compile_hook.enable(wrap_mixed_float16=wrap)
    assert type(_compiled_optimizer(keras.optimizers.SGD())) is expected
    compile_hook.enable()  # None leaves the switch as it is.
    assert type(_compiled_optimizer(keras.optimizers.SGD())) is expected


def test_disable_turns_wrapping_off():
    keras.mixed_precision.set_global_policy("mixed_float16")
    compile_hook.enable(wrap_mixed_float16=True)
    compile_hook.disable()
    compile_hook.enable()
    assert type(_compiled_optimizer(keras.optimizers.SGD())) is (
        keras.optimizers.LossScaleOptimizer)


def test_no_wrapping_without_mixed_float16():
    compile_hook.enable(wrap_mixed_float16=True)
    sgd = keras.optimizers.SGD()
    assert _compiled_optimizer(sgd) is sgd


@pytest.mark.parametrize("policy", ["mixed_float16", "legacy_dynamic"])
def test_recompiling_with_the_same_optimizer_reuses_its_wrapper(policy):
    # TF 2.4 and tf_keras raised here: the second compile wrapped the
    # optimizer again.
    if policy == "legacy_dynamic":
        tf_lso.experimental.set_policy(
            tf_lso.experimental.Policy("mixed_float16", loss_scale="dynamic"))
        expected = tf_lso.experimental.LossScaleOptimizer
    else:
        keras.mixed_precision.set_global_policy("mixed_float16")
        compile_hook.enable(wrap_mixed_float16=True)
        expected = tf_lso.LossScaleOptimizer
    inner = keras.optimizers.SGD()
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(inner, "mse")
    wrapper = model.optimizer
    assert isinstance(wrapper, expected) and wrapper.inner_optimizer is inner
    model.compile(inner, "mse")
    assert model.optimizer is wrapper
    # Another model cannot wrap it again: the two would share its state.
    with pytest.raises(ValueError, match="already wrapped .*model.optimizer"):
        _compiled_optimizer(inner)
    # A wrapper with another loss scale than the rules give is not reused.
    inner = keras.optimizers.SGD()
    model.compile(tf_lso.experimental.LossScaleOptimizer(inner, 128), "mse")
    with pytest.raises(ValueError, match="already wrapped"):
        model.compile(inner, "mse")
