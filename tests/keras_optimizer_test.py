"""Tests for tf_lso._src.inner.kinds.keras_optimizer: TF 2.x configs.

The kind's behaviour in training is tested with the other kinds
(inner_optimizer_test.py) and through the optimizer classes.
"""

import copy

import keras

from tf_lso._src.inner.kinds import keras_optimizer


def test_tf2_inner_config_upgrade():
    schedule = {"class_name": "PiecewiseConstantDecay",
                "config": {"boundaries": [2], "values": [1.0, 0.5],
                           "name": None}}
    config = {"class_name": "Adam",
              "config": {"learning_rate": schedule, "decay": 0.0,
                         "beta_1": 0.5}}
    before = copy.deepcopy(config)
    upgraded = keras_optimizer.upgrade_tf2_config(config)
    assert config == before
    assert set(upgraded["config"]) == {"learning_rate", "beta_1"}
    learning_rate = upgraded["config"]["learning_rate"]
    assert isinstance(learning_rate,
                      keras.optimizers.schedules.PiecewiseConstantDecay)
    assert float(learning_rate(3)) == 0.5  # Callable: it has a name.


def test_tf2_inner_config_keeps_a_nonzero_decay():
    config = {"class_name": "SGD", "config": {"decay": 0.1}}
    assert keras_optimizer.upgrade_tf2_config(config) == config


def test_keras3_inner_config_is_unchanged():
    config = keras.optimizers.serialize(keras.optimizers.SGD(
        keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)))
    assert keras_optimizer.upgrade_tf2_config(config) == config
