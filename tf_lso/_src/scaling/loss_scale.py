"""`LossScale`, `FixedLossScale` and `DynamicLossScale`.

The loss scale classes of TF 2.1-2.8 (`tf.mixed_precision.experimental` and
`tf.train.experimental`), rebuilt on `tf.Module`. Both concrete classes share
one interface, `__call__()` and `update(grads)`, so the optimizer never needs
to know which one it holds.
"""

from __future__ import annotations

import abc
import typing
from typing import Any

import tensorflow as tf

from tf_lso._src.gradients import replicas
from tf_lso._src.scaling import tensor_like
from tf_lso._src.scaling import validation

# The defaults of TF's DynamicLossScale and of TF 2.4's optimizer arguments;
# `optimizer.settings` and `compile_hook` use them too.
DEFAULT_INITIAL_SCALE = 2**15
DEFAULT_GROWTH_STEPS = 2000


class OptimizerSettings(typing.NamedTuple):
    """A loss scale as TF 2.4's optimizer arguments describe it.

    Attributes:
        dynamic: Whether the scale changes during training.
        initial_scale: The initial (for a fixed scale: the only) value.
        growth_steps: Finite steps between increases; None when fixed.
        counter: The int64 variable counting finite steps; None when fixed.

    A loss scale that these arguments cannot describe has none (see
    `LossScale._optimizer_settings`); an optimizer then reports None for all
    four.
    """

    dynamic: bool | None
    initial_scale: float | None
    growth_steps: int | None
    counter: tf.Variable | None


class LossScale(tensor_like.TensorLike, tf.Module, metaclass=abc.ABCMeta):
    """Base class for loss scales.

    A loss scale holds the factor that the loss is multiplied by before
    gradients are computed, and decides after each step how that factor
    changes. Subclasses implement `__call__`, `update` and `get_config`.

    A loss scale can also be used where TF 2.4 code used the loss scale
    tensor: `tf.convert_to_tensor(loss_scale)`, `float(loss_scale)`,
    `loss_scale.numpy()`, arithmetic such as `loss_scale * 2`,
    `tf.summary.scalar` and string formatting all read its current value.

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
            grads: A nested structure of gradients (tensors, `IndexedSlices`
                or `None`, which is ignored). They must already be unscaled.

        Returns:
            A pair `(update_op, should_apply_gradients)`. `update_op` is `None`
            in eager mode and an op otherwise; `should_apply_gradients` is a
            bool (a Python bool when it is known without looking at `grads`,
            else a bool scalar tensor) saying whether the step may be applied.
        """

    @abc.abstractmethod
    def get_config(self) -> dict[str, Any]:
        """Returns the constructor arguments of this loss scale as a dict."""

    def _update_packed(self, packed):
        """`update` for gradients the optimizer packed (`packing.Packed`).

        A user's subclass sees the gradients as they are; tf_lso's own loss
        scales only ask whether they are finite, which the packed values
        answer with fewer ops.

        Args:
            packed: The gradients.
        """
        return self.update(packed.unpack())

    def _update_window(self, packed, window_end, overflowed):
        """`update` for one call of a gradient accumulation window.

        The state changes at most once a window: it backs off at the
        window's first non-finite call, and counts a good step at the end
        of a window that had none.

        Args:
            packed: The window's sums so far, this call's gradients included.
            window_end: A bool tensor: whether this call ends the window.
            overflowed: The bool variable that says whether an earlier call
                of this window was not finite.

        Returns:
            `(update_op, should_apply, first_overflow)`: whether this call
            accumulates (or applies) its gradients, and whether it is the
            window's first non-finite call (the one that counts the skip).
        """
        del packed, window_end, overflowed
        raise NotImplementedError(
            "Gradient accumulation (`gradient_accumulation_steps` on the "
            "inner optimizer) needs a FixedLossScale or DynamicLossScale. "
            f"Received: loss_scale={self!r}. Accumulate gradients "
            "yourself, or use one of those two classes."
        )

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LossScale:
        """Creates a loss scale from the output of `get_config()`.

        Args:
            config: A dict of constructor arguments.

        Returns:
            A new loss scale of this class.
        """
        return cls(**config)

    def _optimizer_settings(self):
        """What an optimizer reports about this loss scale.

        Returns an `OptimizerSettings` for the optimizer properties of the
        same names, or None when this loss scale cannot be described with the
        TF 2.4 optimizer arguments.
        """
        return None

    def _value(self):
        return self()


class FixedLossScale(LossScale):
    """A loss scale that never changes.

    Args:
        loss_scale_value: A Python int or float, at least 1 and finite as a
            float32. Gradients are never checked for finiteness: a non-finite
            step is applied.

    Raises:
        ValueError: If `loss_scale_value` is not a Python int or float, is
            below 1 (the exception type TF used for both), or is infinite or
            NaN as a float32 (TF accepted those).

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

    @classmethod
    def _optimizer_scale(cls, value, name):
        """A fixed scale as TF 2.4's optimizer arguments allow it.

        Any positive value that is finite as a float32, below 1 too (the
        public constructor requires at least 1, as TF's class did).

        Args:
            value: The number the user passed.
            name: The argument it came from, for messages.

        Raises:
            TypeError: If `value` is not a number.
            ValueError: If its float32 value is not positive and finite.
        """
        instance = cls.__new__(cls)
        LossScale.__init__(instance)
        instance._loss_scale_value = validation.scale(value, name)
        return instance

    def __call__(self):
        return tf.constant(self._loss_scale_value, dtype=tf.float32)

    def update(self, grads: Any) -> tuple[tf.Operation | None, bool]:
        """Does nothing: a fixed loss scale applies every step.

        Args:
            grads: Ignored.

        Returns:
            `(update_op, True)`: `update_op` is None in eager mode and a no-op
            otherwise; `True` is a Python bool, so callers need no `tf.cond`.
        """
        del grads
        return tf.no_op() if not tf.executing_eagerly() else None, True

    def _update_packed(self, packed):
        return self.update(packed.values)

    def _update_window(self, packed, window_end, overflowed):
        del window_end, overflowed  # A fixed scale never skips (TF 2.4).
        update_op, should_apply = self.update(packed.values)
        return update_op, should_apply, False

    def get_config(self) -> dict[str, Any]:
        """Returns `{'loss_scale_value': <float>}`."""
        return {"loss_scale_value": self._loss_scale_value}

    def _optimizer_settings(self):
        return OptimizerSettings(False, self._loss_scale_value, None, None)

    def __repr__(self):
        return f"FixedLossScale({self._loss_scale_value})"


class DynamicLossScale(LossScale):
    """A loss scale that grows while gradients stay finite and backs off.

    After `increment_period` consecutive steps with finite gradients the scale
    is multiplied by `multiplier` (only if the result is a finite float32, so
    it saturates instead of overflowing). A step with a non-finite gradient is
    skipped, the scale becomes `max(scale / multiplier, 1)` and the count of
    good steps starts again from 0. Under a distribution strategy, a
    non-finite gradient on any replica makes every replica skip.

    The state lives in two variables, whose names are the checkpoint format of
    TF's class: `current_loss_scale` (float32) and `good_steps` (int64).

    Args:
        initial_loss_scale: The starting loss scale, a positive number.
        increment_period: How many consecutive finite steps double (multiply)
            the scale, an integer of at least 1.
        multiplier: The growth and back-off factor, a number of at least 1.

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
    def _current_loss_scale(self):
        return self.current_loss_scale

    @property
    def _num_good_steps(self):
        return self.good_steps

    def __call__(self):
        return tf.convert_to_tensor(self.current_loss_scale)

    def update(self, grads: Any) -> tuple[tf.Tensor | None, tf.Tensor]:
        """Advances or backs off the loss scale, see the class docstring.

        Works in eager mode, inside `tf.function`, and under a distribution
        strategy in either a replica or a cross-replica context.

        Args:
            grads: A nested structure of unscaled gradients; `None` entries are
                ignored and an empty structure counts as finite.

        Returns:
            `(update_op, should_apply_gradients)`, where the second element is
            a bool scalar tensor, True iff all gradients on all replicas are
            finite.
        """
        is_finite = replicas.all_finite(grads)
        # TF 2.4's `should_apply` reads no variable (in a tf.compat.v1 graph
        # it runs before the variables are initialized). The check of the
        # scale itself is part of the update op.
        update_op, _ = self._update_state(is_finite)
        return update_op, is_finite

    def _update_packed(self, packed):
        return self._update_state(replicas.all_finite(packed))

    def _update_window(self, packed, window_end, overflowed):
        overflowed = tf.convert_to_tensor(overflowed)
        # A damaged scale counts as an overflow (see `_update_state`).
        is_finite = tf.logical_and(
            replicas.all_finite(packed),
            _usable(tf.convert_to_tensor(self.current_loss_scale)))
        should_apply = tf.logical_and(is_finite, tf.logical_not(overflowed))
        first_overflow = tf.logical_not(tf.logical_or(is_finite, overflowed))
        update_op, should_apply = self._update_state(
            should_apply,
            tf.logical_or(first_overflow,
                          tf.logical_and(window_end, should_apply)))
        return update_op, should_apply, first_overflow

    def _update_state(self, is_finite, active=None):
        """Assigns the next scale and counter; branch-free, so XLA-friendly.

        Args:
            is_finite: A bool scalar tensor: this step's verdict.
            active: None, or a bool scalar tensor: where False, nothing
                changes (gradient accumulation: see `_update_window`).

        Returns:
            `(update_op, is_finite)`, as `update` does.
        """
        scale = tf.convert_to_tensor(self.current_loss_scale)
        count = tf.convert_to_tensor(self.good_steps)
        # A scale this class computes is always positive and finite, but a
        # restored or assigned one may not be (a corrupt checkpoint): NaN or
        # inf would skip every step, silently and forever; 0 and negative
        # values are no loss scales either. Checked before any state changes.
        usable = _usable(scale)
        scale_ok = usable
        if active is not None:
            scale_ok = tf.logical_or(scale_ok, tf.logical_not(active))
        if tf.executing_eagerly():
            if not bool(scale_ok):
                raise ValueError(_corrupt_scale_message(float(scale)))
        else:
            check = tf.debugging.Assert(
                scale_ok, [_corrupt_scale_message("<shown below>"), scale]
            )
            # Every state change and the apply/skip decision wait for it.
            with tf.control_dependencies([check]):
                scale, count, is_finite = (
                    tf.identity(scale), tf.identity(count),
                    tf.identity(is_finite),
                )
            # XLA drops the assertion: there the step is skipped and the
            # scale restarts from its initial value (`_update_if_not_finite`).
            is_finite = tf.logical_and(is_finite, usable)
        finite_scale, finite_count = self._update_if_finite(scale, count)
        new_scale = tf.where(
            is_finite, finite_scale, self._update_if_not_finite(scale)
        )
        new_count = tf.where(is_finite, finite_count, tf.zeros_like(count))
        if active is not None:  # Only at the end of an accumulation window.
            new_scale = tf.where(active, new_scale, scale)
            new_count = tf.where(active, new_count, count)
        ops = [
            self.current_loss_scale.assign(new_scale, read_value=False),
            self.good_steps.assign(new_count, read_value=False),
        ]
        if tf.executing_eagerly():
            return None, is_finite
        # A Tensor, as TF's update op was, so `tf.identity(update_op)` works
        # in tf.compat.v1 graphs: the new scale, read after both writes.
        with tf.control_dependencies(ops):
            return tf.identity(new_scale), is_finite

    def _update_if_finite(self, scale, count):
        should_grow = count + 1 >= self._increment_period
        grown = scale * self._multiplier
        grow = tf.logical_and(should_grow, tf.math.is_finite(grown))
        new_scale = tf.where(grow, grown, scale)
        new_count = tf.where(should_grow, tf.zeros_like(count), count + 1)
        return new_scale, new_count

    def _update_if_not_finite(self, scale):
        backed_off = tf.maximum(scale / self._multiplier, 1.0)
        # An unusable scale reaches this only under XLA, which drops the
        # assertion in `_update_state`: it restarts from the initial value.
        return tf.where(_usable(scale), backed_off, self._initial_loss_scale)

    def get_config(self) -> dict[str, Any]:
        """Returns the constructor arguments; the current state is not config.

        Returns:
            `{'initial_loss_scale', 'increment_period', 'multiplier'}`.
        """
        return {
            "initial_loss_scale": self._initial_loss_scale,
            "increment_period": self._increment_period,
            "multiplier": self._multiplier,
        }

    def _optimizer_settings(self):
        if self._multiplier != 2:
            return None
        return OptimizerSettings(True, self._initial_loss_scale,
                                 self._increment_period, self.good_steps)

    def __repr__(self):
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


# TensorFlow's TF1-style `MixedPrecisionLossScaleOptimizer` (and so its
# `enable_mixed_precision_graph_rewrite`) takes only its own deprecated loss
# scales, and skips steps only for a `DynamicLossScale` of its own. The
# interfaces are the same (`__call__`, `update`), so tf_lso's classes are
# registered as virtual subclasses of TF's (public ABCs): TF1-style code
# keeps working with them, and nothing changes for TF's own objects.
tf.compat.v1.mixed_precision.LossScale.register(LossScale)
tf.compat.v1.mixed_precision.FixedLossScale.register(FixedLossScale)
tf.compat.v1.mixed_precision.DynamicLossScale.register(DynamicLossScale)


def _usable(scale):
    """Whether `scale` (a float tensor) is positive and finite."""
    return tf.logical_and(tf.math.is_finite(scale), scale > 0)


def _corrupt_scale_message(value):
    return (
        f"The loss scale is {value}, but a loss scale must be positive and "
        "finite. It was probably restored from a corrupt checkpoint. "
        "Restore an earlier checkpoint, or assign a positive finite value "
        "(such as 32768.0) to the loss scale's `current_loss_scale` variable."
    )
