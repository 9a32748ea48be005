"""Validating and reading `LossScaleOptimizer` settings and configs."""

import numbers

from tf_lso._src import loss_scale as loss_scale_lib
from tf_lso._src import serialization


def positive_scale(value, name):
    if isinstance(value, (bool, str)) or not isinstance(value, numbers.Real):
        raise TypeError(
            f'"{name}" must be a number, but got: {value!r} of type '
            f"{type(value).__name__}."
        )
    if not 0 < float(value) < float("inf"):
        raise ValueError(
            f'"{name}" must be positive and finite, but got: {value!r}.'
        )
    return float(value)


def growth_steps(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            '"dynamic_growth_steps" must be an int, but got: '
            f"{value!r} of type {type(value).__name__}."
        )
    if value < 1:
        raise ValueError(
            f'"dynamic_growth_steps" must be at least 1, but got: {value!r}.'
        )
    return int(value)


def check_config_multiplier(loss_scale):
    """Rejects a deserialized DynamicLossScale whose multiplier is not 2."""
    if (
        isinstance(loss_scale, loss_scale_lib.DynamicLossScale)
        and loss_scale.multiplier != 2
    ):
        raise ValueError(
            "Cannot deserialize LossScaleOptimizer with a DynamicLossScale "
            f"whose multiplier is not 2. Got DynamicLossScale: {loss_scale!r}."
            " Only a multiplier of 2 has a TF 2.4 equivalent."
        )


def upgrade_legacy_config(config):
    """Turns a TF <= 2.3 config (`optimizer`, `loss_scale`) into TF 2.4's."""
    config = dict(config)
    if "loss_scale" not in config:
        return config
    loss_scale = serialization.deserialize(config.pop("loss_scale"))
    check_config_multiplier(loss_scale)
    settings = loss_scale._optimizer_settings()
    if settings is None:
        raise ValueError(
            "Serialized LossScaleOptimizers with a LossScale that is neither "
            "a FixedLossScale nor a DynamicLossScale can no longer be "
            f"deserialized. Got: {loss_scale!r}."
        )
    dynamic, initial_scale, growth_steps, _ = settings
    config.update(
        dynamic=dynamic,
        initial_scale=initial_scale,
        dynamic_growth_steps=growth_steps,
    )
    config["inner_optimizer"] = config.pop("optimizer")
    return config
