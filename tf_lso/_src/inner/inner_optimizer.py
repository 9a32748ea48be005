"""The optimizer a loss scale optimizer wraps: one interface, one class per kind.

`InnerOptimizer` is what a loss scale optimizer needs from the optimizer it
wraps. Each kind of optimizer (a Keras 3 optimizer, a tf_keras optimizer, a
tf_keras legacy optimizer: one module each in `kinds/`) is one subclass that
covers its whole life: which optimizers and which configs are its own, build,
apply, skip, slots, checkpoint children, serialize and deserialize. Kinds
register themselves with `@register`; `wrap` and `deserialize` choose among
them, here and nowhere else, so `LossScaleOptimizer` never asks which kind it
holds. tf_keras is optional and never imported here (see
`compat.tf_keras_module`).

Adding a kind is one module in `kinds/` (see docs/architecture.md).
"""

from __future__ import annotations

import abc
import importlib
import pkgutil
import typing
import weakref

import keras
import tensorflow as tf

from tf_lso._src import compat
from tf_lso._src.gradients import packing
from tf_lso._src.gradients import replicas
from tf_lso._src.scaling import tensor_like
from tf_lso._src.scaling import validation


class InnerOptimizer(abc.ABC):
    """What a loss scale optimizer needs from the optimizer it wraps.

    An abstract base class, as `LossScale` is: a kind implements the
    abstract methods and inherits the defaults.

    Args:
        optimizer: The optimizer to wrap, of the subclass's kind.
    """

    #: What the kind accepts, for the error that lists every kind.
    description: typing.ClassVar[str | None] = None

    #: Whether configs that no other kind reads are this kind's: the kind
    #: of last resort for `deserialize` (Keras 3 optimizers, whose configs
    #: include TF 2.x's without a module). At most one kind sets it.
    reads_other_configs: typing.ClassVar[bool] = False

    def __init__(self, optimizer):
        self.optimizer = optimizer
        #: The steps the loss scale optimizer skipped (a tf.Variable), set
        #: by its `ApplyStep`: `iterations` counts them too (TF 2.4's rule),
        #: so `iterations - skipped_steps` steps have applied.
        self.skipped_steps = None

    # -- Choosing the kind (classmethods, asked by `wrap`/`deserialize`) ---

    @classmethod
    @abc.abstractmethod
    def accepts(cls, optimizer) -> bool:
        """Whether `optimizer` is of this kind."""

    @classmethod
    def reads_config(cls, config: dict) -> bool:
        """Whether a serialized optimizer `config` is of this kind."""
        del config
        return False

    @classmethod
    @abc.abstractmethod
    def deserialize(cls, config: dict, custom_objects=None) -> typing.Any:
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

        Called before the finite check, so that the check sees what the
        optimizer applies (TF 2.5+'s order, and tf_keras's): a value that
        the summing makes non-finite (a custom aggregator, a float16
        all-reduce, a sum that overflows) skips the step.

        Returns:
            `(packed, aggregate)`: the gradients to check and to apply, and
            whether `apply` must still sum them (only where that sum is the
            identity: one replica).
        """

    @abc.abstractmethod
    def apply(self, grads_and_vars: list, name: str | None,
              aggregate: bool) -> typing.Any:
        """Applies unscaled gradients (summing over replicas if `aggregate`).

        Returns what the optimizer's own apply returns (in a `tf.compat.v1`
        graph, a tf_keras legacy optimizer's op that runs the update).
        """

    @abc.abstractmethod
    def serialize(self) -> dict:
        """The optimizer's serialized config."""

    # -- Defaults ------------------------------------------------------------

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

        Asked once, when the optimizer is wrapped (`forwarding`).

        TF 2.4 forwarded the inner optimizer's `_hyper` dict, its numeric
        hyperparameters (`learning_rate`, `beta_1`, `momentum`, ...); flags
        such as SGD's `nesterov` were not forwarded, and are not here.
        tf_keras legacy optimizers forward that very dict.
        """
        # Eagerly: a tf_keras legacy config reads variable values.
        with tf.init_scope():
            try:
                config = self.optimizer.get_config()
            except Exception:  # noqa: BLE001 - custom get_config.
                return frozenset()  # Then nothing is forwarded by name.
        return frozenset(key for key, value in config.items()
                         if validation.is_scalar_number(value))

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


class ScheduledLearningRate(tensor_like.TensorLike):
    """The learning rate of an optimizer that follows a schedule.

    TF 2.x's `opt.learning_rate` was the schedule itself, so TF 2.x code
    calls it: `opt.learning_rate(opt.iterations)`. Keras 3's is the current
    value. This object is both: called with a step it returns the schedule's
    value at that step; used as a tensor it is the current learning rate.
    The schedule's public attributes (`get_config`, `initial_learning_rate`,
    ...) are read through, by a list of its public names.

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
        """The schedule's learning rate at `step`, as TF 2.x's schedule."""
        return self._schedule(step)

    def _value(self) -> typing.Any:
        return tf.convert_to_tensor(self._current(), tf.float32)

    def __getattr__(self, name: str) -> typing.Any:
        # Only reached when normal lookup fails. The schedule's public
        # names are listed here, not in __init__: a new object is made on
        # every `opt.learning_rate` read.
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


def aggregated_by(aggregate, packed, var_list):
    """`aggregate` (a tf_keras optimizer's aggregator) applied to `packed`.

    As tf_keras's own loss scale optimizer does, `aggregate` sees only the
    pairs that have a gradient. Returns a new `Packed`.
    """
    grads = packed.unpack()
    present = [i for i, g in enumerate(grads) if g is not None]
    summed = aggregate([(grads[i], var_list[i]) for i in present])
    for i, (grad, _) in zip(present, summed):
        grads[i] = grad
    return packing.pack(grads, var_list)


# -- The registry of kinds ---------------------------------------------------

_kinds = []  # Consulted in order: the latest registration first.
_builtin_loaded = False


def register(kind: type[InnerOptimizer]) -> type[InnerOptimizer]:
    """Class decorator: makes `kind` one that `wrap` and `deserialize` use.

    Kinds registered later are consulted first, so a kind for a subclass
    of another kind's optimizers wins over it.

    Raises:
        TypeError: If `kind` is not an `InnerOptimizer` subclass, or reads
            other configs when a registered kind does already.
    """
    if not (isinstance(kind, type) and issubclass(kind, InnerOptimizer)):
        raise TypeError(
            f"register() takes an InnerOptimizer subclass. Received: {kind!r}."
        )
    if kind.reads_other_configs and any(k.reads_other_configs
                                        for k in _kinds):
        raise TypeError(
            f"{kind.__name__} reads other configs, but a registered kind "
            "does already; at most one kind can be the last resort."
        )
    if kind not in _kinds:
        _kinds.insert(0, kind)
    return kind


def unregister(kind: type[InnerOptimizer]) -> None:
    """Undoes `register(kind)` (for tests)."""
    _kinds.remove(kind)


def kinds() -> tuple:
    """The registered kinds, in the order they are consulted.

    The built-in ones (every module in `kinds/`) are imported on first use.
    """
    global _builtin_loaded
    if not _builtin_loaded:
        _builtin_loaded = True
        package = importlib.import_module(f"{__package__}.kinds")
        for info in sorted(pkgutil.iter_modules(package.__path__),
                           key=lambda info: info.name):
            importlib.import_module(f"{package.__name__}.{info.name}")
    return tuple(_kinds)


def kind_of(optimizer) -> type[InnerOptimizer] | None:
    """The kind `optimizer` is of, or None."""
    return next((kind for kind in kinds() if kind.accepts(optimizer)), None)


def is_supported(optimizer) -> bool:
    """Whether `optimizer` is of a kind a loss scale optimizer can wrap."""
    return (not is_loss_scale_optimizer(optimizer)
            and kind_of(optimizer) is not None)


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
    kind = kind_of(optimizer)
    if kind is None:
        accepted = [k.description or k.__name__ for k in reversed(kinds())]
        raise TypeError(
            f'"{argument_name}" must be an instance of '
            f"{', '.join(accepted[:-1])} or {accepted[-1]}, but got: "
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
    inner = kind(optimizer)
    for listener in _wrap_listeners:
        listener(inner)
    return inner


# Called with every new `InnerOptimizer`: the layers above learn which kinds
# are in use without this layer importing them (see `on_wrap`).
_wrap_listeners = []


def on_wrap(listener: typing.Callable[[InnerOptimizer], None]) -> None:
    """Calls `listener(inner)` whenever `wrap` wraps an optimizer.

    The legacy-Keras route's compile hook uses it: wrapping a tf_keras
    optimizer makes tf_keras's `compile` take tf_lso's optimizers.
    """
    if listener not in _wrap_listeners:
        _wrap_listeners.append(listener)


def claim(inner: InnerOptimizer) -> None:
    """Marks `inner`'s optimizer as wrapped; `wrap` refuses it from now on.

    Called once a loss scale optimizer is fully constructed, so a failed
    construction leaves the optimizer free (TF 2.6 marked it first).
    """
    _claimed.add(inner.optimizer)


def deserialize(config, custom_objects=None):
    """Creates an optimizer from a serialized inner optimizer.

    The first kind that `reads_config` builds it; otherwise the kind that
    `reads_other_configs` (Keras 3, which also reads TF 2.x configs).

    Args:
        config: A serialized optimizer dict, or an optimizer instance
            (returned as it is).
        custom_objects: Optional dict of custom classes.

    Returns:
        An optimizer.
    """
    if not isinstance(config, dict):
        return config
    # Keras's deserialize functions edit the dict they are given (they
    # lower-case `class_name`); the caller's config stays as it was: new
    # dicts and lists all the way down, the same values.
    config = tf.nest.map_structure(lambda value: value, config)
    registered = kinds()
    kind = next((k for k in registered if k.reads_config(config)), None)
    if kind is None:
        kind = next(k for k in registered if k.reads_other_configs)
    return kind.deserialize(config, custom_objects)
