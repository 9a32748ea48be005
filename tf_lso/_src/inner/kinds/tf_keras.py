"""The two tf_keras kinds: `tf_keras.optimizers.*` and `legacy.*`.

tf_keras is optional. Without it these kinds accept nothing, and they
import it only to read one of their configs. tf_keras's own serialization
writes and reads their configs.

A loss scale optimizer around a tf_keras optimizer is an instance of
`tf_keras_class`. That class is also tf_keras's loss scale optimizer, so
tf_keras's `compile`, `fit`, saving and `isinstance` take the object the
user made.
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
    """True for a tf_keras legacy optimizer's config, False for a tf_keras
    optimizer's, None for any other.

    tf_keras writes `module: keras.optimizers.legacy` for a legacy optimizer
    and an `is_legacy_optimizer` entry for both.
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
        # A TF 2.x config where tf.keras is tf_keras: tf_keras's own
        # class reads it as a legacy optimizer's.
        return True
    return None


class TfKerasKind(inner_optimizer.InnerOptimizer):
    """What both tf_keras kinds share: tf_keras reads and writes configs."""

    @classmethod
    def deserialize(cls, config: dict,
                    custom_objects: dict | None = None) -> typing.Any:
        tf_keras = importlib.import_module("tf_keras")
        # A config without a module is in tf_keras's legacy format (HDF5,
        # SavedModel metadata, TF 2.x).
        return tf_keras.optimizers.deserialize(
            config, custom_objects=_with_keras_custom_objects(
                config, custom_objects),
            use_legacy_format="module" not in config)

    def serialize(self) -> dict:
        tf_keras = compat.tf_keras_module()
        assert tf_keras is not None  # The optimizer is a tf_keras one.
        return tf_keras.optimizers.serialize(self.optimizer)


@functools.cache
def tf_keras_class(wrapper: type, *, legacy: bool) -> type:
    """The class of a `wrapper` around a tf_keras optimizer.

    tf_keras's `compile` takes only tf_keras optimizers, so this class is
    `wrapper` and also tf_keras's `LossScaleOptimizer` and a tf_keras
    optimizer (`legacy`: an OptimizerV2), as tf_keras's own loss scale
    optimizer around the same optimizer is. Where both define an attribute,
    `wrapper`'s and Keras 3's come first. It adds only what tf_keras's own
    class does: `compute_gradients` scales the loss.

    Raises:
        RuntimeError: If tf_keras lays out its classes in an unknown way.
    """
    made_from = vars(wrapper).get("_tf_keras_made_from")
    if made_from is not None:  # `type(opt)`, asked again by from_config.
        return tf_keras_class(made_from, legacy=legacy)
    tf_keras = importlib.import_module("tf_keras")
    tf_keras_lso = tf_keras.mixed_precision.LossScaleOptimizer
    optimizers = tf_keras.optimizers.legacy if legacy else tf_keras.optimizers
    members = _LegacyMembers if legacy else _OptimizerMembers
    # Users read the class they made (`type(opt)`, repr, errors, configs).
    # tf_keras reads a class named `LossScaleOptimizer` in a config as its
    # own, so such a name is dotted (`tf_lso.LossScaleOptimizer`).
    dotted = vars(wrapper).get("_public_name",
                               f"{wrapper.__module__}.{wrapper.__qualname__}")
    name = vars(wrapper).get("_public_name", wrapper.__name__)
    if name == "LossScaleOptimizer":
        name = dotted

    class PlainCall(type(tf_keras_lso)):  # type: ignore[misc]
        # tf_keras's metaclass `__call__` needs an `inner_optimizer`
        # argument, which `LossScaleOptimizerV1(optimizer=...)` lacks.
        __call__ = type.__call__

    class KerasFirst:
        """Keras 3's attributes that tf_keras's classes hide."""

    bases = (members, wrapper, KerasFirst, tf_keras_lso, optimizers.Optimizer)
    try:
        class TfKerasClass(*bases, metaclass=PlainCall):  # type: ignore[misc]
            __module__ = wrapper.__module__
            __qualname__ = wrapper.__qualname__
            __doc__ = wrapper.__doc__
            _public_name = dotted
            _tf_keras_made_from = wrapper
    except TypeError as error:  # No consistent method order.
        raise _unknown_layout(tf_keras) from error
    TfKerasClass.__name__ = name
    _put_keras_first(TfKerasClass, KerasFirst, tf_keras)
    if legacy:
        # tf_keras's own `.keras` files hold no legacy optimizer's state.
        compat.tf_keras_files_hold(TfKerasClass)
    register(wrapper, made=TfKerasClass)
    return TfKerasClass


class _Members:
    """What a class made by `tf_keras_class` adds to its `wrapper`."""

    _tf_keras_made_from: typing.ClassVar[typing.Any]

    def __reduce__(self) -> typing.Any:
        # Keras pickles an optimizer as a classmethod of its class plus a
        # file. No module holds a made class: the classmethod is `wrapper`'s.
        wrapper = self._tf_keras_made_from
        rebuild, *rest = wrapper.__reduce__(self)
        if getattr(rebuild, "__self__", None) is type(self):
            rebuild = getattr(wrapper, rebuild.__name__)
        return (rebuild, *rest)


class _OptimizerMembers(_Members):

    def compute_gradients(self: typing.Any, loss: typing.Any,
                          var_list: typing.Any,
                          tape: typing.Any = None) -> list:
        """Pairs of (unscaled gradient, variable) for the scaled `loss`.

        tf_keras's own loss scale optimizer scales the loss here, which
        `tf_keras.optimizers.Optimizer.compute_gradients` would not.
        """
        return self._compute_gradients(loss, var_list, tape=tape)


class _LegacyMembers(_Members):

    def _create_all_weights(self: typing.Any, var_list: list) -> None:
        # tf_keras's HDF5 loading calls it on an OptimizerV2.
        self.build(var_list)


# What a class's namespace holds about the class itself: never copied.
_CLASS_BOOKKEEPING = frozenset({
    "__module__", "__qualname__", "__doc__", "__dict__", "__weakref__",
    "__annotations__", "__abstractmethods__", "_abc_impl", "__slots__",
    "__orig_bases__", "__parameters__", "__firstlineno__",
    "__static_attributes__"})


def _put_keras_first(cls: type, keras_first: type,
                     tf_keras: typing.Any) -> None:
    """Gives `keras_first` the Keras 3 attributes that tf_keras's hide.

    tf_keras's classes share TensorFlow's AutoTrackable with Keras 3's, so
    the method order puts them before the rest of Keras 3's chain (its
    `BaseOptimizer`). `keras_first` sits just before them and takes back
    what that rest defines: `update_step`, `_clip_gradients` and the like,
    and for an OptimizerV2 `__getattribute__`, which would read
    hyperparameters of its own. A test checks that every name resolves as
    on the class called.
    """
    order = cls.__mro__
    start = end = order.index(keras_first) + 1
    while order[end].__module__.startswith("tf_keras."):
        end += 1
    tf_keras_classes, rest = order[start:end], order[end:]
    if not tf_keras_classes or any(
            c.__module__.startswith("tf_keras.") for c in rest):
        raise _unknown_layout(tf_keras)
    for attribute in ({a for c in tf_keras_classes for a in vars(c)}
                      - _CLASS_BOOKKEEPING):
        owner = next((c for c in rest if attribute in vars(c)), None)
        if owner is not None:
            setattr(keras_first, attribute, vars(owner)[attribute])


def _unknown_layout(tf_keras: typing.Any) -> RuntimeError:
    return RuntimeError(
        f"tf_lso does not know how tf_keras {tf_keras.__version__} lays out "
        "its optimizer classes, so its loss scale optimizer cannot be a "
        "tf_keras optimizer (tf_lso supports tf_keras 2.16 to 2.21). Install "
        "a supported tf_keras, or use tf_keras's own "
        "`tf.keras.mixed_precision.LossScaleOptimizer`."
    )


def register(wrapper: type, made: type | None = None) -> None:
    """Registers `wrapper` with tf_keras and Keras 3 under its Keras 3 name.

    Files then find it. `made`, a class made from `wrapper`, serializes
    under the same name, and the name still leads to `wrapper`. An
    unregistered `wrapper` stays unregistered.
    """
    package, separator, name = keras.saving.get_registered_name(
        wrapper).rpartition(">")
    if not separator:
        return
    tf_keras = importlib.import_module("tf_keras")
    for framework in (tf_keras, keras):
        register_as = framework.saving.register_keras_serializable(
            package=package, name=name)
        if made is not None:
            register_as(made)
        register_as(wrapper)  # Last, so that the name leads to `wrapper`.


def _with_keras_custom_objects(config: dict,
                               custom_objects: dict | None) -> dict:
    """`custom_objects` plus Keras 3's custom object for `config`'s class.

    Keras 3 keeps custom objects in a `custom_object_scope` or its registry.
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
    """`optimizer.apply_gradients` with `name` and aggregation `flag=value`.

    The flag is passed only when it is not the `default`, because an
    override may not take it (TensorFlowTTS's `AdamWeightDecay`).
    """
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
    """A tf_keras optimizer (`tf_keras.optimizers.Optimizer`)."""

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
        return tf_keras_class(wrapper, legacy=False)

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
              aggregate: bool, skipped_steps: typing.Any) -> typing.Any:
        return _apply_gradients(self.optimizer, grads_and_vars, name,
                                "skip_gradients_aggregation", not aggregate,
                                default=False)


class TfKerasLegacyInner(TfKerasKind):
    """A tf_keras legacy optimizer (OptimizerV2)."""

    optimizer_class = "`tf_keras.optimizers.legacy.Optimizer`"
    noun = "a tf_keras legacy optimizer"
    runs_in_v1_graph = True

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
        return tf_keras_class(wrapper, legacy=True)

    def __init__(self, optimizer: typing.Any) -> None:
        super().__init__(optimizer)
        self._built = False
        # The values a Keras file held, until the optimizer is built.
        self._loaded: tuple[list[typing.Any], str] | None = None

    def build(self, var_list: list) -> None:
        compat.legacy_create_all_weights(self.optimizer, var_list)
        self._built = True
        loaded, self._loaded = self._loaded, None
        if loaded is not None:
            with tf.init_scope():  # Once, not in every step of a graph.
                super().load_variables(*loaded)

    def load_variables(self, values: list[typing.Any], owner: str) -> None:
        # tf_keras's `load_model` builds no OptimizerV2, which makes its
        # slots at its first step. The slot values wait for that step, as a
        # checkpoint's do. The step counter (the first variable) loads now.
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
              aggregate: bool, skipped_steps: typing.Any) -> typing.Any:
        return _apply_gradients(self.optimizer, grads_and_vars, name,
                                "experimental_aggregate_gradients", aggregate,
                                default=True)

    def variables(self) -> list[typing.Any]:
        return list(self.optimizer.variables())

    def get_weights(self) -> list[typing.Any]:
        # In a tf.compat.v1 graph too (through the default session).
        return self.optimizer.get_weights()

    def hyperparameter_names(self) -> frozenset[str]:
        # The `_hyper` keys. The config's values are variable reads, which
        # can be empty while the first step is traced.
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
