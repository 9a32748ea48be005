"""The loss scale optimizers' two config formats. No other module spells
their keys.

`get_config()` writes TF 2.4's format (`tf24_config`). A loss scale that
TF 2.4's arguments cannot describe gets TF 2.1-2.3's (`tf23_config`).
"""

from __future__ import annotations

import typing
from typing import Any

from tf_lso._src.optimizer import settings
from tf_lso._src.scaling import loss_scale as loss_scale_lib
from tf_lso._src.scaling import serialization

# TF 2.4's format: the inner optimizer, then optional settings.
INNER_OPTIMIZER = "inner_optimizer"
TF24_SETTINGS = ("dynamic", "initial_scale", "dynamic_growth_steps")
TF24_KEYS = (INNER_OPTIMIZER, *TF24_SETTINGS)
# TF 2.1-2.3's format: the inner optimizer and the loss scale, both required.
TF23_OPTIMIZER = "optimizer"
TF23_LOSS_SCALE = "loss_scale"
TF23_KEYS = (TF23_OPTIMIZER, TF23_LOSS_SCALE)
# In either format, only when set: Keras 3's `name` and tf_lso's settings.
OPTIONAL_KEYS = ("name", "max_consecutive_skips", "print_overflows",
                 "stop_on_nonfinite_loss")


def checked_config(config: Any, class_name: str) -> dict[str, Any]:
    """Checks `config`'s keys and returns a copy without Keras 3's base
    optimizer settings. Older configs hold them, and they are checked as the
    constructor checks them. A TypeError or ValueError says what is wrong."""
    if not isinstance(config, dict):
        raise TypeError(
            f"{class_name}.from_config() needs a dict, as returned by "
            f"get_config(). Received: config={config!r} of type "
            f"{type(config).__name__}."
        )
    settings.check_keras_keywords(
        {k: v for k, v in config.items() if k in settings.KERAS_BASE_DEFAULTS},
        class_name)
    config = {k: v for k, v in config.items()
              if k not in settings.KERAS_BASE_DEFAULTS}
    legacy = any(key in config for key in TF23_KEYS)
    keys = TF23_KEYS if legacy else TF24_KEYS
    required = TF23_KEYS if legacy else (INNER_OPTIMIZER,)
    unknown = sorted(set(config) - set(keys) - set(OPTIONAL_KEYS), key=str)
    if unknown:
        raise TypeError(
            f"{class_name}.from_config() got unknown keys {unknown}. Received "
            f"keys: {sorted(config, key=str)}. A TF 2.4 config has the keys "
            f"{list(TF24_KEYS)}, a TF 2.1-2.3 config {list(TF23_KEYS)}."
        )
    missing = [k for k in required if k not in config]
    if missing:
        raise ValueError(
            f"{class_name}.from_config() needs the keys {missing}. Received "
            f"keys: {sorted(config, key=str)}. Pass the dict that get_config() "
            "returned."
        )
    return config


def optional_config(name: str | None, max_consecutive_skips: int | None,
                    print_overflows: bool, stop_on_nonfinite_loss: bool
                    ) -> dict[str, Any]:
    """The `OPTIONAL_KEYS` that are set; unset ones are left out, so that
    configs stay equal to TF's."""
    values = (name, max_consecutive_skips, print_overflows or None,
              stop_on_nonfinite_loss or None)
    return {key: value for key, value in zip(OPTIONAL_KEYS, values)
            if value is not None}


def _tf24_settings(described: settings.OptimizerSettings) -> dict[str, Any]:
    return dict(zip(TF24_SETTINGS, (described.dynamic,
                                    described.initial_scale,
                                    described.growth_steps)))


def tf24_config(inner_config: Any, described: settings.OptimizerSettings,
                optional: dict[str, Any]) -> dict[str, Any]:
    """TF 2.4's config: the inner optimizer's, the settings, `optional`."""
    return {INNER_OPTIMIZER: inner_config, **_tf24_settings(described),
            **optional}


def tf23_config(inner_config: Any, loss_scale: loss_scale_lib.LossScale,
                optional: dict[str, Any]) -> dict[str, Any]:
    """TF 2.1-2.3's config: the inner optimizer's, the loss scale's."""
    return {TF23_OPTIMIZER: inner_config,
            TF23_LOSS_SCALE: serialization.serialize(loss_scale), **optional}


class OptimizerConfig(typing.NamedTuple):
    """A checked config of either format, as `read` returns it. TF 2.1-2.3's
    format gives a deserialized `loss_scale` and `tf24_settings={}`. TF 2.4's
    gives the `TF24_SETTINGS` it holds and `loss_scale=None`."""

    inner_optimizer: Any
    loss_scale: loss_scale_lib.LossScale | None
    tf24_settings: dict
    optional: dict

    def as_tf24_settings(self) -> dict[str, Any]:
        """`tf24_settings`, or those of TF 2.1-2.3's loss scale; a custom
        `LossScale` has none and raises a ValueError."""
        if self.loss_scale is None:
            return dict(self.tf24_settings)
        described = settings.describe(self.loss_scale)
        if described is None:
            raise ValueError(
                "Serialized LossScaleOptimizers with a LossScale that is "
                "neither a FixedLossScale nor a DynamicLossScale can no "
                f"longer be deserialized. Got: {self.loss_scale!r}."
            )
        return _tf24_settings(described)

    def as_loss_scale(self) -> loss_scale_lib.LossScale:
        """TF 2.1-2.3's loss scale, or the one TF 2.4's settings make
        (validated as the constructor validates them)."""
        if self.loss_scale is not None:
            return self.loss_scale
        return settings.loss_scale_from_settings(**self.tf24_settings)


def read(config: Any, class_name: str = "LossScaleOptimizer",
         custom_objects: dict[str, Any] | None = None) -> OptimizerConfig:
    """Checks `config` (see `checked_config`) and reads either format.

    `custom_objects` are custom classes for a TF 2.1-2.3 loss scale.

    Raises:
        TypeError, ValueError: See `checked_config`. Also a ValueError for
            a DynamicLossScale whose multiplier is not 2 or an unknown class.
    """
    config = checked_config(config, class_name)
    optional = {k: config[k] for k in OPTIONAL_KEYS if k in config}
    if TF23_OPTIMIZER in config:
        loss_scale = serialization.deserialize(config[TF23_LOSS_SCALE],
                                               custom_objects)
        settings.check_multiplier(loss_scale, "config")
        return OptimizerConfig(config[TF23_OPTIMIZER], loss_scale, {},
                               optional)
    return OptimizerConfig(
        config[INNER_OPTIMIZER], None,
        {k: config[k] for k in TF24_SETTINGS if k in config}, optional)


def upgrade_legacy_config(config: Any, class_name: str = "LossScaleOptimizer"
                          ) -> dict[str, Any]:
    """`config` in TF 2.4's format; a ValueError if its TF 2.1-2.3 loss
    scale has no TF 2.4 settings."""
    read_config = read(config, class_name)
    return {INNER_OPTIMIZER: read_config.inner_optimizer,
            **read_config.as_tf24_settings(), **read_config.optional}
