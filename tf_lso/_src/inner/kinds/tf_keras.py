"""The two tf_keras kinds: `tf_keras.optimizers.*` and its `legacy.*`.

tf_keras is optional: these kinds accept nothing when it is not installed
(`compat.tf_keras_module`), and import it only to read a config of theirs.
Both write and read their configs with tf_keras's own serialization.
"""

from __future__ import annotations

import importlib
import typing

import keras

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
    return False if has_flag else None


class TfKerasKind(inner_optimizer.InnerOptimizer):
    """What both tf_keras kinds share: their configs, read and written by
    tf_keras (either kind reads either one's)."""

    @classmethod
    def deserialize(cls, config: dict,
                    custom_objects: dict | None = None) -> typing.Any:
        tf_keras = importlib.import_module("tf_keras")
        return tf_keras.optimizers.deserialize(
            config, custom_objects=_with_keras_custom_objects(
                config, custom_objects))

    def serialize(self) -> dict:
        tf_keras = compat.tf_keras_module()
        assert tf_keras is not None  # The optimizer is a tf_keras one.
        return tf_keras.optimizers.serialize(self.optimizer)


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


def _tf_keras_optimizers() -> typing.Any:
    tf_keras = compat.tf_keras_module()
    return None if tf_keras is None else tf_keras.optimizers


@inner_optimizer.register
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

    def build(self, var_list: list) -> None:
        self.optimizer.build(var_list)  # A no-op once built.

    def check_variables(self, var_list: list) -> None:
        compat.tf_keras_check_variables_are_known(self.optimizer, var_list)

    def aggregated(self, packed: packing.Packed,
                   var_list: list) -> tuple[packing.Packed, bool]:
        return inner_optimizer.aggregated_by(
            self.optimizer.aggregate_gradients, packed, var_list), False

    def apply(self, grads_and_vars: list, name: str | None,
              aggregate: bool) -> typing.Any:
        # Only a name that was given: tf_keras's own wrapper passes none,
        # and subclasses' apply_gradients overrides need not take one.
        kwargs = {} if name is None else {"name": name}
        return self.optimizer.apply_gradients(
            grads_and_vars, skip_gradients_aggregation=not aggregate, **kwargs
        )


@inner_optimizer.register
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

    def build(self, var_list: list) -> None:
        compat.legacy_create_all_weights(self.optimizer, var_list)

    def check_variables(self, var_list: list) -> None:
        del var_list  # OptimizerV2 updates any variable.

    def aggregated(self, packed: packing.Packed,
                   var_list: list) -> tuple[packing.Packed, bool]:
        return inner_optimizer.aggregated_by(
            lambda pairs: compat.legacy_aggregate_gradients(self.optimizer,
                                                            pairs),
            packed, var_list), False

    def apply(self, grads_and_vars: list, name: str | None,
              aggregate: bool) -> typing.Any:
        return self.optimizer.apply_gradients(
            grads_and_vars, name=name,
            experimental_aggregate_gradients=aggregate,
        )

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
