"""Checks of the numbers users pass to loss scales and their optimizers.

Only this module decides what counts as a number. A scale lives in a float32
variable, so it is judged by its float32 value: `1e39` is infinite there and
`1e-50` is zero. Step counts must fit an int64 counter.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

# The smallest normal float32. Below it a scale is subnormal (CPU kernels
# flush it to zero) and its reciprocal overflows.
SMALLEST_SCALE = 2.0**-126
_INT64_MAX = 2**63 - 1
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def is_number(value: object) -> bool:
    """Whether `value` is a real number (Python's or NumPy's), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_python_number(value: object) -> bool:
    """Whether `value` is a Python int or float (bools too, as TF's loss
    scale classes allowed)."""
    return isinstance(value, (int, float))


def is_scalar_number(value: object) -> bool:
    """Whether `value` is a numeric scalar, not a bool: Python or NumPy
    scalars, 0-d arrays, eager tensors (as tf_keras legacy configs hold)."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):
        return False
    return array.ndim == 0 and array.dtype.kind in "iuf"


def _number(value: Any, name: str) -> float:
    if not is_number(value):
        raise TypeError(
            f"`{name}` must be a number. Received: {name}={value!r} of type "
            f"{type(value).__name__}."
        )
    return float(value)


def scale(value: Any, name: str, minimum: float = SMALLEST_SCALE) -> float:
    """Returns `value` as a Python float if its float32 is a usable scale.

    `minimum` is the smallest accepted float32 value (1 where TF required
    it). `name` is for messages.

    Raises:
        TypeError: If `value` is not a number.
        ValueError: If its float32 value is not finite or below `minimum`.
    """
    number = _number(value, name)
    with np.errstate(over="ignore", under="ignore"):
        as_float32 = float(np.float32(number))
    if math.isfinite(as_float32) and as_float32 >= minimum:
        return number
    received = f"{name}={value!r}"
    if as_float32 != number and not math.isnan(number):
        received += f", which is {as_float32!r} as a float32"
    bound = "at least 1" if minimum == 1 else "positive and finite"
    raise ValueError(
        f"`{name}` must be {bound}. Received: {received}. Loss scales are "
        f"float32: pass a number from {minimum:.8g} to {_FLOAT32_MAX:.8g}."
    )


def integer(value: Any, name: str, minimum: int = 1) -> int:
    """Returns `value` as an int. Integral floats such as 2.0 pass, since TF
    2.4's tests passed `dynamic_growth_steps=2.0`. `name` is for messages.

    Raises:
        TypeError: If `value` is not a number.
        ValueError: If it is not integral, below `minimum` or above int64.
    """
    if not is_number(value):
        raise TypeError(
            f"`{name}` must be an integer. Received: {name}={value!r} of type "
            f"{type(value).__name__}."
        )
    integral = isinstance(value, numbers.Integral) or float(value).is_integer()
    if not integral or not minimum <= value <= _INT64_MAX:
        raise ValueError(
            f"`{name}` must be an integer of at least {minimum} (it is "
            f"counted in int64). Received: {name}={value!r}. Integral floats "
            f"such as 2.0 are accepted."
        )
    return int(value)
