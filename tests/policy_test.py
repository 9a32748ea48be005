"""Tests for tf_lso._src.legacy_api.policy: the TF 2.1-2.3 Policy API and compile."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_lso
from tf_lso._src.legacy_api import compile_hook

Policy = tf_lso.experimental.Policy


@pytest.fixture(autouse=True)
def _restore_global_policy():
    yield
    keras.mixed_precision.set_global_policy("float32")
    compile_hook.disable()


@pytest.mark.parametrize("name, compute, variable", [
    ("float32", "float32", "float32"),
    ("float16", "float16", "float16"),
    ("mixed_float16", "float16", "float32"),
    ("mixed_bfloat16", "bfloat16", "float32"),
    ("float64", "float64", "float64"),
    ("_infer", None, None),
])
def test_dtypes(name, compute, variable):
    policy = Policy(name)
    assert (policy.name, policy.compute_dtype, policy.variable_dtype) == (
        name, compute, variable)
    assert isinstance(policy, keras.DTypePolicy)


def test_auto_loss_scale():
    assert isinstance(Policy("mixed_float16").loss_scale,
                      tf_lso.experimental.DynamicLossScale)
    assert float(Policy("mixed_float16").loss_scale) == 2.0**15
    for name in ("float32", "float16", "mixed_bfloat16", "_infer"):
        assert Policy(name).loss_scale is None


def test_explicit_loss_scales():
    fixed = Policy("mixed_float16", loss_scale=128).loss_scale
    assert isinstance(fixed, tf_lso.experimental.FixedLossScale)
    assert float(fixed) == 128.0
    assert Policy("mixed_float16", loss_scale=None).loss_scale is None
    dynamic = tf_lso.experimental.DynamicLossScale(4, 10)
    assert Policy("float32", loss_scale=dynamic).loss_scale is dynamic
    assert isinstance(Policy("float32", loss_scale="dynamic").loss_scale,
                      tf_lso.experimental.DynamicLossScale)


def test_bad_arguments():
    with pytest.raises(TypeError, match="must be a string"):
        Policy(tf.float16)
    with pytest.raises(ValueError, match="Cannot convert 'int8x'"):
        Policy("int8x")
    with pytest.raises(ValueError, match="Could not interpret loss scale"):
        Policy("mixed_float16", loss_scale="bogus")


@pytest.mark.parametrize("loss_scale", ["auto", None, 64, "dynamic"])
def test_config_round_trip(loss_scale):
    policy = Policy("mixed_float16", loss_scale=loss_scale)
    config = policy.get_config()
    restored = Policy.from_config(config)
    assert restored.get_config() == config
    assert restored.name == "mixed_float16"
    if policy.loss_scale is None:
        assert config["loss_scale"] is None
    else:
        assert config["loss_scale"] == tf_lso.experimental.serialize(
            policy.loss_scale)


def test_repr():
    assert repr(Policy("float32")) == '<Policy "float32", loss_scale=None>'
    assert repr(Policy("mixed_float16", loss_scale=2)) == (
        '<Policy "mixed_float16", loss_scale=FixedLossScale(2.0)>')


def test_set_policy_and_layers():
    policy = Policy("mixed_float16")
    tf_lso.experimental.set_policy(policy)
    assert tf_lso.experimental.global_policy() is policy
    layer = keras.layers.Dense(2)
    assert tf_lso.experimental.get_layer_policy(layer) is policy
    y = layer(np.ones((1, 3), "float32"))
    assert y.dtype == tf.float16
    assert layer.kernel.dtype == "float32"
    # A layer's config holds our policy; Keras rebuilds layers with a plain
    # policy of the same name (a layer has no use for a loss scale).
    config = layer.get_config()
    assert config["dtype"]["config"] == policy.get_config()
    restored = keras.layers.Dense.from_config(config)
    assert restored.dtype_policy.name == "mixed_float16"

    tf_lso.experimental.set_policy("float32")
    assert tf_lso.experimental.global_policy().name == "float32"
    tf_lso.experimental.set_policy(None)
    assert tf_lso.experimental.global_policy().name == "float32"
    tf_lso.experimental.set_policy("_infer")
    assert tf_lso.experimental.global_policy().name == "float32"


def test_global_policy_from_keras():
    keras.mixed_precision.set_global_policy("mixed_float16")
    policy = tf_lso.experimental.global_policy()
    assert isinstance(policy, Policy)
    assert policy.name == "mixed_float16"
    assert policy.loss_scale is not None


def test_set_policy_errors():
    with pytest.raises(ValueError, match="floating-point policies"):
        tf_lso.experimental.set_policy("int32")
    with pytest.raises(ValueError, match="takes a Policy"):
        tf_lso.experimental.set_policy(3)
    with pytest.raises(ValueError, match="only be called on a layer"):
        tf_lso.experimental.get_layer_policy("dense")


def _model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((4,)), keras.layers.Dense(4),
        keras.layers.Activation("linear", dtype="float32"),
    ])


def test_compile_wraps_with_the_policy_loss_scale():
    tf_lso.experimental.set_policy(
        Policy("mixed_float16", loss_scale=tf_lso.experimental.DynamicLossScale(
            initial_loss_scale=8, increment_period=2)))
    model = _model()
    model.compile(keras.optimizers.SGD(0.1), "mse")
    opt = model.optimizer
    assert type(opt) is tf_lso.experimental.LossScaleOptimizer
    assert isinstance(opt.inner_optimizer, keras.optimizers.SGD)
    model.fit(np.ones((8, 4)), np.ones((8, 1)), batch_size=2, verbose=0)
    assert float(opt.loss_scale()) == 8.0 * 2**2  # 4 finite steps
    # A second model gets its own loss scale state.
    other = _model()
    other.compile("sgd", "mse")
    assert float(other.optimizer.loss_scale()) == 8.0
    assert other.optimizer.loss_scale is not opt.loss_scale


def test_compile_with_fixed_scale_and_string_optimizer():
    tf_lso.experimental.set_policy(Policy("mixed_float16", loss_scale=16))
    model = _model()
    model.compile("adam", "mse")
    assert isinstance(model.optimizer.loss_scale,
                      tf_lso.experimental.FixedLossScale)
    assert float(model.optimizer.loss_scale) == 16.0


def test_compile_leaves_loss_scale_optimizers_alone():
    tf_lso.experimental.set_policy("mixed_float16")
    ours = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=4)
    model = _model()
    model.compile(ours, "mse")
    assert model.optimizer is ours
    keras_lso = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    model = _model()
    model.compile(keras_lso, "mse")
    assert model.optimizer is keras_lso


def test_policy_without_loss_scale_means_no_scaling():
    tf_lso.experimental.set_policy(Policy("mixed_float16", loss_scale=None))
    model = _model()
    sgd = keras.optimizers.SGD()
    model.compile(sgd, "mse")
    assert model.optimizer is sgd


def test_plain_keras_policy_is_left_to_keras():
    keras.mixed_precision.set_global_policy("mixed_float16")
    compile_hook.enable()
    model = _model()
    model.compile(keras.optimizers.SGD(), "mse")
    assert type(model.optimizer) is keras.optimizers.LossScaleOptimizer
