"""Tests for tf_lso._src.optimizer.config: the two config formats."""

import keras
import pytest

import tf_lso
from tf_lso._src.optimizer import config as optimizer_config

import inner_kinds
import test_util


def test_upgrade_tf2_3_config():
    config = {
        "optimizer": {"class_name": "SGD", "config": {"learning_rate": 1.0}},
        "loss_scale": {
            "class_name": "DynamicLossScale",
            "config": {"initial_loss_scale": 8.0, "increment_period": 5,
                       "multiplier": 2.0},
        },
    }
    assert optimizer_config.upgrade_legacy_config(config) == {
        "inner_optimizer": config["optimizer"],
        "dynamic": True,
        "initial_scale": 8.0,
        "dynamic_growth_steps": 5,
    }


def test_tf2_4_config_is_unchanged():
    config = {"inner_optimizer": {}, "dynamic": False, "initial_scale": 2.0,
              "dynamic_growth_steps": None}
    assert optimizer_config.upgrade_legacy_config(config) == config


@pytest.mark.parametrize("kind", inner_kinds.TF_KERAS_NAMES)
@pytest.mark.parametrize("how", ["deserialize", "from_config", "scope"])
def test_custom_tf_keras_inner_optimizer(kind, how):
    # Keras hands custom objects over through `custom_object_scope`
    # (`keras.optimizers.deserialize`, `load_model`), not as an argument.
    base = inner_kinds.get(kind).optimizers().SGD

    class CustomSGD(base):
        pass

    config = keras.optimizers.serialize(
        tf_lso.LossScaleOptimizer(CustomSGD(0.5), initial_scale=4))
    custom = {"CustomSGD": CustomSGD}
    if how == "deserialize":
        restored = keras.optimizers.deserialize(config, custom_objects=custom)
    elif how == "from_config":
        restored = tf_lso.LossScaleOptimizer.from_config(
            config["config"], custom_objects=custom)
    else:
        with keras.saving.custom_object_scope(custom):
            restored = keras.optimizers.deserialize(config)
    assert type(restored.inner_optimizer) is CustomSGD
    assert float(restored.learning_rate) == 0.5
    assert restored.initial_scale == 4.0


@pytest.mark.parametrize("kind", inner_kinds.NAMES)
@pytest.mark.parametrize("cls", ["v1", "v2"])
def test_every_class_rebuilds_from_its_own_config(kind, cls):
    # TF 2.1-2.3's config check: `type(opt).from_config(opt.get_config())`.
    # Around a tf_keras optimizer, type(opt) is a subclass of the class
    # called; before issue 59 its from_config built an object whose
    # __init__ never ran.
    inner = inner_kinds.sgd(kind, 2.0, momentum=0.5)
    if cls == "v1":
        public = tf_lso.experimental.LossScaleOptimizer
        opt = public(inner, tf_lso.experimental.DynamicLossScale(2, 3))
    else:
        public = tf_lso.LossScaleOptimizer
        opt = public(inner, initial_scale=2, dynamic_growth_steps=3)
    test_util.assert_rebuilds_alike(opt, {type(opt), public})
