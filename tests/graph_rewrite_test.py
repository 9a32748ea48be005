"""Tests for tf_lso._src.legacy_api.graph_rewrite: `enable_..._graph_rewrite`.

What TF 2.4-2.8 did for Keras optimizers (wrap in the experimental class,
switch on the grappler pass), and TF1 optimizers handed to TensorFlow.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_lso

import test_util

enable = tf_lso.experimental.enable_mixed_precision_graph_rewrite
disable = tf_lso.experimental.disable_mixed_precision_graph_rewrite


def _pass_enabled():
    return bool(tf.config.optimizer.get_experimental_options().get(
        "auto_mixed_precision", False))


@pytest.fixture(autouse=True)
def _restore():
    yield
    tf.config.optimizer.set_experimental_options(
        {"auto_mixed_precision": False})
    keras.mixed_precision.set_global_policy("float32")
    tf_lso.uninstall()


@pytest.mark.parametrize("loss_scale, dynamic, scale", [
    ("dynamic", True, 32768.0),
    (128, False, 128.0),
    (tf_lso.experimental.DynamicLossScale(64, 10), True, 64.0),
])
def test_wraps_a_keras_optimizer(loss_scale, dynamic, scale):
    sgd = keras.optimizers.SGD(0.5)
    opt = enable(sgd, loss_scale)
    assert type(opt) is tf_lso.experimental.LossScaleOptimizer
    assert opt.inner_optimizer is sgd
    assert opt.dynamic is dynamic
    assert float(opt.loss_scale()) == scale
    assert _pass_enabled()
    disable()
    assert not _pass_enabled()


def test_default_loss_scale_is_dynamic():
    opt = enable(keras.optimizers.SGD())
    assert opt.dynamic and opt.initial_scale == 32768.0


def test_wraps_a_tf_keras_legacy_optimizer():
    sgd = test_util.tf_keras.optimizers.legacy.SGD(0.5)
    opt = enable(sgd)
    assert opt.inner_optimizer is sgd


@pytest.mark.parametrize("make", [
    lambda: tf_lso.LossScaleOptimizer(keras.optimizers.SGD()),
    lambda: tf_lso.experimental.LossScaleOptimizer(keras.optimizers.SGD(),
                                                   "dynamic"),
    lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()),
])
def test_refuses_a_loss_scale_optimizer(make):
    with pytest.raises(ValueError, match='"opt" must not already be an '
                       "instance of a LossScaleOptimizer"):
        enable(make())
    assert not _pass_enabled()


def test_refuses_an_optimizer_that_is_wrapped_already():
    sgd = keras.optimizers.SGD()
    tf_lso.LossScaleOptimizer(sgd)
    with pytest.raises(ValueError, match="already wrapped"):
        enable(sgd)


def test_refuses_while_a_mixed_policy_is_set():
    keras.mixed_precision.set_global_policy("mixed_float16")
    with pytest.raises(ValueError, match="global Keras dtype Policy has been "
                       "set to a mixed precision policy"):
        enable(keras.optimizers.SGD())
    assert not _pass_enabled()


@pytest.mark.parametrize("value", [3, "sgd", None])
def test_non_optimizer_is_tfs_value_error(value):
    with pytest.raises(ValueError, match='"opt" must be an instance of a '
                       "tf.train.Optimizer or a tf.keras.optimizers.Optimizer"):
        enable(value)


@pytest.mark.parametrize("loss_scale", [
    "dynamic", 64, tf_lso.experimental.FixedLossScale(64),
    tf_lso.experimental.DynamicLossScale(64, 10),
])
def test_tf1_optimizers_go_to_tensorflow(loss_scale):
    # TensorFlow takes tf_lso's loss scales as its own (loss_scale_test.py).
    opt = enable(tf.compat.v1.train.GradientDescentOptimizer(1.0), loss_scale)
    assert isinstance(
        opt, tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer)
    assert float(opt._loss_scale()) == (
        32768.0 if loss_scale == "dynamic" else 64.0)
    if isinstance(loss_scale, tf_lso.experimental.LossScale):
        assert opt._loss_scale is loss_scale
    assert _pass_enabled()


def test_installed_names_and_fit():
    tf_lso.install()
    assert tf.train.experimental.enable_mixed_precision_graph_rewrite is enable
    assert (tf.train.experimental.disable_mixed_precision_graph_rewrite
            is disable)
    opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(
        tf.keras.optimizers.SGD(0.1), loss_scale=8)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(opt, "mse")
    x = np.ones((4, 2), "float32")
    model.fit(x, np.zeros((4, 1), "float32"), verbose=0)
    assert model.optimizer is opt
    assert test_util.num(opt.iterations) == 1
    tf_lso.uninstall()
    assert not hasattr(tf.train.experimental,
                       "enable_mixed_precision_graph_rewrite")
