"""Objects that stand where TF 2.x code used a scalar tensor.

`LossScale` objects and `inner_optimizer.ScheduledLearningRate` are
callable, as older code uses them, and read as their current value, as newer
code does.
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf


class TensorLike(abc.ABC):
    """Mixin: reads as the float32 scalar tensor that `_value()` returns."""

    dtype = tf.float32
    shape = tf.TensorShape([])

    @abc.abstractmethod
    def _value(self) -> tf.Tensor:
        """The current value, a float32 scalar tensor."""

    def numpy(self) -> np.ndarray:
        """Returns the current value as a NumPy float32 scalar."""
        return self._value().numpy()

    def __float__(self) -> float:
        return float(self._value())

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        del copy  # Always a new array: the value is read each time.
        return np.asarray(self._value().numpy(), dtype=dtype)

    def __format__(self, format_spec: str) -> str:
        if not format_spec:
            return str(self)
        return format(float(self), format_spec)

    def __neg__(self) -> tf.Tensor:
        return -self._value()

    def __abs__(self) -> tf.Tensor:
        return abs(self._value())


def _tensor_method(op: Callable[[Any, Any], Any],
                   reflected: bool = False) -> Callable[[TensorLike, Any], Any]:
    def method(self: TensorLike, other: Any) -> Any:
        if reflected:
            return op(other, self._value())
        return op(self._value(), other)

    return method


for _name, _op in [
    ("add", operator.add),
    ("sub", operator.sub),
    ("mul", operator.mul),
    ("truediv", operator.truediv),
    ("floordiv", operator.floordiv),
    ("pow", operator.pow),
]:
    setattr(TensorLike, f"__{_name}__", _tensor_method(_op))
    setattr(TensorLike, f"__r{_name}__", _tensor_method(_op, reflected=True))
for _name in ("lt", "le", "gt", "ge"):
    setattr(
        TensorLike, f"__{_name}__", _tensor_method(getattr(operator, _name))
    )


def _convert(value: TensorLike, dtype: Any = None, name: str | None = None,
             as_ref: bool = False) -> tf.Tensor:
    del as_ref  # Converts to a read of the current value.
    return tf.convert_to_tensor(value._value(), dtype=dtype, name=name)


tf.register_tensor_conversion_function(TensorLike, _convert)
