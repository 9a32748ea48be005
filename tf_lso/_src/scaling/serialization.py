"""`get`, `serialize` and `deserialize` for loss scales, and the conversion
of TensorFlow's deprecated `tf.compat.v1.mixed_precision` loss scales."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_lso._src import compat
from tf_lso._src.scaling import loss_scale as loss_scale_lib
from tf_lso._src.scaling import validation

_BUILTIN_CLASSES = {
    "FixedLossScale": loss_scale_lib.FixedLossScale,
    "DynamicLossScale": loss_scale_lib.DynamicLossScale,
}


def serialize(loss_scale: loss_scale_lib.LossScale) -> dict[str, Any]:
    """Serializes a `LossScale` into a Keras-style dict.

    Returns:
        `{'class_name': <class name>, 'config': loss_scale.get_config()}`.

    >>> tf_lso.experimental.serialize(tf_lso.experimental.FixedLossScale(2))
    {'class_name': 'FixedLossScale', 'config': {'loss_scale_value': 2.0}}
    """
    return {
        "class_name": type(loss_scale).__name__,
        "config": loss_scale.get_config(),
    }


def deserialize(
    config: dict[str, Any], custom_objects: dict | None = None
) -> loss_scale_lib.LossScale:
    """Creates a new `LossScale` from the output of `serialize`.

    Args:
        config: A dict with the keys `class_name` and `config`; other keys
            are ignored.
        custom_objects: An optional dict from class names to your own
            `LossScale` subclasses.

    Raises:
        ValueError: For another format or an unknown class.

    >>> tf_lso.experimental.deserialize({
    ...     "class_name": "DynamicLossScale",
    ...     "config": {"initial_loss_scale": 8.0, "increment_period": 10,
    ...                "multiplier": 2.0}})
    DynamicLossScale(current_loss_scale=8.0, num_good_steps=0,
                     initial_loss_scale=8.0, increment_period=10,
                     multiplier=2.0)
    """
    if (
        not isinstance(config, dict)
        or "class_name" not in config
        or "config" not in config
    ):
        raise ValueError(
            "Improper config format: expected a dict with the keys "
            f"'class_name' and 'config'. Received: {config!r}."
        )
    classes: dict[str, Any] = dict(_BUILTIN_CLASSES)
    classes.update(custom_objects or {})
    class_name = config["class_name"]
    if class_name not in classes:
        raise ValueError(
            f"Unknown loss scale: {class_name}. Please ensure this object is "
            "passed to the `custom_objects` argument, e.g. "
            f"deserialize(config, custom_objects={{'{class_name}': "
            f"{class_name}}})."
        )
    return classes[class_name].from_config(config["config"])


def get(identifier: Any) -> loss_scale_lib.LossScale | None:
    """Turns a loss scale identifier into a `LossScale`.

    Args:
        identifier: A Python int or float (a `FixedLossScale`), `'dynamic'`
            (a default `DynamicLossScale`), a `LossScale` (returned as is), a
            dict from `serialize`, a `tf.compat.v1.mixed_precision` loss
            scale (converted), or None.

    Returns:
        A `LossScale`, or None if `identifier` is None.

    Raises:
        ValueError: If `identifier` cannot be interpreted.

    >>> tf_lso.experimental.get(123)
    FixedLossScale(123.0)
    >>> tf_lso.experimental.get("dynamic").initial_loss_scale
    32768.0
    """
    if identifier is None:
        return None
    loss_scale = interpret(identifier, fixed_loss_scale)
    if loss_scale is None:
        raise ValueError(
            f"Could not interpret loss scale identifier: {identifier!r}. Pass "
            "'dynamic', a Python int or float, or a LossScale instance."
        )
    return loss_scale


def fixed_loss_scale(
    number: Any, tf24_arguments: bool = False
) -> loss_scale_lib.FixedLossScale | None:
    """The fixed loss scale a number stands for, or None if it is no number.

    This is the one place that says which numbers are fixed loss scales.
    For `get` and `FixedLossScale`, a Python number of at least 1. For the
    optimizers (`tf24_arguments=True`), any positive number finite in
    float32, as TF had it. Out of range, it raises TypeError or ValueError.
    """
    if tf24_arguments:
        if validation.is_number(number):
            return loss_scale_lib.any_positive_fixed_scale(number,
                                                           "loss_scale")
        return None
    if validation.is_python_number(number):
        return loss_scale_lib.FixedLossScale(number)
    return None


def interpret(
    identifier: Any, fixed: Callable[[Any], loss_scale_lib.LossScale | None]
) -> loss_scale_lib.LossScale | None:
    """The one parser of loss scale identifiers (see `get`), or None. `fixed`
    reads the numbers: callers differ on which they take."""
    if isinstance(identifier, dict):
        return deserialize(identifier)
    if isinstance(identifier, str):
        return loss_scale_lib.DynamicLossScale() if identifier == "dynamic" \
            else None
    if isinstance(identifier, loss_scale_lib.LossScale):
        return identifier
    if is_tensorflow_loss_scale(identifier):
        return from_tensorflow_loss_scale(identifier)
    return fixed(identifier)


def is_tensorflow_loss_scale(value: Any) -> bool:
    """True for TF's deprecated `tf.compat.v1.mixed_precision.LossScale`s,
    not for tf_lso's (registered as their virtual subclasses)."""
    return isinstance(value, tf.compat.v1.mixed_precision.LossScale) and (
        not isinstance(value, loss_scale_lib.LossScale))


def from_tensorflow_loss_scale(value: Any) -> loss_scale_lib.LossScale:
    """Copies a `tf.compat.v1.mixed_precision` Fixed or DynamicLossScale
    (configuration, scale, counter) into a tf_lso one. Any other TF loss
    scale is a TypeError."""
    if isinstance(value, tf.compat.v1.mixed_precision.FixedLossScale):
        return loss_scale_lib.any_positive_fixed_scale(
            float(value()), "loss_scale_value")
    if isinstance(value, tf.compat.v1.mixed_precision.DynamicLossScale):
        converted = loss_scale_lib.DynamicLossScale(
            value.initial_loss_scale, value.increment_period, value.multiplier
        )
        converted.current_loss_scale.assign(value())
        converted.good_steps.assign(compat.tf_dynamic_loss_scale_counter(value))
        return converted
    raise TypeError(
        "Only TensorFlow's FixedLossScale and DynamicLossScale can be "
        f"converted to tf_lso loss scales. Received: {value!r}. Subclass "
        "tf_lso.experimental.LossScale instead."
    )

