"""The optimizer a loss scale optimizer wraps: one interface, one class per kind.

`InnerOptimizer` is what a loss scale optimizer needs from the optimizer it
wraps. Each kind of optimizer (a Keras 3 optimizer, a tf_keras optimizer, a
tf_keras legacy optimizer: one module each in `kinds/`) is one subclass that
covers its whole life: which optimizers and which configs are its own, build,
apply, skip, slots, checkpoint children, serialize and deserialize. Kinds
register themselves with `@register`; `wrap` and `deserialize` choose among
them, here and nowhere else, so `LossScaleOptimizer` never asks which kind it
holds: the most specific kind that takes the optimizer (the config), as the
kinds declare it (`more_specific_than`). tf_keras is optional and never
imported here (see `compat.tf_keras_module`). `ScheduledLearningRate` is the
inner optimizer's learning rate as a tensor, when it follows a schedule.

Adding a kind is one module in `kinds/` (see docs/architecture.md).
"""

from __future__ import annotations

import abc
import importlib
import pkgutil
import typing
import warnings
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

    #: The class the kind's optimizers are instances of, as users spell it
    #: (`"`tf.keras.optimizers.Optimizer`"`), and what they are in a few
    #: words (`"a Keras 3 optimizer"`): the messages that list kinds (the
    #: wrap error, `check_graph`'s, the graph rewrite's) are made of them.
    optimizer_class: typing.ClassVar[str | None] = None
    noun: typing.ClassVar[str | None] = None

    #: What the kind accepts, for the error that lists every kind. By
    #: default `optimizer_class (noun)` if the class sets `optimizer_class`
    #: itself, else None: the messages then show the class name (a kind
    #: inherits no other kind's description).
    description: typing.ClassVar[str | None] = None

    #: The kinds this one is more specific than: every optimizer (config)
    #: it accepts (reads) is one they accept (read) too, and this kind wins
    #: over them (and over the kinds they are more specific than). A kind
    #: for a subclass of Keras 3's optimizer sets `(KerasInner,)`.
    more_specific_than: typing.ClassVar[tuple[type[InnerOptimizer], ...]] = ()

    #: Whether configs that no other kind reads are this kind's: the kind
    #: of last resort for `deserialize` (Keras 3 optimizers, whose configs
    #: include TF 2.x's without a module). At most one kind sets it.
    reads_other_configs: typing.ClassVar[bool] = False

    #: Whether the kind's optimizers update variables in a `tf.compat.v1`
    #: graph run by a Session (OptimizerV2, which TF 2.4 wrapped, does);
    #: `check_graph` refuses the others there.
    runs_in_v1_graph: typing.ClassVar[bool] = False

    #: Whether Keras's own files (`.keras`, `.weights.h5`) save the
    #: optimizer itself: Keras saves the wrapper's `inner_optimizer` when it
    #: is a Keras 3 optimizer. When not, the wrapper's own entry holds the
    #: kind's `variables()`, so that no state is lost.
    saved_by_keras: typing.ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: typing.Any) -> None:
        super().__init_subclass__(**kwargs)
        if "description" not in cls.__dict__:
            own = cls.__dict__.get("optimizer_class")
            cls.description = (None if not own else
                               f"{own} ({cls.noun})" if cls.noun else own)

    def __init__(self, optimizer: typing.Any) -> None:
        self.optimizer = optimizer
        #: The steps the loss scale optimizer skipped (a tf.Variable), set
        #: by its `ApplyStep`: `iterations` counts them too (TF 2.4's rule),
        #: so `iterations - skipped_steps` steps have applied.
        self.skipped_steps: typing.Any = None

    # -- Choosing the kind (classmethods, asked by `wrap`/`deserialize`) ---

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
        """The class of a loss scale optimizer of class `wrapper` around one
        of this kind's optimizers: `wrapper`, or a subclass of it that is
        also what the kind's own framework takes (the tf_keras kinds: a
        tf_keras loss scale optimizer, so that tf_keras's `compile` keeps
        it). `LossScaleOptimizer.__new__` asks (see `wrapper_class`)."""
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
        that does not set `runs_in_v1_graph` (only OptimizerV2, the
        optimizer TF 2.4 wrapped, does).
        """
        if self.runs_in_v1_graph or not replicas.in_v1_graph():
            return
        kinds()  # The built-in ones, registered on first use.
        # In the order of registration, as `describe_kinds`.
        accepted = [kind for kind in _kinds if kind.runs_in_v1_graph]
        # E.g. "a tf_keras legacy optimizer (`tf_keras.optimizers.legacy.
        # Optimizer`)", TF 2.x's OptimizerV2, as TF 2.4 wrapped.
        wanted = _or([f"{kind.noun} ({kind.optimizer_class})" if kind.noun
                      else kind.description or kind.__name__
                      for kind in accepted]) or "no kind registered here"
        raise RuntimeError(
            "In a tf.compat.v1 graph (run by a Session), the inner "
            f"optimizer must be {wanted}: other optimizers do not update "
            f"variables there. Received: inner_optimizer={self.optimizer!r}. "
            "Use one, or train eagerly or in a tf.function."
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
        """Assigns the values a Keras file holds to `variables()`, in order.

        Args:
            values: NumPy arrays, one per variable.
            owner: The loss scale optimizer's name, for the warning.

        Warns, and assigns nothing, if the number of values differs (the
        file was written for another model).
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


def aggregated_by(
    aggregate: typing.Callable[[list], list], packed: packing.Packed,
    var_list: list,
) -> packing.Packed:
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

_kinds: list[type[InnerOptimizer]] = []  # In the order of registration.
_ordered: tuple[type[InnerOptimizer], ...] | None = None  # kinds(), cached.
_builtin_loaded = False


def _more_general(kind: type[InnerOptimizer]) -> set[type[InnerOptimizer]]:
    """The kinds `kind` is more specific than, directly or through others."""
    found: set[type[InnerOptimizer]] = set()
    todo = list(kind.more_specific_than)
    while todo:
        other = todo.pop()
        if other not in found:
            found.add(other)
            todo.extend(other.more_specific_than)
    return found


def register(kind: type[InnerOptimizer]) -> type[InnerOptimizer]:
    """Class decorator: makes `kind` one that `wrap` and `deserialize` use.

    Where several kinds accept an optimizer (read a config), the one that
    is more specific than the others (`more_specific_than`) is chosen, in
    whatever order the kinds were registered; two that are not ordered so
    are an error when both accept the same optimizer (config).

    Raises:
        TypeError: If `kind` is not an `InnerOptimizer` subclass, declares
            itself more specific than something else or (through others)
            than itself, or reads other configs when a registered kind does
            already.
    """
    global _ordered
    if not (isinstance(kind, type) and issubclass(kind, InnerOptimizer)):
        raise TypeError(
            f"register() takes an InnerOptimizer subclass. Received: {kind!r}."
        )
    for other in kind.more_specific_than:
        if not (isinstance(other, type) and issubclass(other, InnerOptimizer)):
            raise TypeError(
                f"{kind.__name__}.more_specific_than must hold InnerOptimizer "
                f"subclasses (kinds). Received: {other!r}."
            )
    if kind in _more_general(kind):
        raise TypeError(
            f"{kind.__name__} is more specific than itself (through "
            "`more_specific_than`): no kind could win over the other."
        )
    if kind.reads_other_configs and any(k.reads_other_configs
                                        for k in _kinds if k is not kind):
        raise TypeError(
            f"{kind.__name__} reads other configs, but a registered kind "
            "does already; at most one kind can be the last resort."
        )
    if kind not in _kinds:
        _kinds.append(kind)
        _ordered = None
    return kind


def unregister(kind: type[InnerOptimizer]) -> None:
    """Undoes `register(kind)` (for tests)."""
    global _ordered
    _kinds.remove(kind)
    _ordered = None


def kinds() -> tuple[type[InnerOptimizer], ...]:
    """The registered kinds, the most specific first.

    A kind comes before every kind it is more specific than; kinds that are
    not ordered so (which never accept the same optimizer) come latest
    registered first. The built-in ones (every module in `kinds/`) are
    imported on first use.
    """
    global _builtin_loaded, _ordered
    if not _builtin_loaded:
        _builtin_loaded = True
        package = importlib.import_module(f"{__package__}.kinds")
        builtin: list[type[InnerOptimizer]] = []
        for info in sorted(pkgutil.iter_modules(package.__path__),
                           key=lambda info: info.name):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            builtin += [k for k in _kinds if k.__module__ == module.__name__]
        # The built-in kinds in their modules' order, whichever module was
        # imported first, so that messages list them alike in any process.
        _kinds[:] = builtin + [k for k in _kinds if k not in builtin]
    if _ordered is None:
        remaining = list(reversed(_kinds))
        ordered = []
        while remaining:
            # The first kind that no remaining kind is more specific than.
            kind = next(k for k in remaining if not any(
                k in _more_general(other) for other in remaining))
            remaining.remove(kind)
            ordered.append(kind)
        _ordered = tuple(ordered)
    return _ordered


def _most_specific(candidates: list[type[InnerOptimizer]],
                   what: str) -> type[InnerOptimizer] | None:
    """The one kind of `candidates` more specific than all the others.

    Raises:
        TypeError: If several are not ordered by `more_specific_than`.
    """
    best = [kind for kind in candidates if not any(
        kind in _more_general(other) for other in candidates)]
    if len(best) > 1:
        *others, last = sorted(kind.__name__ for kind in best)
        raise TypeError(
            f"The inner optimizer kinds {', '.join(others)} and {last} all "
            f"take {what}, and none "
            "is more specific than the others. Set `more_specific_than` on "
            "the kind that should win (its accepts/reads_config must then "
            "be narrower than theirs), or make them take different ones."
        )
    return best[0] if best else None


def kind_of(optimizer: typing.Any) -> type[InnerOptimizer] | None:
    """The kind `optimizer` is of (the most specific that accepts it), or None.

    Raises:
        TypeError: If two kinds accept it and neither is more specific.
    """
    return _most_specific(
        [kind for kind in kinds() if kind.accepts(optimizer)],
        f"the optimizer {optimizer!r}")


def _or(items: list[str]) -> str:
    """`"a, b or c"` (each item once)."""
    items = list(dict.fromkeys(items))
    if len(items) < 2:
        return "".join(items)
    return f"{', '.join(items[:-1])} or {items[-1]}"


def describe_kinds() -> str:
    """Every registered kind's `description`, for messages: `"A, B or C"`.

    In the order of registration (the built-in kinds first).
    """
    kinds()  # The built-in ones, registered on first use.
    return _or([kind.description or kind.__name__ for kind in _kinds])


def is_supported(optimizer: typing.Any) -> bool:
    """Whether `optimizer` is of a kind a loss scale optimizer can wrap."""
    return (not is_loss_scale_optimizer(optimizer)
            and kind_of(optimizer) is not None)


def is_loss_scale_optimizer(optimizer: typing.Any) -> bool:
    """Whether `optimizer` is a Keras 3 or tf_keras loss scale optimizer."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return True
    tf_keras = compat.tf_keras_module()
    return tf_keras is not None and isinstance(
        optimizer, tf_keras.mixed_precision.LossScaleOptimizer
    )


def wrapper_class(wrapper: type, optimizer: typing.Any) -> type:
    """The class a loss scale optimizer of class `wrapper` around
    `optimizer` is made of: the kind's `wrapper_class(wrapper)`; `wrapper`
    itself for anything `wrap` refuses (its constructor says why)."""
    if not is_supported(optimizer):
        return wrapper
    kind = kind_of(optimizer)
    assert kind is not None  # is_supported
    return kind.wrapper_class(wrapper)


# The optimizers that a loss scale optimizer wraps (see `claim`).
_claimed: weakref.WeakSet[typing.Any] = weakref.WeakSet()


def wrap(optimizer: typing.Any, argument_name: str) -> InnerOptimizer:
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
        raise TypeError(
            f'"{argument_name}" must be an instance of {describe_kinds()}, '
            f"but got: {optimizer!r} of type {type(optimizer).__name__}."
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


def claim(inner: InnerOptimizer) -> None:
    """Marks `inner`'s optimizer as wrapped; `wrap` refuses it from now on.

    Called once a loss scale optimizer is fully constructed, so a failed
    construction leaves the optimizer free (TF 2.6 marked it first).
    """
    _claimed.add(inner.optimizer)


def deserialize(config: typing.Any,
                custom_objects: dict | None = None) -> typing.Any:
    """Creates an optimizer from a serialized inner optimizer.

    The most specific kind that `reads_config` builds it; otherwise the kind
    that `reads_other_configs` (Keras 3, which also reads TF 2.x configs).

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
    kind = _most_specific([k for k in registered if k.reads_config(config)],
                          f"the config {config!r}")
    if kind is None:
        kind = next(k for k in registered if k.reads_other_configs)
    return kind.deserialize(config, custom_objects)
