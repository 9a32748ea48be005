"""The two tf_keras kinds: `tf_keras.optimizers.*` and its `legacy.*`.

tf_keras is optional: these kinds accept nothing when it is not installed
(`compat.tf_keras_module`), and import it only to read a config of theirs.
Both write and read their configs with tf_keras's own serialization. Where
`tf.keras` is tf_keras (`TF_USE_LEGACY_KERAS=1`), a TF 2.x config (no
`module`, no `is_legacy_optimizer`) is a tf_keras legacy optimizer's, as
tf_keras's own `LossScaleOptimizer.from_config` reads it.

A loss scale optimizer around a tf_keras optimizer is an instance of
`tf_keras_wrapper_class`: a subclass of its class that is also the
tf_keras loss scale optimizer tf_keras would make around the same inner
optimizer (`tf_keras.mixed_precision.LossScaleOptimizer` and tf_keras's
`Optimizer`, or its legacy `Optimizer`), so that tf_keras's `compile`, `fit`,
saving and `isinstance` checks take the very object the user made (see
docs/architecture.md).
"""

from __future__ import annotations

import functools
import importlib
import typing

import keras
import tensorflow as tf

from tf_lso._src import compat
from tf_lso._src.gradients import packing
from tf_lso._src.inner import inner_optimizer


def is_tf_keras_config(config: dict) -> bool | None:
    """Whether `config` is a tf_keras optimizer's: True for a legacy one.

    tf_keras writes `module: keras.optimizers.legacy` for a legacy optimizer
    and an `is_legacy_optimizer` entry for both. Returns None for configs
    that are not tf_keras's, False for a (new) tf_keras optimizer's.
    """
    inner_config = config.get("config", {})
    has_flag = (isinstance(inner_config, dict)
                and "is_legacy_optimizer" in inner_config)
    if config.get("module") == "keras.optimizers.legacy" or (
            has_flag and inner_config["is_legacy_optimizer"]):
        return True
    if has_flag:
        return False
    if "module" not in config and compat.tf_keras_is_tf_keras():
        # TF 2.x's (OptimizerV2's) config, on the route where `tf.keras`
        # is tf_keras: tf_keras's own class reads it as a legacy one.
        return True
    return None


class TfKerasKind(inner_optimizer.InnerOptimizer):
    """What both tf_keras kinds share: their configs, read and written by
    tf_keras (either kind reads either one's)."""

    @classmethod
    def deserialize(cls, config: dict,
                    custom_objects: dict | None = None) -> typing.Any:
        tf_keras = importlib.import_module("tf_keras")
        # Without a module: tf_keras's legacy serialization (HDF5 and
        # SavedModel metadata, TF 2.x configs).
        return tf_keras.optimizers.deserialize(
            config, custom_objects=_with_keras_custom_objects(
                config, custom_objects),
            use_legacy_format="module" not in config)

    def serialize(self) -> dict:
        tf_keras = compat.tf_keras_module()
        assert tf_keras is not None  # The optimizer is a tf_keras one.
        return tf_keras.optimizers.serialize(self.optimizer)


def _create_all_weights(self: typing.Any, var_list: list) -> None:
    self.build(var_list)


# What every class's namespace holds about the class itself.
_CLASS_BOOKKEEPING = frozenset({
    "__module__", "__qualname__", "__doc__", "__dict__", "__weakref__",
    "__annotations__", "__abstractmethods__", "_abc_impl", "__slots__",
    "__orig_bases__", "__parameters__", "__firstlineno__",
    "__static_attributes__"})


@functools.cache
def tf_keras_wrapper_class(wrapper: type, *, legacy: bool) -> type:
    """`wrapper` (a tf_lso loss scale optimizer class), as tf_keras takes it.

    A subclass of `wrapper` and of what tf_keras's own loss scale optimizer
    is around the same inner optimizer: tf_keras's `LossScaleOptimizer` and
    its `Optimizer` (`legacy`: its legacy `Optimizer`, OptimizerV2), named
    `TfKeras<name>` (`TfKerasLegacy<name>`: tf_keras's
    `optimizers.deserialize` reads a class named `LossScaleOptimizer` as its
    own) and serialized under `wrapper`'s registered name (tf_keras's and
    Keras 3's registries lead that name back to `wrapper`). Everything it
    does is `wrapper`'s: it adds no behaviour.
    tf_keras's `compile` then keeps the optimizer, `isinstance` of the
    class the user named holds, `get_config()` and serialization are the
    user's optimizer's, and tf_keras's `.keras` files save it (tf_keras
    saves its `Optimizer`s only: the legacy one is added,
    `compat.tf_keras_files_hold`).
    """
    made_from = vars(wrapper).get("_tf_keras_made_from")
    if made_from is not None:  # Made here: the class it was made from.
        return tf_keras_wrapper_class(made_from, legacy=legacy)
    tf_keras = importlib.import_module("tf_keras")
    optimizer_base = (tf_keras.optimizers.legacy.Optimizer if legacy
                      else tf_keras.optimizers.Optimizer)
    tf_keras_bases = (tf_keras.mixed_precision.LossScaleOptimizer,
                      optimizer_base)
    # tf_keras's metaclass picks a class by the inner optimizer's type when
    # `tf_keras.mixed_precision.LossScaleOptimizer(...)` is called; here
    # the class is chosen, so construction is plain.
    meta = type("TfKerasWrapperMeta", (type(tf_keras_bases[0]),),
                {"__call__": type.__call__})
    name = f"TfKeras{'Legacy' if legacy else ''}{wrapper.__name__}"
    # tf_keras's classes share TensorFlow's AutoTrackable with Keras 3's,
    # so they come before the rest of Keras 3's chain (its BaseOptimizer)
    # in the method order: `keras_first`, just before them, gives back
    # every attribute they would take from that rest (`__init__`,
    # `_build_learning_rate`, ...). Only what tf_keras alone defines is
    # tf_keras's.
    keras_first = type(f"{name}KerasFirst", (), {
        "__module__": wrapper.__module__})
    namespace: dict[str, typing.Any] = {
        "__module__": wrapper.__module__, "__qualname__": name,
        "__doc__": wrapper.__doc__, "__reduce__": _reduce_as(wrapper),
        "_tf_keras_made_from": wrapper}
    if legacy:
        # What tf_keras's HDF5 loading calls on a legacy optimizer.
        namespace["_create_all_weights"] = _create_all_weights
    variant = meta(name, (wrapper, keras_first, *tf_keras_bases), namespace)
    if legacy:
        # tf_keras's own `.keras` files hold no legacy optimizer's state.
        compat.tf_keras_files_hold(variant)
    order = variant.__mro__
    tf_keras_block = [c for c in order
                      if c.__module__.split(".")[0] == "tf_keras"]
    assert order[order.index(keras_first) + 1] is tf_keras_block[0]
    rest = order[order.index(tf_keras_block[-1]) + 1:]
    for attribute in sorted({a for c in tf_keras_block for a in vars(c)}
                            - _CLASS_BOOKKEEPING):
        owner = next((c for c in rest if attribute in vars(c)), None)
        if owner is not None:
            setattr(keras_first, attribute, vars(owner)[attribute])
    registered = keras.saving.get_registered_name(wrapper)
    package, separator, registered_as = registered.rpartition(">")
    if separator:
        # Serialized under the name of the class called, which leads back
        # to it (its `__new__` picks this class again), in every process
        # where it is registered: files load without this class made yet.
        for framework in (tf_keras, keras):
            register = framework.saving.register_keras_serializable(
                package=package, name=registered_as)
            register(variant)
            register(wrapper)
    return variant


def _reduce_as(wrapper: type) -> typing.Callable[[typing.Any], typing.Any]:
    """`__reduce__` for the class made from `wrapper`: Keras pickles an
    optimizer as (a classmethod of its class, its file); the class made
    here is found by no module, so the classmethod is `wrapper`'s."""

    reduce: typing.Any = wrapper.__reduce__  # Keras's (KerasSaveable).

    def __reduce__(self: typing.Any) -> typing.Any:
        rebuild, *rest = reduce(self)
        if getattr(rebuild, "__self__", None) is type(self):
            rebuild = getattr(wrapper, rebuild.__name__)
        return (rebuild, *rest)

    return __reduce__


def _with_keras_custom_objects(config: dict,
                               custom_objects: dict | None) -> dict:
    """`custom_objects` plus Keras 3's custom object for `config`'s class.

    Keras 3 hands custom objects over in a `custom_object_scope` (as
    `keras.optimizers.deserialize` and `load_model` do) or registers them;
    tf_keras does not look there, so the class is passed on by name.
    """
    custom_objects = dict(custom_objects or {})
    for name in (config.get("registered_name"), config.get("class_name")):
        if isinstance(name, str) and name not in custom_objects:
            found = keras.saving.get_registered_object(name)
            if found is not None:
                custom_objects[name] = found
    return custom_objects


def _apply_gradients(optimizer: typing.Any, grads_and_vars: list,
                     name: str | None, flag: str, value: bool,
                     default: bool) -> typing.Any:
    """`optimizer.apply_gradients` with `name` (see
    `inner_optimizer.name_argument`) and its aggregation `flag` set to
    `value`, passed only when it is not the `default`: an override need not
    take the flag (TensorFlowTTS's `AdamWeightDecay` does not)."""
    apply_gradients = optimizer.apply_gradients
    return apply_gradients(
        grads_and_vars,
        *inner_optimizer.name_argument(apply_gradients, name,
                                       base_takes_name=True,
                                       keywords=(flag,)),
        **({} if value == default else {flag: value}))


def _tf_keras_optimizers() -> typing.Any:
    tf_keras = compat.tf_keras_module()
    return None if tf_keras is None else tf_keras.optimizers


class TfKerasInner(TfKerasKind):
    """A tf_keras optimizer (the "new" optimizer of TF 2.11-2.15)."""

    optimizer_class = "`tf_keras.optimizers.Optimizer`"
    noun = "a tf_keras optimizer"

    @classmethod
    def reads_config(cls, config: dict) -> bool:
        return is_tf_keras_config(config) is False

    @classmethod
    def accepts(cls, optimizer: typing.Any) -> bool:
        optimizers = _tf_keras_optimizers()
        return optimizers is not None and isinstance(
            optimizer, optimizers.Optimizer) and not isinstance(
            optimizer, optimizers.legacy.Optimizer)

    @classmethod
    def wrapper_class(cls, wrapper: type) -> type:
        return tf_keras_wrapper_class(wrapper, legacy=False)

    def build(self, var_list: list) -> None:
        self.optimizer.build(var_list)  # A no-op once built.

    def check_variables(self, var_list: list) -> None:
        compat.tf_keras_check_variables_are_known(self.optimizer, var_list)

    def aggregated(self, packed: packing.Packed,
                   var_list: list) -> tuple[packing.Packed, bool]:
        return inner_optimizer.aggregated_by(
            self.optimizer.aggregate_gradients, packed, var_list), False

    def overrides_apply_gradients(self) -> bool:
        optimizers = _tf_keras_optimizers()
        return type(self.optimizer).apply_gradients is not (
            optimizers.Optimizer.apply_gradients)

    def apply(self, grads_and_vars: list, name: str | None,
              aggregate: bool) -> typing.Any:
        return _apply_gradients(self.optimizer, grads_and_vars, name,
                                "skip_gradients_aggregation", not aggregate,
                                default=False)


class TfKerasLegacyInner(TfKerasKind):
    """A tf_keras legacy optimizer (OptimizerV2, the TF 2.1-2.10 optimizer)."""

    optimizer_class = "`tf_keras.optimizers.legacy.Optimizer`"
    noun = "a tf_keras legacy optimizer"
    runs_in_v1_graph = True  # OptimizerV2, as TF 2.4 wrapped.

    @classmethod
    def reads_config(cls, config: dict) -> bool:
        return is_tf_keras_config(config) is True

    @classmethod
    def accepts(cls, optimizer: typing.Any) -> bool:
        optimizers = _tf_keras_optimizers()
        return optimizers is not None and isinstance(
            optimizer, optimizers.legacy.Optimizer)

    @classmethod
    def wrapper_class(cls, wrapper: type) -> type:
        return tf_keras_wrapper_class(wrapper, legacy=True)

    def __init__(self, optimizer: typing.Any) -> None:
        super().__init__(optimizer)
        self._built = False
        # What a Keras file held, until the optimizer is built.
        self._loaded: tuple[list[typing.Any], str] | None = None

    def build(self, var_list: list) -> None:
        compat.legacy_create_all_weights(self.optimizer, var_list)
        self._built = True
        loaded, self._loaded = self._loaded, None
        if loaded is not None:
            with tf.init_scope():  # Once, not in every step of a graph.
                super().load_variables(*loaded)

    def load_variables(self, values: list[typing.Any], owner: str) -> None:
        # tf_keras's `load_model` builds tf_keras `Optimizer`s only, and an
        # OptimizerV2 creates its slots at its first step: their values
        # wait for it (as a tf.train.Checkpoint's slot values do). Its step
        # counter, always its first variable, is loaded now.
        if self._built:
            super().load_variables(values, owner)
        else:
            self.set_iterations(values[0])
            self._loaded = (values, owner)

    def check_variables(self, var_list: list) -> None:
        del var_list  # OptimizerV2 updates any variable.

    def aggregated(self, packed: packing.Packed,
                   var_list: list) -> tuple[packing.Packed, bool]:
        return inner_optimizer.aggregated_by(
            lambda pairs: compat.legacy_aggregate_gradients(self.optimizer,
                                                            pairs),
            packed, var_list), False

    def overrides_apply_gradients(self) -> bool:
        optimizers = _tf_keras_optimizers()
        return type(self.optimizer).apply_gradients is not (
            optimizers.legacy.Optimizer.apply_gradients)

    def apply(self, grads_and_vars: list, name: str | None,
              aggregate: bool) -> typing.Any:
        return _apply_gradients(self.optimizer, grads_and_vars, name,
                                "experimental_aggregate_gradients", aggregate,
                                default=True)

    def variables(self) -> list[typing.Any]:
        return list(self.optimizer.variables())

    def get_weights(self) -> list[typing.Any]:
        # In a tf.compat.v1 graph too (through the default session).
        return self.optimizer.get_weights()

    def hyperparameter_names(self) -> frozenset[str]:
        # Exactly what TF 2.4 forwarded; the config's values are variable
        # reads, which can be empty while the first step is traced.
        return compat.legacy_hyperparameter_names(self.optimizer)

    def slot_names(self) -> list[str]:
        return self.optimizer.get_slot_names()

    def slot_owner(self, method: str) -> typing.Any:
        del method
        return self.optimizer

    def create_or_restore_slot(self, position: typing.Any, slot_name: str,
                               variable: typing.Any,
                               **kwargs: typing.Any) -> typing.Any:
        return compat.create_or_restore_slot(
            self.optimizer, position, slot_name, variable, **kwargs
        )
