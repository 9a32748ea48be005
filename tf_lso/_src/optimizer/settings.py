"""TF 2.4's `LossScaleOptimizer` arguments: their checks and loss scales.

`dynamic`, `initial_scale` and `dynamic_growth_steps` describe a
`FixedLossScale` or a `DynamicLossScale` with multiplier 2. Only `describe`
decides which loss scales they fit.
"""

from __future__ import annotations

import typing
from typing import Any

import tensorflow as tf

from tf_lso._src.scaling import loss_scale as loss_scale_lib
from tf_lso._src.scaling import validation

# `dynamic=True` doubles and halves the scale.
TF24_MULTIPLIER = 2.0


class OptimizerSettings(typing.NamedTuple):
    """A loss scale as TF 2.4's optimizer arguments describe it. For a fixed
    scale, `growth_steps` (finite steps between increases) and `counter`
    (the int64 variable counting them) are None."""

    dynamic: bool | None
    initial_scale: float | None
    growth_steps: int | None
    counter: tf.Variable | None


NO_SETTINGS = OptimizerSettings(None, None, None, None)


def describe(loss_scale: loss_scale_lib.LossScale) -> OptimizerSettings | None:
    """TF 2.4's arguments for `loss_scale`, or None if they cannot say it."""
    if isinstance(loss_scale, loss_scale_lib.FixedLossScale):
        return OptimizerSettings(
            False, loss_scale.get_config()["loss_scale_value"], None, None)
    if isinstance(loss_scale, loss_scale_lib.DynamicLossScale):
        rule = loss_scale.rule
        if rule.multiplier != TF24_MULTIPLIER:
            return None
        return OptimizerSettings(True, rule.initial, rule.period,
                                 loss_scale.good_steps)
    return None

# Keras 3's base optimizer arguments, which belong to the inner optimizer.
# Keras 3.0-3.3 configs hold them, so these values are still accepted.
KERAS_BASE_DEFAULTS = {
    "weight_decay": None,
    "clipnorm": None,
    "global_clipnorm": None,
    "clipvalue": None,
    "use_ema": False,
    "ema_momentum": 0.99,
    "ema_overwrite_frequency": None,
    "loss_scale_factor": None,
    "gradient_accumulation_steps": None,
}


def check_dynamic(dynamic: Any) -> None:
    """Raises TF 2.4's TypeError unless `dynamic` is a bool. It catches a loss
    scale (TF 2.1-2.3) or an initial scale (Keras 3) passed second."""
    if not isinstance(dynamic, bool):
        raise TypeError(
            '"dynamic" argument to LossScaleOptimizer.__init__ must be a '
            f"bool, but got: {dynamic!r}. To pass a loss scale as the "
            "second argument, use "
            "tf_lso.experimental.LossScaleOptimizer(optimizer, loss_scale); "
            "to set the initial loss scale (Keras 3's second argument), pass "
            "`initial_scale=` by keyword."
        )


def check_keras_keywords(kwargs: dict[str, Any],
                         class_name: str = "LossScaleOptimizer") -> None:
    """Raises Keras 3's ValueError for keywords a loss scale optimizer lacks.
    `kwargs` are those beyond the constructor's own. Keras 3's base optimizer
    arguments pass at their defaults only."""
    for name, value in kwargs.items():
        if name == "learning_rate":  # The inner optimizer's, at any value.
            refused = True
        elif name in KERAS_BASE_DEFAULTS:
            default = KERAS_BASE_DEFAULTS[name]
            refused = (default is None and value is not None) or (
                value != default)
        else:
            continue
        if refused:
            raise ValueError(
                f"{class_name} does not support `{name}`. Instead, set "
                f"`{name}` on the `inner_optimizer`. Received: "
                f"{name}={value!r}."
            )
    unknown = [k for k in kwargs if k not in KERAS_BASE_DEFAULTS]
    if unknown:
        hint = (
            " To pass a TF 2.1-2.3 loss scale, use "
            "tf_lso.experimental.LossScaleOptimizer(optimizer, loss_scale)."
            if "loss_scale" in unknown else
            " Its arguments are inner_optimizer, dynamic, initial_scale, "
            "dynamic_growth_steps, name, max_consecutive_skips, "
            "print_overflows and stop_on_nonfinite_loss."
        )
        raise ValueError(
            f"{class_name} does not support arguments: "
            f"`{'`, `'.join(unknown)}`.{hint}"
        )


def loss_scale_from_settings(
    dynamic: Any = True, initial_scale: Any = None,
    dynamic_growth_steps: Any = None,
) -> loss_scale_lib.FixedLossScale | loss_scale_lib.DynamicLossScale:
    """The `DynamicLossScale` (multiplier 2) or `FixedLossScale` for TF
    2.4's constructor arguments, validated.

    `dynamic` must be a bool. A dynamic scale takes the default for a None
    setting. A fixed scale needs `initial_scale` and no `dynamic_growth_steps`.
    """
    check_dynamic(dynamic)
    if dynamic:
        return loss_scale_lib.DynamicLossScale(
            validation.scale(
                loss_scale_lib.DEFAULT_INITIAL_SCALE if initial_scale is None
                else initial_scale,
                "initial_scale",
            ),
            validation.integer(
                loss_scale_lib.DEFAULT_GROWTH_STEPS
                if dynamic_growth_steps is None
                else dynamic_growth_steps,
                "dynamic_growth_steps",
            ),
            multiplier=TF24_MULTIPLIER,
        )
    if initial_scale is None:
        raise ValueError(
            '"initial_scale" must be specified if "dynamic" is False.'
        )
    if dynamic_growth_steps is not None:
        raise ValueError(
            '"dynamic_growth_steps" must be None if "dynamic" is '
            f"False, but got: {dynamic_growth_steps!r}. Pass it only "
            "with dynamic=True."
        )
    return loss_scale_lib.any_positive_fixed_scale(initial_scale,
                                                   "initial_scale")


def check_multiplier(loss_scale: loss_scale_lib.LossScale,
                     source: str) -> None:
    """Raises a ValueError for a DynamicLossScale whose multiplier is not 2,
    with TF's message for `source` (`'argument'` or `'config'`)."""
    if (
        not isinstance(loss_scale, loss_scale_lib.DynamicLossScale)
        or describe(loss_scale) is not None
    ):
        return
    if source == "argument":
        raise ValueError(
            'When passing a DynamicLossScale to "loss_scale", '
            f"DynamicLossScale.multiplier must be 2. Got: {loss_scale!r}."
            " Write a LossScale subclass for another growth rule."
        )
    raise ValueError(
        "Cannot deserialize LossScaleOptimizer with a DynamicLossScale "
        f"whose multiplier is not 2. Got DynamicLossScale: {loss_scale!r}."
        " Only a multiplier of 2 has a TF 2.4 equivalent."
    )
