"""The optimizer a loss scale optimizer wraps, behind one interface.

Three kinds are supported: Keras 3 optimizers (`tf.keras.optimizers.*` on
TF >= 2.16), tf_keras optimizers (`tf_keras.optimizers.*`) and tf_keras
legacy optimizers (`tf_keras.optimizers.legacy.*`, the OptimizerV2 of
TF 2.x). `wrap` returns an `InnerOptimizer` for each; everything that depends
on the kind lives in its class, so `LossScaleOptimizer` never asks which
kind it holds. tf_keras is optional and never imported here (see
`compat.tf_keras_module`); configs are read by `optimizer_config`.
"""

from __future__ import annotations

import typing
import weakref

import keras
import numpy as np
import tensorflow as tf

from tf_lso._src import compat
from tf_lso._src.gradients import packing
from tf_lso._src.gradients import replicas
from tf_lso._src.inner import keras_slots
from tf_lso._src.scaling import tensor_like


class InnerOptimizer(typing.Protocol):
    """What a loss scale optimizer needs from the optimizer it wraps.

    One class per kind subclasses it explicitly (through `_Wrapper`) and
    inherits the defaults here; `build`, `check_variables`, `apply` and
    `serialize` have none.
    """

    #: The wrapped optimizer.
    optimizer: typing.Any

    def build(self, var_list: list) -> None:
        """Creates the variables (slots) for `var_list`; idempotent."""
        raise NotImplementedError

    def check_variables(self, var_list: list) -> None:
        """Raises the optimizer's own error for variables it cannot update."""
        raise NotImplementedError

    def check_graph(self) -> None:
        """Raises RuntimeError where the optimizer updates no variables.

        That is a `tf.compat.v1` graph (run by a Session), for every kind
        but OptimizerV2, the optimizer TF 2.4 wrapped.
        """
        if replicas.in_v1_graph():
            raise RuntimeError(
                "In a tf.compat.v1 graph (run by a Session), the inner "
                "optimizer must be a tf_keras legacy optimizer "
                "(`tf_keras.optimizers.legacy.*`, TF 2.x's OptimizerV2, as "
                "TF 2.4 wrapped): other optimizers do not update variables "
                f"there. Received: inner_optimizer={self.optimizer!r}. Use "
                "a legacy optimizer, or train eagerly or in a tf.function."
            )

    def aggregated(self, packed: packing.Packed,
                   var_list: list) -> tuple[packing.Packed, bool]:
        """Sums gradients over replicas as the optimizer's own apply would.

        Called before the finite check, so that the check sees what the
        optimizer applies (TF 2.5+'s order, and tf_keras's): a value that
        the summing makes non-finite (a custom aggregator, a float16
        all-reduce, a sum that overflows) skips the step.

        Returns:
            `(packed, aggregate)`: the gradients to check and to apply, and
            whether `apply` must still sum them (only where that sum is the
            identity: one replica).
        """
        raise NotImplementedError

    def apply(self, grads_and_vars: list, name: str | None,
              aggregate: bool) -> typing.Any:
        """Applies unscaled gradients (summing over replicas if `aggregate`).

        Returns what the optimizer's own apply returns (in a `tf.compat.v1`
        graph, a tf_keras legacy optimizer's op that runs the update).
        """
        raise NotImplementedError

    def serialize(self) -> dict:
        """The optimizer's serialized config."""
        raise NotImplementedError

    def skip_step(self) -> None:
        """What a skipped step does instead of `apply`: counts the step."""
        self.optimizer.iterations.assign_add(1)

    def accumulation_window(self, var_list: list) -> tuple | None:
        """`(is_window_end, accumulators)` with gradient accumulation, else None."""
        del var_list  # Only Keras 3 optimizers accumulate.
        return None

    @property
    def iterations(self) -> tf.Variable:
        """The step counter."""
        return self.optimizer.iterations

    def set_iterations(self, value) -> None:
        """Assigns the step counter."""
        self.optimizer.iterations.assign(value)

    def variables(self) -> list:
        """The optimizer's variables (step counter, slots, ...)."""
        return list(self.optimizer.variables)

    def get_weights(self) -> list:
        """The values of `variables()`, as NumPy arrays."""
        return [v.numpy() for v in self.variables()]

    def learning_rate(self):
        """The learning rate, callable with a step if it follows a schedule."""
        return self.optimizer.learning_rate

    def hyperparameter_names(self) -> frozenset:
        """The attributes a wrapper forwards: the numeric config entries.

        TF 2.4 forwarded the inner optimizer's `_hyper` dict, its numeric
        hyperparameters (`learning_rate`, `beta_1`, `momentum`, ...); flags
        such as SGD's `nesterov` were not forwarded, and are not here.
        tf_keras legacy optimizers forward that very dict.
        """
        if self._hyperparameter_names is None:
            # Eagerly: a tf_keras legacy config reads variable values.
            with tf.init_scope():
                try:
                    config = self.optimizer.get_config()
                except Exception:  # noqa: BLE001 - custom get_config.
                    return frozenset()  # Nothing by name; asked again later.
            self._hyperparameter_names = frozenset(
                key for key, value in config.items() if _is_number(value)
            )
        return self._hyperparameter_names

    def slot_names(self) -> list:
        """Named slots (OptimizerV2), or `[]` for optimizers without."""
        return []

    def slot_owner(self, method: str):
        """The optimizer, if it has named slots; else an AttributeError."""
        raise AttributeError(
            f"{method}() needs an inner optimizer with slots (a "
            "tf_keras.optimizers.legacy optimizer). Received: "
            f"inner_optimizer={self.optimizer!r}. Use "
            "`inner_optimizer.variables` instead."
        )

    def checkpoint_children(self, save_type: str, **kwargs) -> dict:
        """What a checkpoint saves under the optimizer's node."""
        return compat.trackable_children(self.optimizer, save_type, **kwargs)

    def checkpoint_child(self, name: str):
        """The child `name` (also a TF 2.x name) of the node, or None."""
        return compat.lookup_dependency(self.optimizer, name)

    def deferred_dependencies(self) -> dict:
        """Restores waiting for a child that does not exist yet."""
        return compat.deferred_dependencies(self.optimizer)

    def create_or_restore_slot(self, position, slot_name: str, variable,
                               **kwargs):
        """Restores a slot from a checkpoint (now, or once it exists)."""
        del position, slot_name, variable, kwargs  # No named slots.
        return None

    def finalize(self, var_list: list) -> None:
        """End-of-training hook (Keras 3 EMA)."""
        finalize = getattr(self.optimizer, "finalize_variable_values", None)
        if finalize is not None:
            finalize(var_list)


class _Wrapper(InnerOptimizer):
    """The constructor of every kind.

    Not on the protocol itself: before Python 3.11, `typing.Protocol`
    replaces a protocol's own `__init__` (python/cpython#88970).

    Args:
        optimizer: The optimizer to wrap, of the subclass's kind.
    """

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self._hyperparameter_names = None


def _is_number(value):
    # Python and NumPy scalars, 0-d arrays and eager tensors alike (a
    # tf_keras legacy config holds the values of its variables); not bools.
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):
        return False
    return array.ndim == 0 and array.dtype.kind in "iuf"


class KerasInner(_Wrapper):
    """A Keras 3 optimizer.

    It also restores TF 2.x checkpoints (`keras_slots`); slots that arrive
    before the optimizer is built are restored by `build`.
    """

    def __init__(self, optimizer):
        super().__init__(optimizer)
        self._pending_slot_restores = []

    def aggregated(self, packed, var_list):
        del var_list  # `packed` knows the values that are not summed.
        if replicas.replicas_in_sync() == 1:
            return packed, True
        # Keras 3 would clip each replica's gradients before its all-reduce;
        # TF 2.4 clipped the sum, and so does this (one all-reduce for all).
        return replicas.all_reduced(packed), False

    def build(self, var_list):
        if not self.optimizer.built:
            with keras.name_scope(self.optimizer.name, caller=self.optimizer):
                self.optimizer.build(var_list)
        pending, self._pending_slot_restores = self._pending_slot_restores, []
        for position, slot_name, variable in pending:
            slot = keras_slots.slot(self.optimizer, variable, slot_name)
            if slot is not None:
                compat.restore_position(position, slot)

    def check_variables(self, var_list):
        compat.keras_check_variables_are_known(self.optimizer, var_list)

    def apply(self, grads_and_vars, name, aggregate):
        del name  # Keras 3 optimizers take no name.
        if aggregate:
            return self.optimizer.apply_gradients(grads_and_vars)
        return compat.keras_apply_without_all_reduce(self.optimizer,
                                                     grads_and_vars)

    def learning_rate(self):
        schedule = compat.keras_learning_rate_schedule(self.optimizer)
        if schedule is None:
            return self.optimizer.learning_rate
        return tensor_like.ScheduledLearningRate(
            schedule, lambda: self.optimizer.learning_rate
        )

    def skip_step(self):
        # With gradient accumulation it also empties the accumulators: the
        # window that the non-finite gradient reached is dropped as a whole.
        if not getattr(self.optimizer, "gradient_accumulation_steps", None):
            self.optimizer.iterations.assign_add(1)
            return
        compat.keras_step_counter(self.optimizer).assign_add(1)
        for accumulator in compat.keras_gradient_accumulators(
            self.optimizer, compat.keras_trainable_variables(self.optimizer)
        ):
            accumulator.assign(tf.zeros_like(accumulator))

    def accumulation_window(self, var_list):
        # `is_window_end` is True when this `apply` call ends a window and
        # updates the variables; `accumulators` hold the window's sums.
        steps = getattr(self.optimizer, "gradient_accumulation_steps", None)
        if not steps:
            return None
        counter = compat.keras_step_counter(self.optimizer)
        is_window_end = tf.equal((counter + 1) % steps, 0)
        return is_window_end, compat.keras_gradient_accumulators(
            self.optimizer, var_list
        )

    def checkpoint_child(self, name):
        child = super().checkpoint_child(name)
        if child is None:
            child = keras_slots.legacy_dependency(self.optimizer, name)
        return child

    def create_or_restore_slot(self, position, slot_name, variable, **kwargs):
        if not self.optimizer.built:
            self._pending_slot_restores.append((position, slot_name, variable))
            return None
        return keras_slots.slot(self.optimizer, variable, slot_name)

    def serialize(self):
        config = keras.optimizers.serialize(self.optimizer)
        if compat.keras_is_auto_name(self.optimizer):
            # Not configuration: it depends on how many optimizers of the
            # class were built before (TF 2.x names did not).
            config["config"].pop("name", None)
        return config


class TfKerasInner(_Wrapper):
    """A tf_keras optimizer (the "new" optimizer of TF 2.11-2.15)."""

    def build(self, var_list):
        self.optimizer.build(var_list)  # A no-op once built.

    def check_variables(self, var_list):
        compat.tf_keras_check_variables_are_known(self.optimizer, var_list)

    def aggregated(self, packed, var_list):
        return _aggregated(self.optimizer.aggregate_gradients, packed,
                           var_list), False

    def apply(self, grads_and_vars, name, aggregate):
        # Only a name that was given: tf_keras's own wrapper passes none,
        # and subclasses' apply_gradients overrides need not take one.
        kwargs = {} if name is None else {"name": name}
        return self.optimizer.apply_gradients(
            grads_and_vars, skip_gradients_aggregation=not aggregate, **kwargs
        )

    def serialize(self):
        return compat.tf_keras_module().optimizers.serialize(self.optimizer)


class TfKerasLegacyInner(_Wrapper):
    """A tf_keras legacy optimizer (OptimizerV2, the TF 2.1-2.10 optimizer)."""

    def build(self, var_list):
        compat.legacy_create_all_weights(self.optimizer, var_list)

    def check_variables(self, var_list):
        del var_list  # OptimizerV2 updates any variable.

    def check_graph(self):
        pass  # OptimizerV2 runs in tf.compat.v1 graphs too.

    def aggregated(self, packed, var_list):
        return _aggregated(
            lambda pairs: compat.legacy_aggregate_gradients(self.optimizer,
                                                            pairs),
            packed, var_list), False

    def apply(self, grads_and_vars, name, aggregate):
        return self.optimizer.apply_gradients(
            grads_and_vars, name=name,
            experimental_aggregate_gradients=aggregate,
        )

    def variables(self):
        return list(self.optimizer.variables())

    def get_weights(self):
        # In a tf.compat.v1 graph too (through the default session).
        return self.optimizer.get_weights()

    def hyperparameter_names(self):
        # Exactly what TF 2.4 forwarded; the config's values are variable
        # reads, which can be empty while the first step is traced.
        return compat.legacy_hyperparameter_names(self.optimizer)

    def slot_names(self):
        return self.optimizer.get_slot_names()

    def slot_owner(self, method):
        del method
        return self.optimizer

    def create_or_restore_slot(self, position, slot_name, variable, **kwargs):
        return compat.create_or_restore_slot(
            self.optimizer, position, slot_name, variable, **kwargs
        )

    def serialize(self):
        return compat.tf_keras_module().optimizers.serialize(self.optimizer)


def _aggregated(aggregate, packed, var_list):
    """`aggregate` (a tf_keras optimizer's) applied to `packed`, repacked.

    As tf_keras's own loss scale optimizer does, `aggregate` sees only the
    pairs that have a gradient.
    """
    grads = packed.unpack()
    present = [i for i, g in enumerate(grads) if g is not None]
    summed = aggregate([(grads[i], var_list[i]) for i in present])
    for i, (grad, _) in zip(present, summed):
        grads[i] = grad
    return packing.pack(grads, var_list)


def is_supported(optimizer) -> bool:
    """Whether `optimizer` is of a kind a loss scale optimizer can wrap."""
    return (not is_loss_scale_optimizer(optimizer)
            and _kind(optimizer) is not None)


def is_loss_scale_optimizer(optimizer) -> bool:
    """Whether `optimizer` is a Keras 3 or tf_keras loss scale optimizer."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return True
    tf_keras = compat.tf_keras_module()
    return tf_keras is not None and isinstance(
        optimizer, tf_keras.mixed_precision.LossScaleOptimizer
    )


# The optimizers that a loss scale optimizer wraps (see `claim`).
_claimed = weakref.WeakSet()


def wrap(optimizer, argument_name: str) -> InnerOptimizer:
    """Returns the `InnerOptimizer` for `optimizer`, or raises.

    Args:
        optimizer: The optimizer to wrap.
        argument_name: The constructor argument it came from, for messages.

    Raises:
        TypeError: If `optimizer` is a loss scale optimizer, or not an
            optimizer of a supported kind.
        ValueError: If it scales the loss itself (Keras 3's
            `loss_scale_factor`), or another loss scale optimizer wraps it.
    """
    if is_loss_scale_optimizer(optimizer):
        raise TypeError(
            "LossScaleOptimizer cannot wrap another LossScaleOptimizer, but "
            f"got: {optimizer!r}. Wrap its inner optimizer instead (e.g. "
            f"`{argument_name}=opt.inner_optimizer`)."
        )
    factor = getattr(optimizer, "loss_scale_factor", None)
    if factor is not None:
        raise ValueError(
            "The inner optimizer already scales the loss: it has "
            f"loss_scale_factor={factor}. Set `loss_scale_factor=None` on "
            "it, or use LossScaleOptimizer(opt, dynamic=False, "
            "initial_scale=...)."
        )
    kind = _kind(optimizer)
    if kind is None:
        raise TypeError(
            f'"{argument_name}" must be an instance of '
            "`tf.keras.optimizers.Optimizer` (a Keras 3 optimizer), or of a "
            "tf_keras optimizer (`tf_keras.optimizers.Optimizer` or "
            "`tf_keras.optimizers.legacy.Optimizer`), but got: "
            f"{optimizer!r} of type {type(optimizer).__name__}."
        )
    # Only optimizers are looked up: not every object is hashable.
    if optimizer in _claimed:
        # TF 2.6+'s error: the two would share the step counter and slots,
        # and a checkpoint could not hold both.
        raise ValueError(
            '"inner_optimizer" is already wrapped by a LossScaleOptimizer. '
            "An optimizer can only be wrapped by a single LossScaleOptimizer. "
            f"Received: {argument_name}={optimizer!r}. Use the loss scale "
            "optimizer that wraps it (after `model.compile`: "
            "`model.optimizer`), or wrap a new optimizer."
        )
    return kind(optimizer)


def _kind(optimizer):
    """The `InnerOptimizer` class for `optimizer`'s kind, or None."""
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return KerasInner
    tf_keras = compat.tf_keras_module()
    if tf_keras is not None:
        if isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer):
            return TfKerasLegacyInner
        if isinstance(optimizer, tf_keras.optimizers.Optimizer):
            return TfKerasInner
    return None


def claim(inner: InnerOptimizer) -> None:
    """Marks `inner`'s optimizer as wrapped; `wrap` refuses it from now on.

    Called once a loss scale optimizer is fully constructed, so a failed
    construction leaves the optimizer free (TF 2.6 marked it first).
    """
    _claimed.add(inner.optimizer)
