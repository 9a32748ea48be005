"""One step of a loss scale optimizer, top to bottom.

`ApplyStep` owns what `LossScaleOptimizer.apply_gradients` does with a list
of gradients (the optimizer only says whether they are still scaled):

    1. validate  replica context, strategy, graph, gradient/variable pairs;
                 every check comes before the first state change
    2. build     the inner optimizer's variables (never inside the cond)
    3. pack      small gradients stacked (`packing.Packed`), unscaled if the
                 loss went through `scale_loss`
    4. sum       over replicas, as the inner optimizer would (its aggregator),
                 so that the check sees what is applied; an optimizer that
                 overrides `apply_gradients` sums itself, as in TF 2.4
    5. check     one finite check on the stacks, one scalar all-reduce
                 (`replicas.all_finite`); with gradient accumulation on the
                 window's sums so far
    6. decide    the loss scale's `Rule` applied to the verdict
                 (`loss_scale.advance`): new scale and counter, branch-free
    7. apply or skip, on every replica alike (`replicas.cond_on_all_replicas`)

A fixed scale's rule needs no check: step 5 and the cond disappear, as in
TF 2.4. A user's `LossScale` has no rule; steps 5 and 6 are then its
`update(grads)`, as TF 2.4 called it. On a skipped step no variable or slot
changes: the inner optimizer only counts the step, `skipped_steps` grows by
one and the overflow record is updated. With gradient accumulation a
window's first non-finite call drops the window (its sums are zeroed) and
is the one counted in `skipped_steps` (`Verdict.window`).
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
from tf_lso._src.optimizer import training_health
from tf_lso._src.scaling import loss_scale as loss_scale_lib


class Window(typing.NamedTuple):
    """With gradient accumulation: where one call stands in its window.

    Attributes:
        first_overflow: A bool tensor: this call is the window's first
            non-finite one (the window is dropped: the skip is counted now).
        ends: A bool tensor: this call ends the window.
    """

    first_overflow: tf.Tensor
    ends: tf.Tensor


class Verdict(typing.NamedTuple):
    """What steps 5 and 6 decided: one per step, read by step 7.

    Attributes:
        update_op: The loss scale's update op in a graph (None eagerly).
        should_apply: A bool tensor, or a Python bool known while tracing.
        checked: The `packing.Packed` gradients that were checked (with
            accumulation: the window's sums), for a skipped step's record.
        window: With gradient accumulation, this call's `Window`; else None.
    """

    update_op: Any
    should_apply: bool | tf.Tensor
    checked: packing.Packed
    window: Window | None


class Skipped(typing.NamedTuple):
    """The tensors a skipped step records (step 7's skip branch).

    Under a strategy the skip runs once, in a cross-replica context: each
    field then holds every replica's value (`replicas.cond_on_all_replicas`).

    Attributes:
        checked: The values of `Verdict.checked`.
        scale: The loss scale the step was taken with.
        loss_nonfinite: A bool tensor, whether the loss the optimizer scaled
            for this step was not finite; None if it saw no loss.
        window: `Verdict.window`.
    """

    checked: list[tf.Tensor]
    scale: tf.Tensor
    loss_nonfinite: tf.Tensor | None
    window: Window | None


class ApplyStep(tf.Module):
    """Applies or skips a step's gradients; holds `skipped_steps`.

    A `tf.Module`, so that a SavedModel of a traced step can track the
    variables it captures (`checkpointing.Layout`). Its state is
    `tf.Variable`s. Besides its arguments and frozen settings (the overflow
    record's limits, whether the inner optimizer accumulates), the step
    reads in Python, while tracing, two values that change and are never
    cleared:

    * `report.enabled`: set by `LossScaleMonitor` (which retraces the train
      function), read by `__call__`; while it is set, the report adds its
      variables per distinct variable list.
    * The overflow record's `variable_names`: `__call__` adds the names of
      each new variable list (a trace keeps its index); it grows only as
      the program's distinct variable lists do.

    Args:
        inner: The `inner_optimizer.InnerOptimizer`.
        loss_scale: The `LossScale`.
        overflow: The `training_health.OverflowRecord`.
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
        inner.skipped_steps = self.skipped_steps
        # The opt-in gradient report (`LossScaleMonitor`): nothing in the
        # step while it is not enabled.
        self.report = training_health.GradientReportRecord()
        # With gradient accumulation: whether an earlier call of the current
        # window was not finite (the window is then dropped at its end). It
        # is checkpointed, so that a window restored mid-way stays dropped.
        self.window_overflowed = None
        if inner.accumulation_steps:
            self.window_overflowed = replicas.state_variable(
                False, tf.bool, "window_overflowed")

    def __call__(self, grads: Sequence[packing.Gradient],
                 var_list: Sequence[tf.Variable], *, name: str | None = None,
                 aggregate: bool = True, scaled: bool = False,
                 unpacked_from: packing.Packed | None = None,
                 loss_nonfinite: tf.Tensor | None = None) -> Any:
        """Runs the step.

        Args:
            grads: The gradients, unscaled unless `scaled`.
            var_list: Their variables, in the same order.
            name: Passed to the inner optimizer's `apply_gradients` (see
                `inner_optimizer.name_argument`).
            aggregate: Whether the gradients still need summing over
                replicas.
            scaled: Whether the gradients are still multiplied by the loss
                scale (Keras 3's protocol: `scale_loss`, then `apply`).
            unpacked_from: The `packing.Packed` whose `unpack()` `grads`
                is (`get_unscaled_gradients` packed them), or None.
            loss_nonfinite: A bool tensor, whether the loss scaled for this
                step was not finite, or None if the optimizer saw no loss.

        Returns:
            In a `tf.compat.v1` graph, the op that runs the step; else None.
        """
        grads, var_list = list(grads), list(var_list)
        # 1. Validate.
        replicas.check_replica_context("apply_gradients")
        replicas.check_strategy_supported()
        wrapping.check_graph(self._inner)
        packing.check_grads_and_vars(grads, var_list)
        self._check_accumulation()
        # 2. Build.
        replicas.create_variables(self._inner.build, var_list)
        self._inner.check_variables(var_list)
        # 3. Pack.
        packed = self._pack(grads, var_list, scaled, unpacked_from)
        # 4. Sum over replicas, as the inner optimizer's apply would; the
        # kind says whether its apply must still sum. A subclass's own
        # apply_gradients gets each replica's gradients, as in TF 2.4.
        if aggregate and not self._inner.overrides_apply_gradients():
            packed, aggregate = self._inner.aggregated(packed, var_list)
        # Read before the update (the overflow record wants the scale a
        # skipped step was taken with); in a tf.compat.v1 graph, nothing
        # else would order the read first.
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
        skip = functools.partial(self._skip, checked=verdict.checked,
                                 names_id=names_id)
        skipped = Skipped(verdict.checked.values, scale, loss_nonfinite,
                          verdict.window)
        v1_graph = replicas.in_v1_graph()
        step_op = replicas.cond_on_all_replicas(
            verdict.should_apply, apply, _one_op(skip) if v1_graph else skip,
            args=(packed.values, packed.aux, var_list), false_args=(skipped,))
        return replicas.grouped((verdict.update_op, step_op)) if v1_graph else None

    def _check_accumulation(self) -> None:
        """Step 1: accumulation is what it was when the step was made.

        A window's state (`window_overflowed`) exists only if the inner
        optimizer accumulated then.
        """
        steps = self._inner.accumulation_steps
        if steps and self.window_overflowed is None:
            raise ValueError(
                f"gradient_accumulation_steps={steps} was set on the inner "
                "optimizer after it was wrapped in a loss scale optimizer, "
                "which keeps the state of an accumulation window only if the "
                "inner optimizer accumulated when wrapped. Set it on the "
                "inner optimizer before wrapping it, e.g. "
                "tf_lso.LossScaleOptimizer(keras.optimizers.SGD(..., "
                f"gradient_accumulation_steps={steps})).")

    def _apply(self, values: list[tf.Tensor], aux: Any,
               var_list: list[tf.Variable], *, packed: packing.Packed,
               name: str | None, aggregate: bool) -> Any:
        """Step 7, applied: the inner optimizer applies the gradients.

        `values` and `aux` are `packed`'s, as the branch (each replica's,
        under a strategy) received them.
        """
        # Every gradient must come from the branch's graph: a mix of
        # captured and branch tensors breaks the gradient of Keras 3's
        # all-reduce (a custom_gradient, used even with no strategy).
        grads = packed.unpack([tf.identity(v) for v in values], aux)
        return self._inner.apply(list(zip(grads, var_list)), name, aggregate)

    def _skip(self, skipped: Skipped, *, checked: packing.Packed,
              names_id: int) -> None:
        """Step 7, skipped: no variable or slot changes; the step is counted.

        With gradient accumulation, a window is dropped at its first
        non-finite call: the skip is counted then; its later calls only
        count the step.
        """
        if skipped.window is None:
            self._count_skip(skipped, checked=checked, names_id=names_id)
            return
        first_overflow, window_end = map(replicas.first_replica,
                                         skipped.window)
        tf.cond(first_overflow,
                functools.partial(self._count_skip, skipped, checked=checked,
                                  names_id=names_id),
                self._inner.skip_step)
        window_overflowed: Any = self.window_overflowed
        window_overflowed.assign(tf.logical_not(window_end))

    def _count_skip(self, skipped: Skipped, *, checked: packing.Packed,
                    names_id: int) -> None:
        """Counts a skipped step and records why (the overflow record)."""
        # Only skipped steps pay for finding the offending variables: the
        # gradients' flags and the loss's, in one sum over replicas.
        flags = replicas.summed(functools.partial(_nonfinite_flags, checked),
                                skipped.checked, skipped.loss_nonfinite)
        loss_seen = skipped.loss_nonfinite is not None
        consecutive = self._overflow.record(
            flags[:-1] if loss_seen else flags, self._inner.iterations,
            names_id, replicas.first_replica(skipped.scale),
            flags[-1] if loss_seen else None)
        self._inner.skip_step()
        self.skipped_steps.assign_add(1)
        self._overflow.report(names_id)
        self._overflow.check(consecutive, names_id)

    def _pack(self, grads: list[packing.Gradient], var_list: list[tf.Variable],
              scaled: bool, packed: packing.Packed | None) -> packing.Packed:
        """Step 3: the gradients packed, and unscaled if `scaled`.

        Small gradients travel stacked (see `packing.Packed`): one op
        unscales or checks many of them, and the cond gets few inputs. The
        TF 2.x protocol's `get_unscaled_gradients` packed them already
        (`packed`, unless None).
        """
        if packed is not None and any(map(packing.overwrites, var_list)):
            packed = None  # Packed without the variables: see `pack`.
        if packed is None:
            packed = packing.pack(grads, var_list)
            if scaled:
                packed = packed.unscaled(self._loss_scale())
        return packed

    def _decide(self, packed: packing.Packed,
                var_list: list[tf.Variable]) -> Verdict:
        """Steps 5 and 6: the finite check and the loss scale's rule.

        With gradient accumulation on the inner optimizer, the loss scale
        sees one step per window: every call checks the window's sums so
        far (this call's gradients included), so that the accumulators
        never hold a non-finite value. The window's first non-finite call
        skips the whole window: it empties the accumulators and backs off
        once, and the window's later calls are dropped up to its end.
        """
        window = self._inner.accumulation_window(var_list)
        rule = loss_scale_lib.step_rule(self._loss_scale,
                                        accumulating=window is not None)
        if rule is None and window is not None:
            raise NotImplementedError(
                "Gradient accumulation (`gradient_accumulation_steps` on "
                "the inner optimizer) needs a FixedLossScale or "
                f"DynamicLossScale. Received: loss_scale="
                f"{self._loss_scale!r}. Accumulate gradients yourself, "
                "or use one of those two classes.")
        if rule is None:
            # A user's update, as TF 2.4 called it: once a step, in a
            # cross-replica context, with every replica's gradients.
            update_op, should_apply = replicas.in_cross_replica_context(
                self._loss_scale.update, packed.unpack())
            return Verdict(update_op, should_apply, packed, None)
        if not rule.checks:  # A fixed scale applies every step (TF 2.4).
            update_op = None if tf.executing_eagerly() else tf.no_op()
            return Verdict(update_op, True, packed, None)
        if window is None:
            update_op, should_apply = loss_scale_lib.advance(
                self._loss_scale, replicas.all_finite(packed))
            return Verdict(update_op, should_apply, packed, None)
        window_end, accumulators = window
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
    loss's last if it was seen: 1 where not finite."""
    flags = checked.nonfinite_per_gradient(values)
    if loss_nonfinite is None:
        return flags
    return tf.concat([flags, tf.reshape(tf.cast(loss_nonfinite, tf.int32),
                                        [1])], 0)


def _one_op(fn: Callable[..., None]) -> Callable[..., tf.Tensor]:
    """`fn` as a `tf.function`, for a `tf.compat.v1` graph.

    A cond branch there runs only what its result depends on, in no set
    order; a function call runs all of the function's stateful ops in
    program order, as in TF 2.
    """

    @tf.function(autograph=False)
    def call(*args: Any) -> tf.Tensor:
        fn(*args)
        return tf.constant(True)

    return call
