"""The optimizer a loss scale optimizer wraps: one interface, one class per kind.

`InnerOptimizer` is what a loss scale optimizer needs from the optimizer it
wraps. Each kind is a subclass, in its own module in `kinds/`. It covers
its optimizers' whole life: which optimizers and configs are its own,
build, apply, skip, slots and checkpoints. `wrapping` picks the kind, so
`LossScaleOptimizer` never asks which kind it holds.
`ScheduledLearningRate` is the learning rate when it follows a schedule.
"""

from __future__ import annotations

import abc
import inspect
import typing
import warnings

import tensorflow as tf

from tf_lso._src import compat
from tf_lso._src.gradients import packing
from tf_lso._src.scaling import tensor_like
from tf_lso._src.scaling import validation


class InnerOptimizer(abc.ABC):
    """What a loss scale optimizer needs from the optimizer it wraps.

    A kind implements the abstract methods and inherits the defaults.

    Args:
        optimizer: The optimizer to wrap, of the subclass's kind.
    """

    #: Messages that list kinds name each one twice: its optimizers' class
    #: as users spell it, and a few words, e.g. "a Keras 3 optimizer".
    optimizer_class: typing.ClassVar[str]
    noun: typing.ClassVar[str]

    #: Whether the kind's optimizers update variables in a `tf.compat.v1`
    #: graph run by a Session. The step refuses the others there.
    runs_in_v1_graph: typing.ClassVar[bool] = False

    #: Whether Keras's own files (`.keras`, `.weights.h5`) save the
    #: optimizer. They do for a Keras 3 optimizer. Otherwise the wrapper's
    #: own entry holds the kind's `variables()`, so no state is lost.
    saved_by_keras: typing.ClassVar[bool] = False

    def __init__(self, optimizer: typing.Any) -> None:
        self.optimizer = optimizer

    # -- Choosing the kind (classmethods, asked by `wrapping`) ---------------

    @classmethod
    @abc.abstractmethod
    def accepts(cls, optimizer: typing.Any) -> bool:
        """Whether `optimizer` is of this kind."""

    @classmethod
    def reads_config(cls, config: dict) -> bool:
        """Whether a serialized optimizer `config` is of this kind."""
        del config
        return False

    @classmethod
    def wrapper_class(cls, wrapper: type) -> type:
        """The class of a `wrapper` around one of this kind's optimizers.

        It is `wrapper`, or for the tf_keras kinds a subclass that
        tf_keras's `compile` keeps. `LossScaleOptimizer.__new__` asks.
        """
        return wrapper

    @classmethod
    @abc.abstractmethod
    def deserialize(cls, config: dict,
                    custom_objects: dict | None = None) -> typing.Any:
        """Creates an optimizer of this kind from `serialize()`'s output.

        `config` is the caller's copy: it may be edited.
        """

    # -- What every kind implements ---------------------------------------

    @abc.abstractmethod
    def build(self, var_list: list) -> None:
        """Creates the variables (slots) for `var_list`; idempotent."""

    @abc.abstractmethod
    def check_variables(self, var_list: list) -> None:
        """Raises the optimizer's own error for variables it cannot update."""

    @abc.abstractmethod
    def aggregated(self, packed: packing.Packed,
                   var_list: list) -> tuple[packing.Packed, bool]:
        """Sums gradients over replicas as the optimizer's own apply would.

        It runs before the finite check, so that the check sees what the
        optimizer applies. A sum that is not finite (an overflow, a custom
        aggregator) skips the step.

        Returns:
            `(packed, aggregate)`: the gradients to check and to apply, and
            whether `apply` must still sum them. It must only on one
            replica, where the sum changes nothing.
        """

    @abc.abstractmethod
    def apply(self, grads_and_vars: list, name: str | None,
              aggregate: bool, skipped_steps: typing.Any) -> typing.Any:
        """Applies unscaled gradients, summed over replicas if `aggregate`.

        `skipped_steps` (an int64 variable) counts the steps skipped so
        far: `iterations - skipped_steps` steps have applied.

        Returns what the optimizer's own apply returns. In a `tf.compat.v1`
        graph that is the op that runs the update.
        """

    @abc.abstractmethod
    def serialize(self) -> dict:
        """The optimizer's serialized config."""

    # -- Defaults ------------------------------------------------------------

    def overrides_apply_gradients(self) -> bool:
        """Whether the optimizer's `apply_gradients` is a subclass's own.

        Such an override gets each replica's gradients. It sums them in its
        `super().apply_gradients`, after what it does first (such as
        clipping), so the step does not sum them before.
        """
        return False

    def check_graph(self) -> None:
        """Raises RuntimeError where the optimizer cannot run a step.

        The step asks it after refusing a `tf.compat.v1` graph where
        `runs_in_v1_graph` is False. By default every context can.
        """
        return

    def skip_step(self) -> None:
        """What a skipped step does instead of `apply`: counts the step."""
        self.optimizer.iterations.assign_add(1)

    @property
    def accumulation_steps(self) -> int | None:
        """The calls a gradient accumulation window has, or None."""
        return None  # Only Keras 3 optimizers accumulate.

    def accumulation_window(self, var_list: list) -> tuple | None:
        """`(is_window_end, accumulators)` with gradient accumulation, else None."""
        del var_list
        return None

    @property
    def iterations(self) -> tf.Variable:
        """The step counter."""
        return self.optimizer.iterations

    def set_iterations(self, value: typing.Any) -> None:
        """Assigns the step counter."""
        self.optimizer.iterations.assign(value)

    def variables(self) -> list[typing.Any]:
        """The optimizer's variables (step counter, slots, ...)."""
        return list(self.optimizer.variables)

    def get_weights(self) -> list[typing.Any]:
        """The values of `variables()`, as NumPy arrays."""
        return [v.numpy() for v in self.variables()]

    def load_variables(self, values: list[typing.Any], owner: str) -> None:
        """Assigns a Keras file's NumPy `values` to `variables()`, in order.

        If the counts differ, the file was written for another model: it
        warns, naming the loss scale optimizer (`owner`), and assigns
        nothing.
        """
        variables = self.variables()
        if len(values) != len(variables):
            warnings.warn(
                f"Skipping loading the inner optimizer's state of optimizer "
                f"'{owner}': the file holds {len(values)} of its variables "
                f"but it has {len(variables)}.",
                stacklevel=4,
            )
            return
        for variable, value in zip(variables, values):
            variable.assign(value)

    def learning_rate(self) -> typing.Any:
        """The learning rate, callable with a step if it follows a schedule."""
        return self.optimizer.learning_rate

    def hyperparameter_names(self) -> frozenset[str]:
        """The attributes a wrapper forwards: the numeric config entries.

        `forwarding` asks once, when the optimizer is wrapped. These are
        the numeric hyperparameters (`learning_rate`, `beta_1`, ...), not
        flags such as SGD's `nesterov`.
        """
        # Eagerly: a tf_keras legacy config reads variable values.
        with tf.init_scope():
            try:
                config = self.optimizer.get_config()
            except Exception:  # noqa: BLE001 - custom get_config.
                return frozenset()  # Nothing is forwarded by name.
        return frozenset(key for key, value in config.items()
                         if validation.is_scalar_number(value))

    def slot_names(self) -> list[str]:
        """Named slots (OptimizerV2), or `[]` for optimizers without."""
        return []

    def slot_owner(self, method: str) -> typing.Any:
        """The optimizer, if it has named slots; else an AttributeError."""
        raise AttributeError(
            f"{method}() needs an inner optimizer with slots (a "
            "tf_keras.optimizers.legacy optimizer). Received: "
            f"inner_optimizer={self.optimizer!r}. Use "
            "`inner_optimizer.variables` instead."
        )

    def checkpoint_children(self, save_type: str,
                            **kwargs: typing.Any) -> dict[str, typing.Any]:
        """What a checkpoint saves under the optimizer's node."""
        return compat.trackable_children(self.optimizer, save_type, **kwargs)

    def checkpoint_child(self, name: str) -> typing.Any:
        """The child `name` (also a TF 2.x name) of the node, or None."""
        return compat.lookup_dependency(self.optimizer, name)

    def deferred_dependencies(self) -> dict[str, typing.Any]:
        """Restores waiting for a child that does not exist yet."""
        return compat.deferred_dependencies(self.optimizer)

    def create_or_restore_slot(self, position: typing.Any, slot_name: str,
                               variable: typing.Any,
                               **kwargs: typing.Any) -> typing.Any:
        """Restores a slot from a checkpoint (now, or once it exists)."""
        del position, slot_name, variable, kwargs  # No named slots.
        return None

    def finalize(self, var_list: typing.Sequence[typing.Any]) -> None:
        """End-of-training hook (Keras 3 EMA)."""
        finalize = getattr(self.optimizer, "finalize_variable_values", None)
        if finalize is not None:
            finalize(var_list)


class ScheduledLearningRate(tensor_like.TensorLike):
    """The learning rate of an optimizer that follows a schedule.

    TF 2.x code calls the learning rate with a step, and Keras 3 code reads
    its current value. This object does both. Called with a step, it
    returns the schedule's value at that step. As a tensor, it is the
    current learning rate. The schedule's public attributes
    (`get_config`, `initial_learning_rate`, ...) read through.

    Args:
        schedule: The `LearningRateSchedule` (or callable) of the optimizer.
        current: A zero-argument callable returning the current value.
    """

    def __init__(self, schedule: typing.Any,
                 current: typing.Callable[[], typing.Any]) -> None:
        self._schedule = schedule
        self._current = current

    @property
    def schedule(self) -> typing.Any:
        """The learning rate schedule."""
        return self._schedule

    def __call__(self, step: typing.Any) -> typing.Any:
        """The schedule's learning rate at `step`."""
        return self._schedule(step)

    def _value(self) -> typing.Any:
        return tf.convert_to_tensor(self._current(), tf.float32)

    def __getattr__(self, name: str) -> typing.Any:
        # Only reached when normal lookup fails. The schedule's names are
        # listed here, not in __init__, because every `opt.learning_rate`
        # read makes a new object.
        schedule = self.__dict__.get("_schedule")
        if (schedule is not None and not name.startswith("_")
                and name in dir(schedule)):
            return getattr(schedule, name)
        raise AttributeError(
            f"'{type(self).__name__}' object has no attribute '{name}'. It "
            f"reads through the public attributes of its schedule "
            f"{type(schedule).__name__}; this is not one of them."
        )

    def __repr__(self) -> str:
        return f"<ScheduledLearningRate of {self._schedule!r}>"


def aggregated_by(
    aggregate: typing.Callable[[list], list], packed: packing.Packed,
    var_list: list,
) -> packing.Packed:
    """`packed`, summed by `aggregate` (a tf_keras optimizer's aggregator).

    As in tf_keras's own loss scale optimizer, `aggregate` sees only the
    pairs that have a gradient. Returns a new `Packed`.
    """
    grads = packed.unpack()
    present = [i for i, g in enumerate(grads) if g is not None]
    summed = aggregate([(grads[i], var_list[i]) for i in present])
    for i, (grad, _) in zip(present, summed):
        grads[i] = grad
    return packing.pack(grads, var_list)


def name_argument(apply_gradients: typing.Callable[..., typing.Any],
                  name: typing.Any, *, base_takes_name: bool,
                  keywords: tuple[str, ...] = ()) -> tuple[typing.Any, ...]:
    """The positional arguments after the gradients that carry `name`.

    The wrapper's `name` goes second, where TF 2.x code expects it, if
    `apply_gradients` (a bound method) has a second positional parameter
    besides the `keywords` that the caller passes by name. A subclass may
    use that place for something else (TensorFlowTTS's `AdamWeightDecay`
    takes a clip norm there), and gets `name` as it did in TF 2.x. An
    override with `*args` passes them to its base, so `name` goes there if
    the base takes one (`base_takes_name`; Keras 3's takes none). A None
    name is not passed, so that an override's default applies.
    """
    if name is None:
        return ()
    try:
        parameters = inspect.signature(apply_gradients).parameters.values()
    except (TypeError, ValueError):  # A builtin: pass it.
        return (name,)
    positional = [p for p in parameters if p.kind in (
        p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in keywords]
    if len(positional) > 1:
        return (name,)
    if base_takes_name and any(p.kind == p.VAR_POSITIONAL
                               for p in parameters):
        return (name,)
    return ()
