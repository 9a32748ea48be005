"""The Keras 3 kind: `keras.optimizers.Optimizer`.

It also reads TF 2.x optimizer configs (every config that no kind reads)
and restores TF 2.x checkpoints (`tf2_dependency`, `tf2_slot`).
"""

from __future__ import annotations

import typing

import keras
import tensorflow as tf

from tf_lso._src import compat
from tf_lso._src.gradients import packing
from tf_lso._src.gradients import replicas
from tf_lso._src.inner import inner_optimizer


class KerasInner(inner_optimizer.InnerOptimizer):
    """A Keras 3 optimizer.

    `build` restores the slots that a checkpoint restored before it.
    """

    optimizer_class = "`tf.keras.optimizers.Optimizer`"
    noun = "a Keras 3 optimizer"
    saved_by_keras = True

    def __init__(self, optimizer: typing.Any) -> None:
        super().__init__(optimizer)
        self._pending_slot_restores: list[tuple[typing.Any, str,
                                                typing.Any]] = []

    @classmethod
    def accepts(cls, optimizer: typing.Any) -> bool:
        return isinstance(optimizer, keras.optimizers.Optimizer)

    @classmethod
    def deserialize(cls, config: dict,
                    custom_objects: dict | None = None) -> typing.Any:
        """A Keras 3 optimizer, also from a TF 2.x config (no `module`)."""
        return keras.optimizers.deserialize(
            upgrade_tf2_config(config, custom_objects),
            custom_objects=custom_objects,
        )

    def aggregated(self, packed: packing.Packed,
                   var_list: list) -> tuple[packing.Packed, bool]:
        del var_list  # `packed` knows the values that are not summed.
        if replicas.replicas_in_sync() == 1:
            return packed, True
        # Keras 3 would clip each replica's gradients before the sum. This
        # clips the sum, as TF 2.x code expects, with one all-reduce.
        return replicas.all_reduced(packed), False

    def overrides_apply_gradients(self) -> bool:
        return type(self.optimizer).apply_gradients is not (
            keras.optimizers.Optimizer.apply_gradients)

    def build(self, var_list: list) -> None:
        if tf.distribute.has_strategy():
            # It may have been made outside `strategy.scope()`.
            compat.keras_optimizer_into_strategy(self.optimizer)
        if not self.optimizer.built:
            with keras.name_scope(self.optimizer.name, caller=self.optimizer):
                self.optimizer.build(var_list)
        pending, self._pending_slot_restores = self._pending_slot_restores, []
        for position, slot_name, variable in pending:
            slot = tf2_slot(self.optimizer, variable, slot_name)
            if slot is not None:
                compat.restore_position(position, slot)

    def check_graph(self) -> None:
        super().check_graph()
        steps = self.accumulation_steps
        if steps and compat.merge_call_fails_in_cond():
            strategy = type(tf.distribute.get_strategy()).__name__
            raise RuntimeError(
                "Keras 3's gradient accumulation (gradient_accumulation_steps"
                f"={steps} on the inner optimizer) cannot run in a "
                f"tf.function under {strategy}: Keras's own `apply` calls "
                "`merge_call` inside a cond, which TensorFlow refuses there "
                "(with a bare Keras optimizer too). Run the step eagerly "
                "(`run_eagerly=True` in `compile`, or no tf.function around "
                "`strategy.run`), or accumulate the gradients yourself."
            )

    def check_variables(self, var_list: list) -> None:
        compat.keras_check_variables_are_known(self.optimizer, var_list)

    def apply(self, grads_and_vars: list, name: str | None,
              aggregate: bool, skipped_steps: typing.Any) -> typing.Any:
        # Keras 3's own apply_gradients takes no name; a subclass's may.
        arguments = inner_optimizer.name_argument(
            self.optimizer.apply_gradients, name, base_takes_name=False)
        if not compat.keras_uses_ema(self.optimizer):
            return self._apply(grads_and_vars, aggregate, arguments)
        return self._apply_with_moving_averages(grads_and_vars, aggregate,
                                                arguments, skipped_steps)

    def _apply(self, grads_and_vars: list[tuple[typing.Any, typing.Any]],
               aggregate: bool, arguments: tuple[typing.Any, ...]
               ) -> typing.Any:
        if aggregate:
            return self.optimizer.apply_gradients(grads_and_vars, *arguments)
        return compat.keras_apply_without_all_reduce(
            self.optimizer, grads_and_vars, *arguments)

    def _apply_with_moving_averages(
            self, grads_and_vars: list[tuple[typing.Any, typing.Any]],
            aggregate: bool, arguments: tuple[typing.Any, ...],
            skipped_steps: typing.Any) -> typing.Any:
        """`apply` with `use_ema=True`: the averages see applied steps only.

        Keras 3 starts the averages from the weights at its first step
        (`iterations == 0`) and, with gradient accumulation, moves them on
        every call of a window. A skipped step counts in `iterations` (TF
        2.4's rule), and a window is skipped only at its end. So the
        averages are updated here instead, with Keras 3's formula: the first
        step is the first one that applies (`iterations == skipped_steps`),
        and a window's updates all happen at its end, once it applies (the
        variables do not change before then, so the result is the same as
        updating on every call). `ema_overwrite_frequency` counts
        `iterations`, as learning rate schedules do.
        """
        optimizer = self.optimizer
        iterations = tf.identity(optimizer.iterations)  # Before this step.
        first = tf.equal(iterations, tf.cast(skipped_steps, iterations.dtype))
        steps = self.accumulation_steps
        if not steps:
            with compat.keras_apply_without_ema(optimizer):
                result = self._apply(grads_and_vars, aggregate, arguments)
            self._update_moving_averages(iterations, first)
            return result
        window_end = self._is_window_end()

        def at_window_end(updates: int) -> None:
            def run() -> tf.Tensor:
                for _ in range(updates):
                    self._update_moving_averages(iterations, first)
                return tf.constant(True)

            tf.cond(window_end, run, lambda: tf.constant(False))

        # The calls before the last one saw the variables as they are now.
        at_window_end(steps - 1)
        with compat.keras_apply_without_ema(optimizer):
            result = self._apply(grads_and_vars, aggregate, arguments)
        at_window_end(1)
        return result

    def _update_moving_averages(self, iterations: tf.Tensor,
                                first: tf.Tensor) -> None:
        """One of Keras 3's `use_ema` updates (Keras 3.8 to 3.15's formula)."""
        optimizer = self.optimizer
        for var, average in zip(compat.keras_trainable_variables(optimizer),
                                compat.keras_ema_averages(optimizer)):
            if average is None:
                continue
            momentum = tf.multiply(
                tf.cast(tf.logical_not(first), var.dtype),
                optimizer.ema_momentum)
            average.assign(tf.add(
                tf.multiply(momentum, average),
                tf.multiply(1.0 - momentum, var)))
        frequency = optimizer.ema_overwrite_frequency
        if frequency:
            # Keras writes every replica's copy (`strategy.extended.update`),
            # which only a cross-replica context may do inside a cond.
            replicas.in_cross_replica_context(
                self._overwrite_with_averages_if,
                tf.equal((iterations + 1) % frequency, 0))

    def _overwrite_with_averages_if(self, due: tf.Tensor) -> None:
        """Copies the averages into the variables if `due` (cross-replica)."""

        def overwrite() -> tf.Tensor:
            compat.keras_overwrite_with_ema(self.optimizer)
            return tf.constant(True)

        tf.cond(replicas.first_replica(due), overwrite,
                lambda: tf.constant(False))

    def learning_rate(self) -> typing.Any:
        schedule = compat.keras_learning_rate_schedule(self.optimizer)
        if schedule is None:
            return self.optimizer.learning_rate
        return inner_optimizer.ScheduledLearningRate(
            schedule, lambda: self.optimizer.learning_rate
        )

    @property
    def accumulation_steps(self) -> int | None:
        return getattr(self.optimizer, "gradient_accumulation_steps",
                       None) or None

    def skip_step(self) -> None:
        # With gradient accumulation it also empties the accumulators. The
        # window that the non-finite gradient reached is dropped whole.
        if not self.accumulation_steps:
            self.optimizer.iterations.assign_add(1)
            return
        compat.keras_step_counter(self.optimizer).assign_add(1)
        for accumulator in compat.keras_gradient_accumulators(
            self.optimizer, compat.keras_trainable_variables(self.optimizer)
        ):
            accumulator.assign(tf.zeros_like(accumulator))

    def accumulation_window(
            self, var_list: list) -> tuple[tf.Tensor, list] | None:
        # `is_window_end` is True when this `apply` call ends a window and
        # updates the variables. `accumulators` hold the window's sums.
        if not self.accumulation_steps:
            return None
        return self._is_window_end(), compat.keras_gradient_accumulators(
            self.optimizer, var_list
        )

    def _is_window_end(self) -> tf.Tensor:
        """Whether this `apply` call ends a gradient accumulation window."""
        counter = compat.keras_step_counter(self.optimizer)
        return tf.equal((counter + 1) % self.accumulation_steps, 0)

    def checkpoint_child(self, name: str) -> typing.Any:
        child = super().checkpoint_child(name)
        if child is None:
            child = tf2_dependency(self.optimizer, name)
        return child

    def create_or_restore_slot(self, position: typing.Any, slot_name: str,
                               variable: typing.Any,
                               **kwargs: typing.Any) -> typing.Any:
        if not self.optimizer.built:
            self._pending_slot_restores.append((position, slot_name, variable))
            return None
        return tf2_slot(self.optimizer, variable, slot_name)

    def serialize(self) -> dict:
        config = keras.optimizers.serialize(self.optimizer)
        if compat.keras_is_auto_name(self.optimizer):
            # Not configuration: it depends on how many optimizers of the
            # class were made before.
            config["config"].pop("name", None)
        return config


def upgrade_tf2_config(config: dict,
                       custom_objects: dict | None = None) -> dict:
    """A TF 2.x inner optimizer config, made readable by Keras 3.

    TF 2.x wrote a learning rate schedule as `{class_name, config}` with
    `name: None`. Keras 3 finds no class without a `module`, and a schedule
    named None fails when called. So the schedule is deserialized here,
    under its class's default name. The `decay: 0.0` of every TF 2.x config
    is dropped, because Keras 3 warns about any `decay`. Configs that
    Keras 3 wrote are returned unchanged.

    Args:
        config: A serialized Keras 3 optimizer (`{class_name, config}`).
        custom_objects: Optional dict of custom schedule classes.

    Returns:
        The config to deserialize; `config` itself is never edited.
    """
    inner = config.get("config")
    if not isinstance(inner, dict):
        return config
    inner = dict(inner)
    if inner.get("decay", None) == 0:
        del inner["decay"]
    schedule = inner.get("learning_rate")
    if isinstance(schedule, dict) and "module" not in schedule:
        schedule = dict(schedule)
        if isinstance(schedule.get("config"), dict):
            schedule["config"] = {
                key: value for key, value in schedule["config"].items()
                if not (key == "name" and value is None)
            }
        inner["learning_rate"] = keras.optimizers.schedules.deserialize(
            schedule, custom_objects=custom_objects)
    return {**config, "config": inner}


# -- TF 2.x (OptimizerV2) checkpoint names on a Keras 3 optimizer ------------
#
# TF 2.x checkpoints name an optimizer's step counter `iter` and its slots by
# slot name (`m`, `v`, `momentum`, ...) under each variable; a Keras 3
# optimizer keeps the same state in variables named
# `<variable path>_<suffix>`. `KerasInner` restores TF 2.x checkpoints by
# this mapping.

# TF 2.x (OptimizerV2) slot names -> Keras 3 optimizer variable suffixes.
_SLOT_SUFFIXES = {
    "m": ("momentum", "m"),  # Adam, Nadam / Adamax
    "v": ("velocity", "u"),  # Adam, Nadam / Adamax
    "vhat": ("velocity_hat",),
    "rms": ("velocity",),
    "mg": ("average_gradient",),
    "accum_grad": ("accumulated_grad",),
    "accum_var": ("accumulated_delta_var",),
}


def tf2_dependency(optimizer: typing.Any, name: str) -> typing.Any:
    """The Keras 3 variable for TF 2.x child `name` (`iter`, ...), or None."""
    if name == "iter":
        return optimizer.iterations
    if name == "learning_rate":
        learning_rate = optimizer.learning_rate
        if compat.is_variable(learning_rate):
            return learning_rate
    return None


def _slot_prefix(variable: typing.Any) -> str:
    # As `keras.optimizers.Optimizer.add_variable_from_reference` names slots.
    if hasattr(variable, "path"):
        return variable.path.replace("/", "_")
    return str(variable.name).replace("/", "_").replace(":", "_")


def tf2_slot(optimizer: typing.Any, variable: typing.Any,
             slot_name: str) -> typing.Any:
    """The Keras 3 variable holding TF 2.x slot `slot_name` of `variable`."""
    prefix = _slot_prefix(variable)
    for suffix in _SLOT_SUFFIXES.get(slot_name, (slot_name,)):
        name = f"{prefix}_{suffix}"
        matches = [v for v in optimizer.variables if v.name == name]
        if len(matches) > 1:
            # Several variables share the name: slots follow the order of
            # the variables the optimizer was built with.
            same_prefix = [
                v for v in compat.keras_trainable_variables(optimizer)
                if _slot_prefix(v) == prefix
            ]
            position = [v is variable for v in same_prefix]
            if position.count(True) != 1 or len(same_prefix) != len(matches):
                return None
            matches = [matches[position.index(True)]]
        if matches and tuple(matches[0].shape) == tuple(variable.shape):
            return matches[0]
    return None
