"""Validating and reading `LossScaleOptimizer` settings and configs."""

from tf_lso._src import loss_scale as loss_scale_lib
from tf_lso._src import serialization


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
