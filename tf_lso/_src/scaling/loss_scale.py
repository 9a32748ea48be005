"""TF 2.1-2.8's `LossScale`, `FixedLossScale` and `DynamicLossScale`.

The step (`optimizer/apply_step.py`) calls `update` only on a user's loss
scale (`step_mode`). For a dynamic scale, it checks the gradients itself.
Then `advance` applies `DynamicRule.next`, a pure function.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any
from typing import Literal

import tensorflow as tf

from tf_lso._src.gradients import replicas
from tf_lso._src.scaling import tensor_like
from tf_lso._src.scaling import validation

# The defaults of TF's DynamicLossScale and of TF 2.4's optimizer arguments;
# `optimizer.settings` and `compile_hook` use them too.
DEFAULT_INITIAL_SCALE = 2**15
DEFAULT_GROWTH_STEPS = 2000


@dataclasses.dataclass(frozen=True)
class DynamicRule:
    """`DynamicLossScale`'s rule (see its docstring)."""

    initial: float  # Also where a damaged scale restarts, under XLA.
    period: int
    multiplier: float

    def next(self, scale: tf.Tensor, count: tf.Tensor,
             finite: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """The `(scale, count)` after a step; branch-free, for XLA."""
        should_grow = count + 1 >= self.period
        grown = scale * self.multiplier
        grow = tf.logical_and(should_grow, tf.math.is_finite(grown))
        finite_scale = tf.where(grow, grown, scale)
        finite_count = tf.where(should_grow, tf.zeros_like(count), count + 1)
        backed_off = tf.where(usable(scale),
                              tf.maximum(scale / self.multiplier, 1.0),
                              self.initial)
        return (tf.where(finite, finite_scale, backed_off),
                tf.where(finite, finite_count, tf.zeros_like(count)))


class LossScale(tensor_like.TensorLike, tf.Module, metaclass=abc.ABCMeta):
    """Base class for loss scales.

    A loss scale holds the factor the loss is multiplied by, and decides
    after each step how it changes. Subclasses implement `__call__`, `update`
    and `get_config`. Where TF 2.4 code used the scale as a tensor
    (`tf.convert_to_tensor`, `float()`, `.numpy()`, arithmetic,
    `tf.summary.scalar`, formatting), a loss scale reads as its value.

    >>> loss_scale = tf_lso.experimental.FixedLossScale(128)
    >>> float(loss_scale)
    128.0
    >>> float(loss_scale / 2)
    64.0
    """

    @abc.abstractmethod
    def __call__(self) -> tf.Tensor:
        """Returns the current loss scale as a float32 scalar tensor."""

    @abc.abstractmethod
    def update(self, grads: Any) -> tuple[tf.Operation | None, bool | tf.Tensor]:
        """Updates the loss scale from this step's unscaled gradients.

        Args:
            grads: A nest of unscaled gradients; `None` entries are ignored.

        Returns:
            `(update_op, should_apply_gradients)`. `update_op` is None
            eagerly. `should_apply_gradients` is a Python bool if it is known
            without the gradients, else a bool scalar tensor.
        """

    @abc.abstractmethod
    def get_config(self) -> dict[str, Any]:
        """Returns the constructor arguments of this loss scale as a dict."""

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LossScale:
        """Creates a loss scale of this class from `get_config()`'s dict."""
        return cls(**config)

    def _value(self) -> tf.Tensor:
        return self()


class FixedLossScale(LossScale):
    """A loss scale that never changes.

    It never checks gradients: a non-finite step is applied.

    Args:
        loss_scale_value: A Python int or float, at least 1 and finite as a
            float32.

    Raises:
        ValueError: For any other value, a wrong type included (as in TF).

    >>> loss_scale = tf_lso.experimental.FixedLossScale(1024)
    >>> loss_scale
    FixedLossScale(1024.0)
    >>> float(loss_scale())
    1024.0
    >>> loss_scale.update([tf.constant(float("nan"))])
    (None, True)
    """

    def __init__(self, loss_scale_value: int | float) -> None:
        if not validation.is_python_number(loss_scale_value):
            raise ValueError(
                "`loss_scale_value` must be a Python int or float. Received: "
                f"loss_scale_value={loss_scale_value!r} of type "
                f"{type(loss_scale_value).__name__}. Convert it with float()."
            )
        validation.scale(
            float(loss_scale_value), "loss_scale_value", minimum=1
        )
        super().__init__()
        self._loss_scale_value = float(loss_scale_value)

    def __call__(self) -> tf.Tensor:
        return tf.constant(self._loss_scale_value, dtype=tf.float32)

    def update(self, grads: Any) -> tuple[tf.Operation | None, bool]:
        """Returns a no-op (None eagerly) and a Python True, so callers need
        no `tf.cond`."""
        del grads
        return no_op(), True

    def get_config(self) -> dict[str, Any]:
        """Returns `{'loss_scale_value': <float>}`."""
        return {"loss_scale_value": self._loss_scale_value}

    def __repr__(self) -> str:
        return f"FixedLossScale({self._loss_scale_value})"


class DynamicLossScale(LossScale):
    """A loss scale that grows while gradients stay finite and backs off.

    After `increment_period` finite steps in a row, the scale is multiplied
    by `multiplier` if the result is a finite float32. A non-finite gradient
    on any replica skips the step: the scale becomes `max(scale /
    multiplier, 1)` and the count restarts from 0. The state is two
    variables named as TF's checkpoints name them: `current_loss_scale`
    (float32) and `good_steps` (int64).

    Args:
        initial_loss_scale: The starting loss scale, a positive number.
        increment_period: Finite steps in a row before the scale grows, an
            integer of at least 1.
        multiplier: The growth and back-off factor, at least 1.

    Raises:
        TypeError: If an argument is not a number.
        ValueError: If an argument is out of range.

    >>> loss_scale = tf_lso.experimental.DynamicLossScale(
    ...     initial_loss_scale=4, increment_period=2)
    >>> for grad in [1.0, 1.0, float("inf"), 1.0]:
    ...     _ = loss_scale.update([tf.constant(grad)])
    ...     print(float(loss_scale()))
    4.0
    8.0
    4.0
    4.0
    """

    def __init__(
        self,
        initial_loss_scale: float = DEFAULT_INITIAL_SCALE,
        increment_period: int = DEFAULT_GROWTH_STEPS,
        multiplier: float = 2.0,
    ) -> None:
        super().__init__()
        initial = validation.scale(initial_loss_scale, "initial_loss_scale")
        period = validation.integer(increment_period, "increment_period")
        factor = validation.scale(multiplier, "multiplier", minimum=1)
        self._initial_loss_scale = initial
        self._increment_period = period
        self._multiplier = factor
        self.current_loss_scale = replicas.state_variable(
            initial, tf.float32, "current_loss_scale"
        )
        self.good_steps = replicas.state_variable(0, tf.int64, "good_steps")

    @property
    def initial_loss_scale(self) -> float:
        """The loss scale the variables started from (a Python float)."""
        return self._initial_loss_scale

    @property
    def increment_period(self) -> int:
        """Consecutive finite steps before the scale grows (a Python int)."""
        return self._increment_period

    @property
    def multiplier(self) -> float:
        """The growth and back-off factor (a Python float)."""
        return self._multiplier

    @property
    def rule(self) -> DynamicRule:
        """The `DynamicRule` of these settings."""
        return DynamicRule(self._initial_loss_scale, self._increment_period,
                           self._multiplier)

    # TF's class had these private names, which TF 2.x code and tests read.
    @property
    def _current_loss_scale(self) -> tf.Variable:
        return self.current_loss_scale

    @property
    def _num_good_steps(self) -> tf.Variable:
        return self.good_steps

    def __call__(self) -> tf.Tensor:
        return tf.convert_to_tensor(self.current_loss_scale)

    def update(self, grads: Any) -> tuple[tf.Tensor | None, tf.Tensor]:
        """Grows or backs off the scale, as the class docstring says.

        It works eagerly, in a `tf.function`, and in any strategy context.
        `should_apply_gradients` is a bool scalar tensor: whether every
        replica's gradients are finite (an empty nest is).
        """
        is_finite = replicas.all_finite(grads)
        # The verdict reads no variable: in a tf.compat.v1 graph it may run
        # before they are initialized. The update op checks the scale.
        update_op, _ = advance(self, is_finite)
        return update_op, is_finite

    def get_config(self) -> dict[str, Any]:
        """Returns the three constructor arguments; the state is not config."""
        return {
            "initial_loss_scale": self._initial_loss_scale,
            "increment_period": self._increment_period,
            "multiplier": self._multiplier,
        }

    def __repr__(self) -> str:
        config = (
            f"initial_loss_scale={self._initial_loss_scale}, "
            f"increment_period={self._increment_period}, "
            f"multiplier={self._multiplier})"
        )
        if not tf.executing_eagerly():
            return f"DynamicLossScale({config}"
        return (
            f"DynamicLossScale(current_loss_scale="
            f"{self.current_loss_scale.numpy()}, num_good_steps="
            f"{self.good_steps.numpy()}, {config}"
        )


# TF's TF1-style `MixedPrecisionLossScaleOptimizer` (and so
# `enable_mixed_precision_graph_rewrite`) takes only TF's loss scales, and
# skips steps only for TF's `DynamicLossScale`. As virtual subclasses of
# TF's ABCs, tf_lso's loss scales work there too.
tf.compat.v1.mixed_precision.LossScale.register(LossScale)
tf.compat.v1.mixed_precision.FixedLossScale.register(FixedLossScale)
tf.compat.v1.mixed_precision.DynamicLossScale.register(DynamicLossScale)

# The `update`s that the step replaces with its own check.

StepMode = Literal["fixed", "rule", "update"]


def step_mode(loss_scale: LossScale) -> StepMode:
    """How a loss scale optimizer's step treats `loss_scale`.

    * "fixed": a fixed scale. The step never checks and never skips.
    * "rule": a dynamic scale. The step checks the gradients and applies
      its `DynamicRule` (`advance`).
    * "update": any other loss scale, or a subclass that overrides
      `update`. The step calls its `update(grads)`.
    """
    update = type(loss_scale).update
    if update is FixedLossScale.update:
        return "fixed"
    if update is DynamicLossScale.update:
        return "rule"
    return "update"


def no_op() -> tf.Operation | None:
    """An update op that does nothing: None eagerly, else a `tf.no_op`."""
    return None if tf.executing_eagerly() else tf.no_op()


def usable(scale: tf.Tensor) -> tf.Tensor:
    """Whether `scale` (a float tensor) is positive and finite."""
    return tf.logical_and(tf.math.is_finite(scale), scale > 0)


def advance(loss_scale: DynamicLossScale, is_finite: tf.Tensor,
            active: tf.Tensor | None = None
            ) -> tuple[tf.Tensor | None, tf.Tensor]:
    """Assigns the scale and counter its `rule` gives after a step.

    Where the bool tensor `active` is False, nothing changes (the step passes
    it with gradient accumulation). Returns `(update_op, is_finite)`, as
    `LossScale.update` does. `is_finite` is also False for a damaged scale,
    which `_checked` makes an error.
    """
    scale, count, is_finite = _checked(loss_scale, is_finite, active)
    new_scale, new_count = loss_scale.rule.next(scale, count, is_finite)
    if active is not None:
        new_scale = tf.where(active, new_scale, scale)
        new_count = tf.where(active, new_count, count)
    ops = replicas.assign_state([(loss_scale.current_loss_scale, new_scale),
                                 (loss_scale.good_steps, new_count)])
    if tf.executing_eagerly():
        return None, is_finite
    # A tensor, as TF's update op was, so that `tf.identity(update_op)`
    # works in tf.compat.v1 graphs: the new scale, read after both writes.
    with tf.control_dependencies(ops):
        return tf.identity(new_scale), is_finite


def _checked(loss_scale: DynamicLossScale, is_finite: tf.Tensor,
             active: tf.Tensor | None
             ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """The scale, counter and verdict, once the scale is known usable.

    A corrupt checkpoint may restore a NaN, infinite or non-positive scale,
    which would skip every step, silently, forever. So it is an error
    (ValueError eagerly, an assertion in a graph) before any state changes.
    XLA drops the assertion: the step is skipped, and the rule restarts from
    the initial scale.
    """
    scale = tf.convert_to_tensor(loss_scale.current_loss_scale)
    count = tf.convert_to_tensor(loss_scale.good_steps)
    scale_usable = usable(scale)
    scale_ok = scale_usable
    if active is not None:
        scale_ok = tf.logical_or(scale_ok, tf.logical_not(active))
    if tf.executing_eagerly():
        if not bool(scale_ok):
            raise ValueError(_corrupt_scale_message(float(scale)))
        return scale, count, is_finite
    check = tf.debugging.Assert(
        scale_ok, [_corrupt_scale_message("<shown below>"), scale])
    # Every state change and the apply/skip decision wait for it.
    with tf.control_dependencies([check]):
        scale, count, is_finite = (tf.identity(scale), tf.identity(count),
                                   tf.identity(is_finite))
    return scale, count, tf.logical_and(is_finite, scale_usable)


def any_positive_fixed_scale(value: Any, name: str) -> FixedLossScale:
    """A fixed scale of any positive `value` that is finite as a float32.

    TF 2.4's optimizer arguments allowed scales below 1, which the public
    constructor refuses. A non-number is a TypeError and a bad number a
    ValueError. Both messages name the argument `name`.
    """
    loss_scale = FixedLossScale(1)
    loss_scale._loss_scale_value = validation.scale(value, name)
    return loss_scale


def _corrupt_scale_message(value: Any) -> str:
    return (
        f"The loss scale is {value}, but a loss scale must be positive and "
        "finite. It was probably restored from a corrupt checkpoint. "
        "Restore an earlier checkpoint, or assign a positive finite value "
        "(such as 32768.0) to the loss scale's `current_loss_scale` variable."
    )
