"""Why steps are skipped, when a run can no longer learn, and the warnings.

Only a skipped step records, in int64 variables on device (so nothing
syncs with the host): which variables' gradients were not finite, the step,
how many steps in a row were skipped, and whether the loss itself was not
finite. `Overflow` reads the record back with variable names.
`LossScalingWarning` says when loss scaling is used in a way that trains
wrongly.
"""

from __future__ import annotations

import collections
import inspect
import os
import sys
import warnings
from collections.abc import Callable
from collections.abc import Iterable
from typing import Any

import keras
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


# The causes of a skipped step, as `OverflowRecord.cause` stores them.
UNKNOWN_CAUSE, GRADIENTS, LOSS = -1, 0, 1
CAUSES = {UNKNOWN_CAUSE: None, GRADIENTS: "gradients", LOSS: "loss"}

LOSS_ADVICE = (
    "lowering the loss scale cannot help; look at the inputs and the model "
    "(bad data, a division by zero, a log of 0)."
)


class Overflow(collections.namedtuple(
        "Overflow", "step count variables consecutive_skips cause",
        defaults=(None,))):
    """The last skipped step: what `opt.last_overflow` returns.

    Attributes:
        step: The optimizer's `iterations` when the step was skipped.
        count: How many gradients were not finite.
        variables: The names (Keras `path`, else `name`) of the first
            `min(count, 8)` of their variables, in `apply_gradients` order.
        consecutive_skips: Steps skipped in a row up to that step.
        cause: `"loss"` if the loss itself was not finite on any replica,
            which no loss scale helps; `"gradients"` if only the gradients
            overflowed at this scale; None if the optimizer did not see the
            loss (only `apply_gradients` was called).
    """


def variable_name(variable: Any) -> str:
    return getattr(variable, "path", None) or variable.name


def host_int(variable: Any) -> int:
    """A scalar variable's value as a Python int, eagerly; under a strategy
    too, where `int()` of a `MirroredVariable` is a TypeError."""
    return int(variable.numpy())


class OverflowRecord(tf.Module):
    """The on-device record of skipped steps, and the stuck-run guard.
    Its arguments are the optimizer's of the same names."""

    def __init__(self, max_consecutive_skips: int | None = None,
                 print_overflows: bool = False,
                 stop_on_nonfinite_loss: bool = False) -> None:
        super().__init__(name="overflow_record")
        if max_consecutive_skips is not None:
            max_consecutive_skips = validation.integer(
                max_consecutive_skips, "max_consecutive_skips")
        for name, value in (("print_overflows", print_overflows),
                            ("stop_on_nonfinite_loss",
                             stop_on_nonfinite_loss)):
            if not isinstance(value, bool):
                raise TypeError(
                    f"`{name}` must be a bool. Received: {name}={value!r} of "
                    f"type {type(value).__name__}."
                )
        self.max_consecutive_skips = max_consecutive_skips
        self.print_overflows = print_overflows
        self.stop_on_nonfinite_loss = stop_on_nonfinite_loss
        state = replicas.state_variable
        self.step = state(-1, tf.int64, "overflow_step")
        self.count = state(0, tf.int64, "overflow_count")
        self.indices = state([-1] * MAX_NAMED, tf.int64, "overflow_variables")
        self.names_id = state(-1, tf.int64, "overflow_names_id")
        self.consecutive = state(0, tf.int64, "consecutive_skips")
        # Steps skipped with the loss scale already at its floor of 1 (or
        # below), where backing off cannot help (`LossScaleMonitor`).
        self.floor_skips = state(0, tf.int64, "floor_skips")
        # The last skipped step's cause (`CAUSES`), the skipped steps in a
        # row up to it whose loss was not finite, and all such steps.
        self.cause = state(UNKNOWN_CAUSE, tf.int64, "overflow_cause")
        self.consecutive_loss = state(0, tf.int64, "consecutive_loss_skips")
        self.loss_skips = state(0, tf.int64, "nonfinite_loss_skips")
        # One tuple of variable names per distinct `apply_gradients` list;
        # a record stores which one its indices refer to.
        self.variable_names: list[tuple[str, ...]] = []

    def names_id_for(self, var_list: Iterable[Any]) -> int:
        """A Python int identifying the names of `var_list`."""
        names = tuple(variable_name(v) for v in var_list)
        if names not in self.variable_names:
            self.variable_names.append(names)
        return self.variable_names.index(names)

    def skipped(self, flags: tf.Tensor, step: tf.Tensor, names_id: int,
                scale: tf.Tensor, *, loss_seen: bool) -> None:
        """Records a skipped step, prints it and stops a stuck run.

        `flags` is an int32 vector, > 0 where a variable's gradient was not
        finite on any replica, then, if `loss_seen`, one entry for the loss.
        `scale` is the one the step was taken with.
        """
        nonfinite, loss_nonfinite = (flags[:-1], flags[-1]) if loss_seen else (
            flags, None)
        self.floor_skips.assign_add(tf.cast(scale <= 1.0, tf.int64))
        if loss_nonfinite is None:
            cause = tf.constant(UNKNOWN_CAUSE, tf.int64)
        else:
            cause = tf.where(loss_nonfinite > 0,
                             tf.constant(LOSS, tf.int64),
                             tf.constant(GRADIENTS, tf.int64))
        is_loss = tf.equal(cause, LOSS)
        flags = tf.cast(nonfinite > 0, tf.int32)
        padded = tf.concat([flags, tf.zeros([MAX_NAMED], tf.int32)], 0)
        order = tf.argsort(-padded, stable=True)[:MAX_NAMED]
        indices = tf.where(tf.gather(padded, order) > 0,
                           tf.cast(order, tf.int64), tf.constant(-1, tf.int64))
        step = tf.cast(step, tf.int64)
        in_a_row = tf.equal(step, self.step + 1)
        consecutive = tf.where(in_a_row, self.consecutive + 1,
                               tf.constant(1, tf.int64))
        consecutive_loss = tf.where(
            is_loss,
            tf.where(in_a_row, self.consecutive_loss + 1,
                     tf.constant(1, tf.int64)),
            tf.constant(0, tf.int64))
        self.cause.assign(cause)
        self.consecutive_loss.assign(consecutive_loss)
        self.loss_skips.assign_add(tf.cast(is_loss, tf.int64))
        self.count.assign(tf.reduce_sum(tf.cast(flags, tf.int64)))
        self.indices.assign(indices)
        self.names_id.assign(tf.constant(names_id, tf.int64))
        self.consecutive.assign(consecutive)
        self.step.assign(step)
        self._print(names_id)
        self._stop_if_stuck(consecutive, names_id)

    def _offending(self, names_id: int) -> tf.Tensor:
        """The names the record holds (of the variables whose gradients
        were not finite), joined by ", ": a string tensor."""
        names = tf.constant(self.variable_names[names_id])
        return tf.strings.reduce_join(
            tf.gather(names, tf.boolean_mask(self.indices, self.indices >= 0)),
            separator=", ")

    def _print(self, names_id: int) -> None:
        """Prints the record just made, if `print_overflows`; not under
        `jit_compile=True`, where XLA cannot compile printing."""
        if not self.print_overflows or (
                not tf.executing_eagerly() and compat.in_xla_context()):
            return
        offending = self._offending(names_id)

        def line(why: tuple[str, ...]) -> Callable[[], None]:
            def print_line() -> None:
                tf.print("tf_lso: skipped step", self.step, "-", *why,
                         self.count, "gradient(s) not finite, for:",
                         offending, output_stream=sys.stderr)
            return print_line

        tf.switch_case(tf.cast(self.cause - UNKNOWN_CAUSE, tf.int32), [
            line(()),
            line(("the loss was finite (the gradients overflowed at this "
                  "loss scale);",)),
            line(("the loss itself was not finite;",)),
        ])

    def must_stop(self, limit: int | None, stop_on_loss: bool,
                  consecutive: Any, names_id: int
                  ) -> tuple[tf.Tensor, tf.Tensor]:
        """Whether training must stop after the last skipped step, and why.

        The one stop rule, for `skipped` and `stop_message`: with
        `stop_on_loss`, a step skipped for a non-finite loss stops; with
        `limit`, more than `limit` skipped steps in a row stop. It returns
        tensors, so the message reads the same wherever it is raised.
        """
        is_loss = tf.equal(self.cause, LOSS)
        stop_for_loss = tf.logical_and(stop_on_loss, is_loss)
        stuck = tf.constant(False) if limit is None else consecutive > limit
        at_step = [" At step ", self.step, ", ", self.count,
                   " gradient(s) were not finite, for: ",
                   self._offending(names_id), "."]
        loss_why = ["the loss itself has been non-finite for ",
                    self.consecutive_loss, f" step(s): {LOSS_ADVICE}",
                    *at_step]
        in_a_row = [consecutive, " steps in a row were skipped"]
        over = f"(more than max_consecutive_skips={limit})"
        message = tf.where(
            stop_for_loss,
            _joined(["Stopping at the first non-finite loss "
                     "(stop_on_nonfinite_loss=True): ", *loss_why]),
            tf.where(
                is_loss,
                _joined([*in_a_row, f" {over} and ", *loss_why]),
                _joined([*in_a_row, f" for non-finite gradients {over}: "
                         "training cannot make progress.", *at_step,
                         f" {REMEDIES}"])))
        return tf.logical_or(stop_for_loss, stuck), message

    def _stop_if_stuck(self, consecutive: tf.Tensor, names_id: int) -> None:
        """Raises if `must_stop` says so: a RuntimeError eagerly, an assertion
        in a `tf.function`. XLA drops assertions: under `jit_compile=True`
        use `LossScaleMonitor`."""
        limit = self.max_consecutive_skips
        if limit is None and not self.stop_on_nonfinite_loss:
            return
        eager = tf.executing_eagerly()
        if not eager and compat.in_xla_context():
            return
        stop, message = self.must_stop(limit, self.stop_on_nonfinite_loss,
                                       consecutive, names_id)
        if not eager:
            tf.debugging.Assert(tf.logical_not(stop), [message])
        elif bool(stop):
            raise RuntimeError(message.numpy().decode())

    def stop_message(self, limit: int | None, iterations: int,
                     stop_on_loss: bool) -> str | None:
        """Why training must stop now, or None. Eager only.

        It asks `must_stop` while no step has applied since the last
        skipped one. `iterations` is the optimizer's counter now.
        """
        step = int(self.step.numpy())
        if step < 0 or step + 1 < iterations:
            return None
        stop, message = self.must_stop(limit, stop_on_loss, self.consecutive,
                                       int(self.names_id.numpy()))
        return message.numpy().decode() if bool(stop) else None

    def last(self) -> Overflow | None:
        """The last skipped step as an `Overflow`, or None; a RuntimeError
        inside a `tf.function`."""
        if not tf.executing_eagerly():
            raise RuntimeError(
                "`last_overflow` reads variables back to Python: read it "
                "eagerly (outside tf.function), e.g. after a training step."
            )
        step = int(self.step.numpy())
        if step < 0:
            return None
        names = self.variable_names[int(self.names_id.numpy())]
        variables = tuple(names[i] for i in self.indices.numpy() if i >= 0)
        return Overflow(step, int(self.count.numpy()), variables,
                        int(self.consecutive.numpy()),
                        CAUSES[int(self.cause.numpy())])


def _joined(parts: Iterable[Any]) -> tf.Tensor:
    """One string tensor of message parts: strings, string tensors, and
    integer tensors or variables."""
    return tf.strings.join([
        part if isinstance(part, str) or part.dtype == tf.string
        else tf.strings.as_string(part) for part in parts])


class LossScalingWarning(UserWarning):
    """Loss scaling used in a way that trains wrongly, or needlessly.

    tf_lso's optimizers warn at most once per optimizer, where they can
    tell for sure at no cost to the step: while a `tf.function` is traced
    (eagerly, at the first step), and when an optimizer is built. Python's
    default filter shows a warning once per line of code, so two optimizers
    stepped by one line show it once. The message names the pattern and the
    fix:

    - `apply_gradients` after `get_scaled_loss`, with no
      `get_unscaled_gradients` (or read of `opt.loss_scale`) in between:
      each step would be the loss scale times too large.
    - `apply` of gradients `get_unscaled_gradients` did not return, after
      it unscaled the last loss's: they are taken as unscaled.
    - A dynamic loss scale built under the `'mixed_bfloat16'` policy,
      which needs no loss scaling.

    `tf-lso check` finds these and more without running the code. To
    silence it:
    `warnings.filterwarnings("ignore", category=tf_lso.LossScalingWarning)`.
    """


SILENCE = ("tf_lso says this at most once per optimizer; silence it with "
           "warnings.filterwarnings('ignore', "
           "category=tf_lso.LossScalingWarning).")

def warn(message: str) -> None:
    """Issues a `LossScalingWarning` at the first caller outside tf_lso,
    TensorFlow and Keras. Autograph's rewrite is a temporary file: in a
    `tf.function`, the warning goes to the line that called it."""
    files = [getattr(module, "__file__", None) for module in (
        sys.modules["tf_lso"], tf, keras, compat.tf_keras_module())]
    libraries = tuple(os.path.dirname(f) + os.sep for f in files if f)
    frame = inspect.currentframe()
    while frame is not None and (
            frame.f_code.co_filename.startswith(libraries)
            or os.path.basename(frame.f_code.co_filename).startswith(
                "__autograph_generated_file")):
        frame = frame.f_back
    if frame is None:  # Called from nowhere else: say it from here.
        warnings.warn(message, LossScalingWarning, stacklevel=2)
        return
    found = frame.f_globals
    warnings.warn_explicit(
        message, LossScalingWarning, frame.f_code.co_filename,
        frame.f_lineno, module=found.get("__name__"),
        registry=found.setdefault("__warningregistry__", {}),
        module_globals=found)


def warn_if_bfloat16_policy(dynamic: bool | None) -> None:
    """Warns if a dynamic loss scale is built under a global bfloat16
    policy (Keras 3's, or tf_keras's where imported)."""
    if dynamic is not True:
        return
    policies = [keras.mixed_precision.global_policy()]
    tf_keras = compat.tf_keras_module()
    if tf_keras is not None:
        policies.append(tf_keras.mixed_precision.global_policy())
    if any(getattr(p, "name", None) == "mixed_bfloat16" for p in policies):
        warn(
            "A loss scale optimizer with a dynamic loss scale was built "
            "while the global dtype policy is 'mixed_bfloat16': bfloat16 has "
            "float32's exponent range and needs no loss scaling, which here "
            "costs a finite check of every gradient on every step and can "
            "skip steps. Train with the inner optimizer instead (and drop "
            f"get_scaled_loss/get_unscaled_gradients). {SILENCE}")
