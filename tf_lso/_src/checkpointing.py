"""How a tf_lso optimizer appears in `tf.train.Checkpoint`s.

tf_lso writes TF 2.3/2.4's layout: the optimizer node holds the inner
optimizer's children and slot variables directly (as if it were the inner
optimizer), plus `loss_scale/current_loss_scale` and `loss_scale/good_steps`,
plus an empty `base_optimizer` child. So a tf_lso checkpoint restores into the
bare inner optimizer, and the bare optimizer's checkpoint into tf_lso.

It restores, besides its own checkpoints:

* TF 2.3/2.4 (tf_keras) checkpoints, also into a Keras 3 inner optimizer:
  legacy names (`iter`, `learning_rate`, slots such as `m`/`v`) are mapped to
  the Keras 3 variables;
* TF 2.2 checkpoints (`base_optimizer/...` plus `loss_scale/...`);
* checkpoints of Keras 3's `LossScaleOptimizer` (`inner_optimizer/...`,
  `dynamic_scale`, `step_counter`).

The methods below implement TensorFlow's `Trackable` protocol; every call
into another object's private tracking API goes through `compat`.
"""

import warnings

import keras
import tensorflow as tf

from tf_lso._src import compat

LOSS_SCALE = "loss_scale"
BASE_OPTIMIZER = "base_optimizer"
_KERAS_INNER = "inner_optimizer"
# Keras 3 LossScaleOptimizer variable -> tf_lso loss scale variable.
_KERAS_STATE = {
    "dynamic_scale": "current_loss_scale",
    "step_counter": "good_steps",
}
# Keras 3 LossScaleOptimizer's own (unused) variables, whose names clash
# with the inner optimizer's.
_KERAS_WRAPPER_ONLY = ("_iterations", "_learning_rate")
# TF 2.x (OptimizerV2) slot names -> Keras 3 optimizer variable suffixes.
_KERAS_SLOT_NAMES = {
    "m": ("momentum", "m"),  # Adam, Nadam / Adamax
    "v": ("velocity", "u"),  # Adam, Nadam / Adamax
    "vhat": ("velocity_hat",),
    "rms": ("velocity",),
    "mg": ("average_gradient",),
    "accum_grad": ("accumulated_grad",),
    "accum_var": ("accumulated_delta_var",),
}


class OptimizerCheckpointing:
    """Mixin giving a loss scale optimizer the TF 2.3+ checkpoint layout.

    Expects `_optimizer` (the inner optimizer), `_inner` (its adapter) and
    `_loss_scale` on the instance, and calls `_init_checkpointing()` from the
    constructor.
    """

    def _init_checkpointing(self):
        self._pending_slot_restores = []
        self._base_optimizer_view = _InnerOptimizerView(self)
        self._keras_inner_view = _InnerOptimizerView(self, keras_lso=True)
        self._checkpointing_ready = True

    def _delegating(self):
        # Until the constructor is done, Keras tracks the wrapper's own
        # attributes the usual way.
        return self.__dict__.get("_checkpointing_ready", False)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        if not self._delegating():
            return super()._trackable_children(save_type, **kwargs)
        children = dict(
            compat.trackable_children(self._optimizer, save_type, **kwargs)
        )
        if self._loss_scale.variables:
            children[LOSS_SCALE] = self._loss_scale
        children[BASE_OPTIMIZER] = self._base_optimizer_view
        return children

    def _lookup_dependency(self, name, cached_dependencies=None):
        if not self._delegating():
            return super()._lookup_dependency(name, cached_dependencies)
        if name == LOSS_SCALE:
            return self._loss_scale if self._loss_scale.variables else None
        if name == BASE_OPTIMIZER:
            return self._base_optimizer_view
        if name == _KERAS_INNER:
            return self._keras_inner_view
        if name in _KERAS_STATE:
            return getattr(self._loss_scale, _KERAS_STATE[name], None)
        return self._inner_dependency(name)

    @property
    def _deferred_dependencies(self):
        # Children that do not exist yet are children of the inner optimizer.
        if not self._delegating():
            return super()._deferred_dependencies
        return compat.deferred_dependencies(self._optimizer)

    def _inner_dependency(self, name):
        child = compat.lookup_dependency(self._optimizer, name)
        keras_inner = isinstance(self._optimizer, keras.optimizers.Optimizer)
        if child is None and keras_inner:
            child = _keras_legacy_dependency(self._optimizer, name)
        return child

    def _create_or_restore_slot_variable(
        self, slot_variable_position, slot_name, variable, **kwargs
    ):
        if self._inner.has_slots:
            return compat.create_or_restore_slot(
                self._optimizer, slot_variable_position, slot_name, variable,
                **kwargs,
            )
        if not isinstance(self._optimizer, keras.optimizers.Optimizer):
            return None
        if not self._optimizer.built:
            # Restored once the inner optimizer is built (`_restore_slots`).
            self._pending_slot_restores.append(
                (slot_variable_position, slot_name, variable)
            )
            return None
        return _keras_slot(self._optimizer, variable, slot_name)

    # -- `.keras` files ------------------------------------------------------
    # Keras saves the inner optimizer itself (as `inner_optimizer`); the
    # wrapper's own entry holds the loss scale state.

    def save_own_variables(self, store):
        """Saves the loss scale state (`.keras` files).

        Args:
            store: The dict-like store Keras passes.
        """
        for i, variable in enumerate(self._loss_scale.variables):
            store[str(i)] = variable.numpy()

    def load_own_variables(self, store):
        """Loads the loss scale state saved by `save_own_variables`.

        Args:
            store: The dict-like store Keras passes.
        """
        variables = self._loss_scale.variables
        if len(store.keys()) != len(variables):
            warnings.warn(
                f"Skipping loading the loss scale of optimizer "
                f"'{self.name}': the file holds {len(store.keys())} values "
                f"but the loss scale has {len(variables)} variables. The loss "
                "scale starts from its initial value.",
                stacklevel=2,
            )
            return
        for i, variable in enumerate(variables):
            variable.assign(store[str(i)])

    def _restore_slots(self):
        """Restores TF 2.x slots that arrived before the inner was built."""
        pending, self._pending_slot_restores = self._pending_slot_restores, []
        for position, slot_name, variable in pending:
            slot = _keras_slot(self._optimizer, variable, slot_name)
            if slot is not None:
                compat.restore_position(position, slot)


class _InnerOptimizerView(compat.Trackable):
    """Stands for the inner optimizer under a name older layouts used.

    Under `base_optimizer` (TF 2.2) and `inner_optimizer` (Keras 3's
    LossScaleOptimizer), it resolves names like the optimizer node itself.
    It has no children of its own, so it adds nothing to saved checkpoints.
    """

    def __init__(self, owner, keras_lso=False):
        self._owner = owner
        self._keras_lso = keras_lso

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        return {}

    def _lookup_dependency(self, name, cached_dependencies=None):
        child = self._owner._inner_dependency(name)
        if self._keras_lso and name in _KERAS_WRAPPER_ONLY and child is not None:
            # The Keras 3 wrapper's own `_iterations`/`_learning_rate` (unused,
            # 0) also resolve to these variables. Restores run breadth-first,
            # so a second writer for this deeper path makes its value win.
            return _Overwrite(child)
        return child

    @property
    def _deferred_dependencies(self):
        return self._owner._deferred_dependencies

    def _create_or_restore_slot_variable(
        self, slot_variable_position, slot_name, variable, **kwargs
    ):
        return self._owner._create_or_restore_slot_variable(
            slot_variable_position, slot_name, variable, **kwargs
        )


class _Overwrite(compat.Trackable):
    """Restores into `variable` although another path restored it already."""

    def __init__(self, variable):
        self._variable = variable

    def _serialize_to_tensors(self):
        return {compat.VARIABLE_VALUE: tf.convert_to_tensor(self._variable)}

    def _restore_from_tensors(self, restored_tensors):
        return self._variable.assign(restored_tensors[compat.VARIABLE_VALUE])


def _keras_legacy_dependency(optimizer, name):
    """Maps TF 2.x (OptimizerV2) child names onto a Keras 3 optimizer."""
    if name == "iter":
        return optimizer.iterations
    if name == "learning_rate":
        learning_rate = optimizer.learning_rate
        if compat.is_variable(learning_rate):
            return learning_rate
    return None


def _slot_prefix(variable):
    # As `keras.optimizers.Optimizer.add_variable_from_reference` names slots.
    if hasattr(variable, "path"):
        return variable.path.replace("/", "_")
    return str(variable.name).replace("/", "_").replace(":", "_")


def _keras_slot(optimizer, variable, slot_name):
    """The Keras 3 variable holding TF 2.x slot `slot_name` of `variable`."""
    prefix = _slot_prefix(variable)
    for suffix in _KERAS_SLOT_NAMES.get(slot_name, (slot_name,)):
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
