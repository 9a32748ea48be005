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

SavedModels also hold `apply_step`: the variables that checkpoints leave out
(`skipped_steps`, the overflow record) but a traced training step captures,
which `tf.saved_model.save` must be able to track.

The methods below implement TensorFlow's `Trackable` protocol; every call
into another object's private tracking API goes through `compat`.
"""

import warnings

import tensorflow as tf

from tf_lso._src import compat

LOSS_SCALE = "loss_scale"
BASE_OPTIMIZER = "base_optimizer"
APPLY_STEP = "apply_step"
_KERAS_INNER = "inner_optimizer"
# Keras 3 LossScaleOptimizer variable -> tf_lso loss scale variable.
_KERAS_STATE = {
    "dynamic_scale": "current_loss_scale",
    "step_counter": "good_steps",
}
# Keras 3 LossScaleOptimizer's own (unused) variables, whose names clash
# with the inner optimizer's.
_KERAS_WRAPPER_ONLY = ("_iterations", "_learning_rate")


class Layout:
    """The checkpoint node of a loss scale optimizer, in TF 2.3+'s layout.

    `LayoutCheckpointing`'s `Trackable` methods forward here. Everything
    that depends on the inner optimizer's kind is the `InnerOptimizer`'s.

    Args:
        inner: The `inner_optimizer.InnerOptimizer`.
        loss_scale: The `LossScale`; saved under `loss_scale` if it has
            variables.
        step: The `apply_step.ApplyStep`; saved in SavedModels only.
    """

    def __init__(self, inner, loss_scale, step):
        self._inner = inner
        self.loss_scale = loss_scale
        self._step = step
        self._base_optimizer_view = _InnerOptimizerView(self)
        self._keras_inner_view = _InnerOptimizerView(self, keras_lso=True)

    def children(self, save_type="checkpoint", **kwargs):
        """`_trackable_children`: the inner's children plus the loss scale."""
        children = dict(self._inner.checkpoint_children(save_type, **kwargs))
        if self.loss_scale.variables:
            children[LOSS_SCALE] = self.loss_scale
        children[BASE_OPTIMIZER] = self._base_optimizer_view
        if compat.is_saved_model(save_type):
            children[APPLY_STEP] = self._step
        return children

    def lookup(self, name):
        """`_lookup_dependency`: also the names older layouts used."""
        if name == LOSS_SCALE:
            return self.loss_scale if self.loss_scale.variables else None
        if name == BASE_OPTIMIZER:
            return self._base_optimizer_view
        if name == APPLY_STEP:
            return self._step
        if name == _KERAS_INNER:
            return self._keras_inner_view
        if name in _KERAS_STATE:
            return getattr(self.loss_scale, _KERAS_STATE[name], None)
        return self.inner_child(name)

    def inner_child(self, name):
        """The inner optimizer's child `name` (TF 2.x names too), or None."""
        return self._inner.checkpoint_child(name)

    def deferred(self):
        """`_deferred_dependencies`: children not created yet are the inner's."""
        return self._inner.deferred_dependencies()

    def slot(self, position, slot_name, variable, **kwargs):
        """`_create_or_restore_slot_variable`: slots are the inner's."""
        return self._inner.create_or_restore_slot(position, slot_name,
                                                  variable, **kwargs)


class LayoutCheckpointing:
    """Base of `LossScaleOptimizer`: its checkpoint node is a `Layout`.

    TensorFlow's checkpointing calls these private `Trackable` methods on
    the object itself, so they must be overridden here (the one accepted
    exception to keeping private APIs in compat.py). Subclasses set one
    attribute, `_checkpoint` (a `Layout`), at the end of their constructor;
    until then Keras tracks attributes the usual way.
    """

    def _checkpoint_layout(self):
        return self.__dict__.get("_checkpoint")

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        if self._checkpoint_layout() is None:
            return super()._trackable_children(save_type, **kwargs)
        return self._checkpoint_layout().children(save_type, **kwargs)

    def _lookup_dependency(self, name, cached_dependencies=None):
        if self._checkpoint_layout() is None:
            return super()._lookup_dependency(name, cached_dependencies)
        return self._checkpoint_layout().lookup(name)

    @property
    def _deferred_dependencies(self):
        if self._checkpoint_layout() is None:
            return super()._deferred_dependencies
        return self._checkpoint_layout().deferred()

    def _create_or_restore_slot_variable(
        self, slot_variable_position, slot_name, variable, **kwargs
    ):
        return self._checkpoint_layout().slot(
            slot_variable_position, slot_name, variable, **kwargs
        )

    # `.keras` files: Keras saves the inner optimizer itself (as
    # `inner_optimizer`); the wrapper's own entry holds the loss scale state.

    def save_own_variables(self, store):
        """Saves the loss scale state (`.keras` files).

        Args:
            store: The dict-like store Keras passes.
        """
        variables = self._checkpoint_layout().loss_scale.variables
        for i, variable in enumerate(variables):
            store[str(i)] = variable.numpy()

    def load_own_variables(self, store):
        """Loads the loss scale state saved by `save_own_variables`.

        Args:
            store: The dict-like store Keras passes.
        """
        variables = self._checkpoint_layout().loss_scale.variables
        if len(store.keys()) != len(variables):
            warnings.warn(
                f"Skipping loading the loss scale of optimizer "
                f"'{self.name}': the file holds {len(store.keys())} values "
                f"but the loss scale has {len(variables)} variables. The "
                "loss scale starts from its initial value.",
                stacklevel=2,
            )
            return
        for i, variable in enumerate(variables):
            variable.assign(store[str(i)])


class _InnerOptimizerView(compat.Trackable):
    """Stands for the inner optimizer under a name older layouts used.

    Under `base_optimizer` (TF 2.2) and `inner_optimizer` (Keras 3's
    LossScaleOptimizer), it resolves names like the optimizer node itself.
    It has no children of its own, so it adds nothing to saved checkpoints.
    """

    def __init__(self, layout, keras_lso=False):
        self._layout = layout
        self._keras_lso = keras_lso

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        return {}

    def _lookup_dependency(self, name, cached_dependencies=None):
        child = self._layout.inner_child(name)
        if self._keras_lso and name in _KERAS_WRAPPER_ONLY and child is not None:
            # The Keras 3 wrapper's own `_iterations`/`_learning_rate` (unused,
            # 0) also resolve to these variables. Restores run breadth-first,
            # so a second writer for this deeper path makes its value win.
            return _Overwrite(child)
        return child

    @property
    def _deferred_dependencies(self):
        return self._layout.deferred()

    def _create_or_restore_slot_variable(
        self, slot_variable_position, slot_name, variable, **kwargs
    ):
        return self._layout.slot(slot_variable_position, slot_name, variable,
                                 **kwargs)


class _Overwrite(compat.Trackable):
    """Restores into `variable` although another path restored it already."""

    def __init__(self, variable):
        self._variable = variable

    def _serialize_to_tensors(self):
        return {compat.VARIABLE_VALUE: tf.convert_to_tensor(self._variable)}

    def _restore_from_tensors(self, restored_tensors):
        return self._variable.assign(restored_tensors[compat.VARIABLE_VALUE])
