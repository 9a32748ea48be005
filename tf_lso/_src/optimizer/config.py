"""The config formats of the loss scale optimizers, read in one place.

`get_config()` writes TF 2.4's keys (`TF24_KEYS`: the inner optimizer and
TF 2.4's settings, with `tf24_config`), or TF 2.1-2.3's (`TF23_KEYS`: the
inner optimizer and a serialized loss scale, with `tf23_config`) for a loss
scale that TF 2.4's arguments cannot describe; tf_lso's own settings and
Keras 3's `name` are added only when set (`OPTIONAL_KEYS`). `read` checks a
config and reads either format; nothing else spells the keys. The inner
optimizer's config is read by its kind (`wrapping.deserialize`).
"""

from __future__ import annotations

import typing
from typing import Any

from tf_lso._src.optimizer import settings
from tf_lso._src.scaling import loss_scale as loss_scale_lib
from tf_lso._src.scaling import serialization

# The keys of TF 2.4's config: the inner optimizer's config, and TF 2.4's
# settings (each optional).
INNER_OPTIMIZER = "inner_optimizer"
TF24_SETTINGS = ("dynamic", "initial_scale", "dynamic_growth_steps")
TF24_KEYS = (INNER_OPTIMIZER, *TF24_SETTINGS)
# The keys of TF <= 2.3's config: the inner optimizer's config, and the
# serialized loss scale (both required).
TF23_OPTIMIZER = "optimizer"
TF23_LOSS_SCALE = "loss_scale"
TF23_KEYS = (TF23_OPTIMIZER, TF23_LOSS_SCALE)
# Keys in either format's config only when set: Keras 3's `name`, and
# tf_lso's own settings.
OPTIONAL_KEYS = ("name", "max_consecutive_skips", "print_overflows",
                 "stop_on_nonfinite_loss")


def checked_config(config: Any, class_name: str) -> dict[str, Any]:
    """A copy of `config` after checking its keys.

    Keras 3's base optimizer settings, which older Keras 3 configs hold, are
    checked as the constructor checks them, and left out.

    Args:
        config: What `from_config` received.
        class_name: The class being built, for messages.

    Raises:
        TypeError: If `config` is not a dict or has keys that are neither
            TF 2.4's nor TF <= 2.3's (nor `OPTIONAL_KEYS`).
        ValueError: If the optimizer key is missing, or for a base
            optimizer setting that is not its default.
    """
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
    """The config entries beyond TF's that are set (`OPTIONAL_KEYS`).

    Unset ones are left out, so configs stay equal to TF's.

    Args:
        name: Keras 3's `name`, if one was passed (else None).
        max_consecutive_skips: tf_lso's setting.
        print_overflows: tf_lso's setting.
        stop_on_nonfinite_loss: tf_lso's setting.
    """
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
    """A checked config of either format, as `read` returns it.

    Attributes:
        inner_optimizer: The serialized inner optimizer.
        loss_scale: TF 2.1-2.3's format: its `LossScale` (deserialized);
            TF 2.4's: None.
        tf24_settings: TF 2.4's format: those of `dynamic`, `initial_scale`
            and `dynamic_growth_steps` that it has; TF 2.1-2.3's: `{}`.
        optional: The `OPTIONAL_KEYS` it has.
    """

    inner_optimizer: Any
    loss_scale: loss_scale_lib.LossScale | None
    tf24_settings: dict
    optional: dict

    def as_tf24_settings(self) -> dict[str, Any]:
        """`tf24_settings`, or those of TF 2.1-2.3's loss scale.

        Raises:
            ValueError: If the loss scale has none (a custom `LossScale`).
        """
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
        """TF 2.1-2.3's loss scale, or the one TF 2.4's settings make.

        The settings are validated as the TF 2.4 constructor validates them.
        """
        if self.loss_scale is not None:
            return self.loss_scale
        return settings.loss_scale_from_settings(**self.tf24_settings)


def read(config: Any, class_name: str = "LossScaleOptimizer",
         custom_objects: dict[str, Any] | None = None) -> OptimizerConfig:
    """Checks `config` (see `checked_config`) and reads either format.

    Args:
        config: What `from_config` received.
        class_name: The class being built, for messages.
        custom_objects: Custom classes for a TF 2.1-2.3 loss scale (TF
            2.4's `from_config` passed none there).

    Returns:
        An `OptimizerConfig`.

    Raises:
        TypeError, ValueError: See `checked_config`; also a ValueError for
            a DynamicLossScale whose multiplier is not 2, or an unknown
            loss scale class.
    """
    config = checked_config(config, class_name)
    optional = {k: config[k] for k in OPTIONAL_KEYS if k in config}
    if TF23_OPTIMIZER in config:  # TF 2.1-2.3's format.
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
    """A config as TF 2.4's: TF 2.1-2.3's upgraded, TF 2.4's as it is.

    Raises:
        ValueError: For a TF 2.1-2.3 loss scale with no TF 2.4 settings.
    """
    read_config = read(config, class_name)
    return {INNER_OPTIMIZER: read_config.inner_optimizer,
            **read_config.as_tf24_settings(), **read_config.optional}
