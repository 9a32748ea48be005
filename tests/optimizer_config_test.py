"""Tests for tf_lso._src.optimizer_config: argument checks and old configs."""

import pytest

from tf_lso._src import loss_scale as loss_scale_lib
from tf_lso._src import optimizer_config


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


def test_multiplier_other_than_2_is_rejected():
    with pytest.raises(ValueError, match="multiplier is not 2"):
        optimizer_config.check_multiplier(
            loss_scale_lib.DynamicLossScale(multiplier=4.0), "config"
        )


def test_multiplier_message_for_a_constructor_argument():
    with pytest.raises(ValueError, match="multiplier must be 2"):
        optimizer_config.check_multiplier(
            loss_scale_lib.DynamicLossScale(multiplier=4.0), "argument"
        )
    optimizer_config.check_multiplier(
        loss_scale_lib.DynamicLossScale(multiplier=2.0), "argument")
    optimizer_config.check_multiplier(
        loss_scale_lib.FixedLossScale(4.0), "config")
