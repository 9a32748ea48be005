"""One step of a loss scale optimizer: check, then apply or skip.

`ApplyStep` is what `LossScaleOptimizer.apply_gradients` does once it has
validated its arguments and packed the unscaled gradients:

    sum over replicas  as the inner optimizer would (its aggregator), so
                       that the check sees what it applies
    check              the loss scale's update: one finite check, the new
                       scale and counter
    cond(apply, skip)  on every replica alike (`replicas`)

On a skipped step no variable or slot changes: the inner optimizer only
counts the step, `skipped_steps` grows by one and the overflow record is
updated. Fixed and dynamic loss scales answer the check through the same
method, so nothing here asks which one it has.
"""

import tensorflow as tf

from tf_lso._src.gradients import packing
from tf_lso._src.gradients import replicas
from tf_lso._src.optimizer import training_health


class ApplyStep(tf.Module):
    """Applies or skips packed gradients; holds `skipped_steps`.

    A `tf.Module`, so that a SavedModel of a traced step can track the
    variables it captures (`checkpointing.Layout`).

    Args:
        inner: The `inner_optimizer.InnerOptimizer`.
        loss_scale: The `LossScale`.
        overflow: The `training_health.OverflowRecord`.
    """

    def __init__(self, inner, loss_scale, overflow):
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

    def __call__(self, packed, var_list, name, aggregate,
                 loss_nonfinite=None):
        """Runs the step.

        Args:
            packed: The unscaled gradients, a `packing.Packed`.
            var_list: Their variables, in the same order.
            name: Passed to tf_keras inner optimizers.
            aggregate: Whether the gradients still need summing over
                replicas.
            loss_nonfinite: A bool scalar tensor, True if this replica's
                loss was not finite; None if the optimizer did not see the
                loss. Read by a skipped step only (its cause).

        Returns:
            In a `tf.compat.v1` graph, the op that runs the step; else None.
        """
        if aggregate:
            # The inner optimizer then applies without summing again.
            packed, aggregate = self._inner.aggregated(packed, var_list)
        # Read before the update (the overflow record wants the scale a
        # skipped step was taken with); in a tf.compat.v1 graph, nothing
        # else would order the read first.
        scale = self._loss_scale()
        with tf.control_dependencies([scale]):
            update_op, should_apply, checked, window = self._check(
                packed, var_list)
        names_id = self._overflow.names_id_for(var_list)
        if self.report.enabled and not replicas.in_v1_graph():
            replicas.create_variables(self.report.build, names_id,
                                      len(var_list))
            self.report.record(packed, scale, self._inner.iterations,
                               names_id)

        def apply_fn(values, aux, var_list):
            # Every gradient must come from the branch's graph: a mix of
            # captured and branch tensors breaks the gradient of Keras 3's
            # all-reduce (a custom_gradient, used even with no strategy).
            grads = packed.unpack([tf.identity(v) for v in values], aux)
            return self._inner.apply(list(zip(grads, var_list)), name,
                                     aggregate)

        # Whether the loss was seen is known while tracing; when it was not,
        # a placeholder flag keeps the branch's arguments the same.
        loss_seen = loss_nonfinite is not None
        loss_flag = (tf.cast(loss_nonfinite, tf.int32) if loss_seen
                     else tf.constant(0, tf.int32))

        def skip_fn(values, scale, loss_flag, *window):
            if not window:
                return count_skip(values, scale, loss_flag)
            # A window is dropped at its first non-finite call: the skip is
            # counted then; its later calls are dropped with it.
            first_overflow, window_end = map(replicas.first_replica, window)
            tf.cond(first_overflow,
                    lambda: count_skip(values, scale, loss_flag)
                    or tf.constant(True),
                    lambda: self._inner.skip_step() or tf.constant(False))
            self.window_overflowed.assign(tf.logical_not(window_end))
            return None

        def nonfinite_flags(values, loss_flag):
            # The gradients' flags and the loss's, in one sum over replicas.
            return tf.concat([checked.nonfinite_per_gradient(values),
                              tf.reshape(loss_flag, [1])], 0)

        def count_skip(values, scale, loss_flag):
            # Only skipped steps pay for finding the offending variables.
            flags = replicas.summed(nonfinite_flags, values, loss_flag)
            consecutive = self._overflow.record(
                flags[:-1], self._inner.iterations, names_id,
                replicas.first_replica(scale),
                flags[-1] if loss_seen else None)
            self._inner.skip_step()
            self.skipped_steps.assign_add(1)
            self._overflow.report(names_id)
            self._overflow.check(consecutive, names_id)

        v1_graph = replicas.in_v1_graph()
        if v1_graph:
            skip_fn = _one_op(skip_fn)
        step_op = replicas.cond_on_all_replicas(
            should_apply, apply_fn, skip_fn,
            args=(packed.values, packed.aux, var_list),
            false_args=(checked.values, scale, loss_flag, *window),
        )
        if v1_graph:
            return replicas.grouped((update_op, step_op))
        return None

    def _check(self, packed, var_list):
        """Updates the loss scale.

        With gradient accumulation on the inner optimizer, the loss scale
        sees one step per window: every call checks the window's sums so
        far (this call's gradients included), so that the accumulators
        never hold a non-finite value. The window's first non-finite call
        skips the whole window: it empties the accumulators and backs off
        once, and the window's later calls are dropped up to its end.

        Returns:
            (the loss scale's update op, whether to call the inner apply,
            the gradients checked, and with accumulation the tensors
            `skip_fn` needs: whether this is the window's first non-finite
            call, and whether it ends the window).
        """
        window = self._inner.accumulation_window(var_list)
        if window is None:
            return (*self._loss_scale._update_packed(packed), packed, ())
        is_window_end, accumulators = window
        sums = packing.pack([
            None if g is None else tf.convert_to_tensor(g) + acc
            for g, acc in zip(packed.unpack(), accumulators)
        ])
        update_op, should_apply, first_overflow = (
            self._loss_scale._update_window(
                sums, is_window_end, self.window_overflowed))
        return (update_op, should_apply, sums,
                (tf.convert_to_tensor(first_overflow), is_window_end))


def _one_op(fn):
    """`fn` as a `tf.function`, for a `tf.compat.v1` graph.

    A cond branch there runs only what its result depends on, in no set
    order; a function call runs all of the function's stateful ops in
    program order, as in TF 2.
    """

    @tf.function(autograph=False)
    def call(*args):
        fn(*args)
        return tf.constant(True)

    return call
