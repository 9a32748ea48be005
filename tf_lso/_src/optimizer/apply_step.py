"""One step of a loss scale optimizer, top to bottom.

`ApplyStep` does what `LossScaleOptimizer.apply_gradients` does with a
list of gradients:

    1. validate  replica context, strategy, graph, gradient/variable pairs;
                 every check comes before the first state change
    2. build     the inner optimizer's variables (never inside the cond)
    3. pack      small gradients stacked (`packing.Packed`), unscaled if the
                 loss went through `scale_loss`
    4. sum       over replicas, as the inner optimizer would, so that the
                 check sees what is applied
    5. check     one finite check on the stacks, one scalar all-reduce
    6. decide    a dynamic scale's new scale and counter, branch-free
    7. apply or skip, on every replica alike

A fixed scale has no steps 5 and 6 and no cond. A user's `LossScale` does
steps 5 and 6 in its `update(grads)`. A skipped step changes no variable or
slot: the inner optimizer counts it, `skipped_steps` grows and the overflow
record says why.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_lso._src.gradients import packing
from tf_lso._src.gradients import replicas
from tf_lso._src.inner import inner_optimizer as inner_lib
from tf_lso._src.inner import wrapping
from tf_lso._src.optimizer import gradient_report as gradient_report_lib
from tf_lso._src.optimizer import training_health
from tf_lso._src.scaling import loss_scale as loss_scale_lib


class Window(typing.NamedTuple):
    """Where a call stands in its gradient accumulation window."""

    first_overflow: tf.Tensor  # The window's first non-finite call: skip now.
    ends: tf.Tensor  # This call ends the window.


class Verdict(typing.NamedTuple):
    """What steps 5 and 6 decided, for step 7."""

    update_op: Any  # None eagerly.
    should_apply: bool | tf.Tensor  # A Python bool if known while tracing.
    checked: packing.Packed  # With accumulation, the window's sums.
    window: Window | None  # None without accumulation.


class ApplyStep(tf.Module):
    """Applies or skips a step's gradients; holds `skipped_steps`.

    A `tf.Module`, so that a SavedModel of a traced step tracks the variables
    it captures. Its settings are frozen. While tracing, it also reads two
    Python values that grow and are never cleared:

    * `report.enabled`: set by `LossScaleMonitor`, which retraces. While it
      is set, the report adds variables for each distinct variable list.
    * The overflow record's `variable_names`: one entry for each distinct
      variable list. A trace keeps its index.
    """

    def __init__(self, inner: inner_lib.InnerOptimizer,
                 loss_scale: loss_scale_lib.LossScale,
                 overflow: training_health.OverflowRecord) -> None:
        super().__init__(name="apply_step")
        self._inner = inner
        self._loss_scale = loss_scale
        self._overflow = overflow
        # Not checkpointed (the layout stays TF 2.4's), like the record.
        self.skipped_steps = replicas.state_variable(
            0, tf.int64, "skipped_steps"
        )
        # The opt-in gradient report (`LossScaleMonitor`): nothing in the
        # step while it is not enabled.
        self.report = gradient_report_lib.GradientReportRecord()
        # With gradient accumulation: whether an earlier call of the current
        # window was not finite (the window is then dropped at its end). It
        # is checkpointed, so that a window restored mid-way stays dropped.
        self.window_overflowed = None
        if inner.accumulation_steps:
            self.window_overflowed = replicas.state_variable(
                False, tf.bool, "window_overflowed")
        # How steps 5 and 6 treat the loss scale, fixed for the step's life.
        self._mode = loss_scale_lib.step_mode(loss_scale)

    def __call__(self, grads: Sequence[packing.Gradient],
                 var_list: Sequence[tf.Variable], *, name: str | None = None,
                 aggregate: bool = True, scaled: bool = False,
                 unpacked_from: packing.Packed | None = None,
                 loss_nonfinite: tf.Tensor | None = None) -> Any:
        """Runs the step; in a `tf.compat.v1` graph, returns its op.

        `grads` are unscaled unless `scaled` (Keras 3's `scale_loss`, then
        `apply`). `aggregate` says they still need summing over replicas.
        `unpacked_from` is the `packing.Packed` that `get_unscaled_gradients`
        unpacked into `grads`, or None. `loss_nonfinite` is a bool tensor for
        this step's loss, or None if the optimizer saw no loss.
        """
        grads, var_list = list(grads), list(var_list)
        self._check(grads, var_list)  # 1. Validate.
        # 2. Build.
        replicas.create_variables(self._inner.build, var_list)
        self._inner.check_variables(var_list)
        # 3. Pack.
        packed = self._pack(grads, var_list, scaled, unpacked_from)
        # 4. Sum over replicas, as the inner optimizer would. A subclass's
        # own apply_gradients gets each replica's gradients and sums them.
        if aggregate and not self._inner.overrides_apply_gradients():
            packed, aggregate = self._inner.aggregated(packed, var_list)
        # Read before the update: a skipped step records the scale it was
        # taken with. In a tf.compat.v1 graph only this orders the read.
        scale = self._loss_scale()
        # 5. and 6. Check and decide.
        with tf.control_dependencies([scale]):
            verdict = self._decide(packed, var_list)
        names_id = self._overflow.names_id_for(var_list)
        if self.report.enabled and not replicas.in_v1_graph():
            replicas.create_variables(self.report.build, names_id,
                                      len(var_list))
            self.report.record(packed, scale, self._inner.iterations,
                               names_id)
        # 7. Apply or skip, on every replica alike.
        apply = functools.partial(self._apply, packed=packed, name=name,
                                  aggregate=aggregate)
        # The apply runs on each replica. The skip runs once; see `_skip`.
        skip = functools.partial(self._skip, checked=verdict.checked,
                                 names_id=names_id)
        v1_graph = replicas.in_v1_graph()
        step_op = replicas.cond_on_all_replicas(
            verdict.should_apply, apply, _one_op(skip) if v1_graph else skip,
            args=(packed.values, packed.aux, var_list),
            false_args=(verdict.checked.values, scale, loss_nonfinite,
                        verdict.window))
        return replicas.grouped((verdict.update_op, step_op)) if v1_graph else None

    def _check(self, grads: list[packing.Gradient],
               var_list: list[tf.Variable]) -> None:
        """Step 1: raises where the step cannot run, before it changes any
        state."""
        replicas.check_replica_context("apply_gradients")
        replicas.check_strategy_supported()
        if replicas.in_v1_graph() and not self._inner.runs_in_v1_graph:
            raise wrapping.v1_graph_error(self._inner)
        self._inner.check_graph()
        packing.check_grads_and_vars(grads, var_list)
        # Accumulation is as it was when the step was made, with a loss
        # scale whose rule the step knows.
        steps = self._inner.accumulation_steps
        if not steps:
            return
        if self.window_overflowed is None:
            raise ValueError(
                f"gradient_accumulation_steps={steps} was set on the inner "
                "optimizer after it was wrapped in a loss scale optimizer, "
                "which keeps the state of an accumulation window only if the "
                "inner optimizer accumulated when wrapped. Set it on the "
                "inner optimizer before wrapping it, e.g. "
                "tf_lso.LossScaleOptimizer(keras.optimizers.SGD(..., "
                f"gradient_accumulation_steps={steps})).")
        if self._mode == "update":
            raise NotImplementedError(
                "Gradient accumulation (`gradient_accumulation_steps` on "
                "the inner optimizer) needs a FixedLossScale or "
                "DynamicLossScale whose `update` is not overridden: a loss "
                "scale's own `update` knows nothing of accumulation windows. "
                f"Received: loss_scale={self._loss_scale!r}. Accumulate "
                "gradients yourself, or use one of those two classes.")

    def _apply(self, values: list[tf.Tensor], aux: Any,
               var_list: list[tf.Variable], *, packed: packing.Packed,
               name: str | None, aggregate: bool) -> Any:
        """Step 7, applied. `values` and `aux` are `packed`'s, as the
        branch received them (under a strategy, each replica's)."""
        # Every gradient must come from the branch's graph: a mix of
        # captured and branch tensors breaks the gradient of Keras 3's
        # all-reduce (a custom_gradient, used even with no strategy).
        grads = packed.unpack([tf.identity(v) for v in values], aux)
        return self._inner.apply(list(zip(grads, var_list)), name, aggregate,
                                 self.skipped_steps)

    def _skip(self, values: list[tf.Tensor], scale: tf.Tensor,
              loss_nonfinite: tf.Tensor | None, window: Window | None, *,
              checked: packing.Packed, names_id: int) -> None:
        """Step 7, skipped: no variable or slot changes.

        Under a strategy it runs once, in a cross-replica context, so its
        arguments hold every replica's values. `values` are each replica's
        stacks, laid out as `checked`'s; the offending gradients are summed
        over replicas. The scale and the window are the same on every
        replica, so the first replica's are read. With gradient
        accumulation, only a window's first non-finite call counts as
        skipped; the others count in `iterations`.
        """

        def count() -> None:
            # Only skipped steps pay for finding the offending variables.
            flags = replicas.summed(
                functools.partial(_nonfinite_flags, checked), values,
                loss_nonfinite)
            step = tf.identity(self._inner.iterations)
            self._inner.skip_step()
            self.skipped_steps.assign_add(1)
            self._overflow.skipped(flags, step, names_id,
                                   replicas.first_replica(scale),
                                   loss_seen=loss_nonfinite is not None)

        if window is None:
            count()
            return
        first_overflow, window_end = map(replicas.first_replica, window)
        tf.cond(first_overflow, count, self._inner.skip_step)
        window_overflowed: Any = self.window_overflowed
        window_overflowed.assign(tf.logical_not(window_end))

    def _pack(self, grads: list[packing.Gradient], var_list: list[tf.Variable],
              scaled: bool, packed: packing.Packed | None) -> packing.Packed:
        """Step 3. Stacked, one op unscales or checks many small gradients,
        and the cond gets few inputs. `packed` is what
        `get_unscaled_gradients` packed, or None."""
        if packed is not None and any(map(packing.overwrites, var_list)):
            packed = None  # Packed without the variables: see `pack`.
        if packed is None:
            packed = packing.pack(grads, var_list)
            if scaled:
                packed = packed.unscaled(self._loss_scale())
        return packed

    def _decide(self, packed: packing.Packed,
                var_list: list[tf.Variable]) -> Verdict:
        """Steps 5 and 6."""
        if self._mode == "fixed":
            return Verdict(loss_scale_lib.no_op(), True, packed, None)
        if self._mode == "update":
            # A user's update: once a step, in a cross-replica context, with
            # every replica's gradients.
            update_op, should_apply = replicas.in_cross_replica_context(
                self._loss_scale.update, packed.unpack())
            return Verdict(update_op, should_apply, packed, None)
        window = self._inner.accumulation_window(var_list)
        if window is None:
            update_op, should_apply = loss_scale_lib.advance(
                self._loss_scale, replicas.all_finite(packed))
            return Verdict(update_op, should_apply, packed, None)
        return self._decide_in_window(packed, *window)

    def _decide_in_window(self, packed: packing.Packed, window_end: tf.Tensor,
                          accumulators: list[tf.Tensor]) -> Verdict:
        """Steps 5 and 6 with gradient accumulation.

        The loss scale sees one step per window. Each call checks the
        window's sums so far, so the accumulators never hold a non-finite
        value. The first non-finite call empties them and backs off once;
        the window's later calls are dropped.
        """
        sums = packing.pack([
            None if g is None else tf.convert_to_tensor(g) + acc
            for g, acc in zip(packed.unpack(), accumulators)
        ])
        overflowed = tf.convert_to_tensor(self.window_overflowed)
        # A damaged scale counts as an overflow (see `advance`).
        is_finite = tf.logical_and(
            replicas.all_finite(sums),
            loss_scale_lib.usable(self._loss_scale()))
        should_apply = tf.logical_and(is_finite, tf.logical_not(overflowed))
        first_overflow = tf.logical_not(tf.logical_or(is_finite, overflowed))
        # The state changes at most once a window: it backs off at the
        # window's first non-finite call, and counts a good step at the end
        # of a window that had none.
        update_op, should_apply = loss_scale_lib.advance(
            self._loss_scale, should_apply,
            active=tf.logical_or(first_overflow,
                                 tf.logical_and(window_end, should_apply)))
        return Verdict(update_op, should_apply, sums,
                       Window(first_overflow, window_end))


def _nonfinite_flags(checked: packing.Packed, values: list[tf.Tensor],
                     loss_nonfinite: tf.Tensor | None) -> tf.Tensor:
    """One int32 flag per gradient of `checked` (its `values`), and the
    loss's last if it was seen: 1 where not finite. One tensor, so that one
    all-reduce sums them over replicas."""
    flags = checked.nonfinite_per_gradient(values)
    if loss_nonfinite is None:
        return flags
    return tf.concat([flags, tf.reshape(tf.cast(loss_nonfinite, tf.int32),
                                        [1])], 0)


def _one_op(fn: Callable[..., None]) -> Callable[..., tf.Tensor]:
    """`fn` as a `tf.function`, for a `tf.compat.v1` graph. There a cond
    branch runs only what its result depends on, in no set order; a function
    call runs all its stateful ops in program order."""

    @tf.function(autograph=False)
    def call(*args: Any) -> tf.Tensor:
        fn(*args)
        return tf.constant(True)

    return call
