"""Why steps are skipped, and when a run can no longer learn.

On a skipped step, and only then (the finite path runs none of this), the
optimizer records which variables' gradients were not finite: their count,
the positions of the first few in the `apply_gradients` list, the step, and
how many steps in a row have been skipped. The record lives in a few int64
variables on device (not in checkpoints, whose layout stays TF 2.4's), so
nothing syncs with the host; `Overflow` reads it back with variable names.
"""

import collections
import sys

import tensorflow as tf

from tf_lso._src import compat
from tf_lso._src.gradients import replicas
from tf_lso._src.scaling import validation

# How many offending variables a record names (the count is always exact).
MAX_NAMED = 8

REMEDIES = (
    "Usual remedies: lower the learning rate, clip gradients (`clipnorm` or "
    "`global_clipnorm` on the inner optimizer), compute in bfloat16 instead "
    "of float16, or use a fixed loss scale "
    "(`LossScaleOptimizer(opt, dynamic=False, initial_scale=...)`)."
)


class Overflow(collections.namedtuple(
        "Overflow", "step count variables consecutive_skips")):
    """The last skipped step: what `opt.last_overflow` returns.

    Attributes:
        step: The optimizer's `iterations` when the step was skipped.
        count: How many gradients (one per variable) were not finite.
        variables: The names (Keras `path`, else `name`) of the first
            `min(count, 8)` of those variables, in `apply_gradients` order.
        consecutive_skips: Steps skipped in a row up to that step.
    """


def variable_name(variable):
    return getattr(variable, "path", None) or variable.name


def host_int(variable):
    """A scalar variable's value as a Python int, eagerly.

    Under a distribution strategy too, where `int()` of a `MirroredVariable`
    is a TypeError: `.numpy()` reads every kind of variable (the local copy,
    which every replica keeps equal).
    """
    return int(variable.numpy())


def _stuck_parts(limit, consecutive, step, count, names):
    """The stuck-run message, in parts: the one place it is worded.

    Values in it may be Python values (`stuck_message`) or tensors inside
    a `tf.function` (`OverflowRecord.check` joins them there).

    Args:
        limit: The `max_consecutive_skips` that was exceeded.
        consecutive: How many steps in a row were skipped.
        step: The last skipped step.
        count: How many gradients were not finite at that step.
        names: The (up to 8) names of their variables, joined by ", ".
    """
    return [
        consecutive, " steps in a row were skipped for non-finite gradients "
        f"(more than max_consecutive_skips={limit}): training cannot make "
        "progress. At step ", step, ", ", count, " gradient(s) were not "
        "finite, for: ", names, f". {REMEDIES}",
    ]


def stuck_message(limit, overflow):
    """Why a run of skipped steps stops training: one sentence and remedies.

    Args:
        limit: The `max_consecutive_skips` that was exceeded.
        overflow: The last skipped step, an `Overflow`.
    """
    return "".join(str(part) for part in _stuck_parts(
        limit, overflow.consecutive_skips, overflow.step, overflow.count,
        ", ".join(overflow.variables)))


def is_stuck(overflow, limit, iterations=None):
    """Whether the run of skipped steps that `overflow` ends is too long.

    The one test of a stuck run: more than `limit` steps skipped in a row.

    Args:
        overflow: The last skipped step (`Overflow`), or None.
        limit: `max_consecutive_skips`.
        iterations: The optimizer's step counter now, if asked after the
            fact: the run must still be going on (no step since `overflow`).
    """
    if overflow is None or overflow.consecutive_skips <= limit:
        return False
    return iterations is None or overflow.step + 1 >= iterations


class OverflowRecord(tf.Module):
    """The on-device record of skipped steps, and the stuck-run guard.

    Args:
        max_consecutive_skips: None, or an int K >= 1: the (K+1)-th skipped
            step in a row raises (see `check`).
        print_overflows: Whether skipped steps print their record (see
            `report`).
    """

    def __init__(self, max_consecutive_skips=None, print_overflows=False):
        super().__init__(name="overflow_record")
        if max_consecutive_skips is not None:
            max_consecutive_skips = validation.integer(
                max_consecutive_skips, "max_consecutive_skips")
        if not isinstance(print_overflows, bool):
            raise TypeError(
                "`print_overflows` must be a bool. Received: print_overflows="
                f"{print_overflows!r} of type {type(print_overflows).__name__}."
            )
        self.max_consecutive_skips = max_consecutive_skips
        self.print_overflows = print_overflows
        state = replicas.state_variable
        self.step = state(-1, tf.int64, "overflow_step")
        self.count = state(0, tf.int64, "overflow_count")
        self.indices = state([-1] * MAX_NAMED, tf.int64, "overflow_variables")
        self.names_id = state(-1, tf.int64, "overflow_names_id")
        self.consecutive = state(0, tf.int64, "consecutive_skips")
        # Steps skipped with the loss scale already at its floor of 1 (or
        # below), where backing off cannot help (`LossScaleMonitor`).
        self.floor_skips = state(0, tf.int64, "floor_skips")
        # One tuple of variable names per distinct `apply_gradients` list;
        # a record stores which one its indices refer to.
        self._names = []

    def names_id_for(self, var_list):
        """A Python int identifying the names of `var_list`."""
        names = tuple(variable_name(v) for v in var_list)
        if names not in self._names:
            self._names.append(names)
        return self._names.index(names)

    def record(self, nonfinite, step, names_id, scale):
        """Records a skipped step. Called in the skip branch only.

        Args:
            nonfinite: An int32 vector, one entry per variable: > 0 where the
                gradient (on any replica) was not finite.
            step: The int64 step being skipped.
            names_id: `names_id_for(var_list)`.
            scale: The loss scale the step was taken with (before it backed
                off).

        Returns:
            The int64 number of steps skipped in a row, this one included.
        """
        self.floor_skips.assign_add(tf.cast(scale <= 1.0, tf.int64))
        flags = tf.cast(nonfinite > 0, tf.int32)
        padded = tf.concat([flags, tf.zeros([MAX_NAMED], tf.int32)], 0)
        order = tf.argsort(-padded, stable=True)[:MAX_NAMED]
        indices = tf.where(tf.gather(padded, order) > 0,
                           tf.cast(order, tf.int64), tf.constant(-1, tf.int64))
        step = tf.cast(step, tf.int64)
        consecutive = tf.where(tf.equal(step, self.step + 1),
                               self.consecutive + 1, tf.constant(1, tf.int64))
        self.count.assign(tf.reduce_sum(tf.cast(flags, tf.int64)))
        self.indices.assign(indices)
        self.names_id.assign(tf.constant(names_id, tf.int64))
        self.consecutive.assign(consecutive)
        self.step.assign(step)
        return consecutive

    def report(self, names_id):
        """Prints the record just made, if `print_overflows` (skip branch).

        One line on stderr through `tf.print`: the step, how many gradients
        were not finite and (up to 8 of) their variables. Not under
        `jit_compile=True`, where XLA cannot compile printing.
        """
        if not self.print_overflows or (
                not tf.executing_eagerly() and compat.in_xla_context()):
            return
        names = tf.constant(self._names[names_id])
        offending = tf.gather(
            names, tf.boolean_mask(self.indices, self.indices >= 0))
        tf.print("tf_lso: skipped step", self.step, "-", self.count,
                 "gradient(s) not finite, for:",
                 tf.strings.reduce_join(offending, separator=", "),
                 output_stream=sys.stderr)

    def check(self, consecutive, names_id):
        """Raises if more than `max_consecutive_skips` steps in a row skipped.

        Eagerly a RuntimeError; in a `tf.function` an InvalidArgumentError
        (a `tf.debugging.Assert`). Under `jit_compile=True`, where XLA drops
        assertions, nothing happens: use `LossScaleMonitor` there.
        """
        limit = self.max_consecutive_skips
        if limit is None:
            return
        if tf.executing_eagerly():
            overflow = self.last()
            if is_stuck(overflow, limit):
                raise RuntimeError(stuck_message(limit, overflow))
            return
        if compat.in_xla_context():
            return
        names = tf.constant(self._names[names_id])
        offending = tf.gather(
            names, tf.boolean_mask(self.indices, self.indices >= 0))
        parts = _stuck_parts(
            limit, consecutive, self.step, self.count,
            tf.strings.reduce_join(offending, separator=", "))
        message = tf.strings.join([
            part if isinstance(part, str) or part.dtype == tf.string
            else tf.strings.as_string(part) for part in parts])
        tf.debugging.Assert(consecutive <= limit, [message])

    def last(self):
        """The last skipped step as an `Overflow`, or None. Eager only.

        Raises:
            RuntimeError: Inside a `tf.function`.
        """
        if not tf.executing_eagerly():
            raise RuntimeError(
                "`last_overflow` reads variables back to Python: read it "
                "eagerly (outside tf.function), e.g. after a training step."
            )
        step = int(self.step.numpy())
        if step < 0:
            return None
        names = self._names[int(self.names_id.numpy())]
        variables = tuple(names[i] for i in self.indices.numpy() if i >= 0)
        return Overflow(step, int(self.count.numpy()), variables,
                        int(self.consecutive.numpy()))
