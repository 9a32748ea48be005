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
which `tf.saved_model.save` must be able to track. Checkpoints leave them out
because TF 2.4's layout has no room for them: `assert_consumed()` fails on
any node or value one side has and the other lacks, so an extra child would
stop tf_lso's checkpoints from restoring into TF 2.4's classes, and theirs
into tf_lso. Users who want `skipped_steps` in a checkpoint add it as an entry
of its own (`tf.train.Checkpoint(..., skipped_steps=opt.skipped_steps)`).
Keras's own files (`.keras`, `.weights.h5`) have room: see
`LayoutCheckpointing.save_own_variables`. One more child exists only with a
Keras 3 inner optimizer's gradient accumulation, which TF 2.4 did not have:
`window_overflowed`, without which a window restored mid-way after a
non-finite call would be applied in part instead of dropped.

The methods below implement TensorFlow's `Trackable` protocol; every call
into another object's private tracking API goes through `compat`.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TYPE_CHECKING
from typing import Any
from typing import cast

import numpy as np
import tensorflow as tf

from tf_lso._src import compat

if TYPE_CHECKING:
    from tf_lso._src.inner import inner_optimizer
    from tf_lso._src.optimizer import apply_step
    from tf_lso._src.scaling import loss_scale as loss_scale_lib

LOSS_SCALE = "loss_scale"
BASE_OPTIMIZER = "base_optimizer"
APPLY_STEP = "apply_step"
WINDOW_OVERFLOWED = "window_overflowed"
_KERAS_INNER = "inner_optimizer"
# In Keras files: the inner optimizer's class name, and the prefix of its
# variables' entries when Keras does not save it itself.
_INNER_KIND = "inner_optimizer_class"
_INNER_VARIABLE = "inner_optimizer_variable_"
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

    def __init__(self, inner: inner_optimizer.InnerOptimizer,
                 loss_scale: loss_scale_lib.LossScale,
                 step: apply_step.ApplyStep) -> None:
        self._inner = inner
        self.loss_scale = loss_scale
        self._step = step
        self._base_optimizer_view = _InnerOptimizerView(self)
        self._keras_inner_view = _InnerOptimizerView(self, keras_lso=True)

    def children(self, save_type: str = "checkpoint",
                 **kwargs: Any) -> dict[str, Any]:
        """`_trackable_children`: the inner's children plus the loss scale.

        Nothing else in checkpoints, to keep TF 2.4's layout (see the module
        docstring); SavedModels add `apply_step`.
        """
        children = dict(self._inner.checkpoint_children(save_type, **kwargs))
        if self.loss_scale.variables:
            children[LOSS_SCALE] = self.loss_scale
        children[BASE_OPTIMIZER] = self._base_optimizer_view
        if self._step.window_overflowed is not None:
            # Gradient accumulation (Keras 3 only: no TF 2.4 layout to keep).
            children[WINDOW_OVERFLOWED] = self._step.window_overflowed
        if compat.is_saved_model(save_type):
            children[APPLY_STEP] = self._step
        return children

    def file_state(self) -> list[tf.Variable]:
        """What Keras's files hold of the optimizer itself, in order: the
        loss scale's variables, then `skipped_steps`, then with gradient
        accumulation `window_overflowed`."""
        state = list(self.loss_scale.variables) + [self._step.skipped_steps]
        if self._step.window_overflowed is not None:
            state.append(self._step.window_overflowed)
        return state

    def inner_file_state(self) -> list[tf.Variable]:
        """What Keras's files hold of the inner optimizer in the wrapper's
        entry: its variables, unless Keras saves it itself."""
        if self._inner.saved_by_keras:
            return []
        return list(self._inner.variables())

    def load_inner_variables(self, values: list[Any], owner: str) -> None:
        """Loads what `inner_file_state` saved (`InnerOptimizer.
        load_variables`)."""
        self._inner.load_variables(values, owner)

    def inner_variable_count(self) -> int:
        """How many variables the inner optimizer has."""
        return len(self._inner.variables())

    def inner_kind(self) -> str:
        """The inner optimizer's class name."""
        return type(self._inner.optimizer).__name__

    def lookup(self, name: str) -> Any:
        """`_lookup_dependency`: also the names older layouts used."""
        if name == LOSS_SCALE:
            return self.loss_scale if self.loss_scale.variables else None
        if name == BASE_OPTIMIZER:
            return self._base_optimizer_view
        if name == APPLY_STEP:
            return self._step
        if name == WINDOW_OVERFLOWED:
            return self._step.window_overflowed
        if name == _KERAS_INNER:
            return self._keras_inner_view
        if name in _KERAS_STATE:
            return getattr(self.loss_scale, _KERAS_STATE[name], None)
        return self.inner_child(name)

    def inner_child(self, name: str) -> Any:
        """The inner optimizer's child `name` (TF 2.x names too), or None."""
        return self._inner.checkpoint_child(name)

    def deferred(self) -> dict[str, list[Any]]:
        """`_deferred_dependencies`: children not created yet are the inner's."""
        return self._inner.deferred_dependencies()

    def slot(self, position: Any, slot_name: str, variable: tf.Variable,
             **kwargs: Any) -> Any:
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

    The `super()` calls reach TensorFlow's `Trackable`, a base that comes
    after this one in the optimizer's bases (mypy does not see it).
    """

    name: str  # The optimizer's name: Keras's optimizer base defines it.

    def _checkpoint_layout(self) -> Layout | None:
        return self.__dict__.get("_checkpoint")

    def _built_layout(self) -> Layout:
        """The `Layout`: Keras and TensorFlow call the methods that use this
        only on a constructed optimizer, which has one."""
        return cast(Layout, self._checkpoint_layout())

    def _trackable_children(self, save_type: str = "checkpoint",
                            **kwargs: Any) -> dict[str, Any]:
        layout = self._checkpoint_layout()
        if layout is None:
            return super()._trackable_children(  # type: ignore[misc]
                save_type, **kwargs)
        return layout.children(save_type, **kwargs)

    def _lookup_dependency(self, name: str,
                           cached_dependencies: Any = None) -> Any:
        layout = self._checkpoint_layout()
        if layout is None:
            return super()._lookup_dependency(  # type: ignore[misc]
                name, cached_dependencies)
        return layout.lookup(name)

    @property
    def _deferred_dependencies(self) -> dict[str, list[Any]]:
        layout = self._checkpoint_layout()
        if layout is None:
            return super()._deferred_dependencies  # type: ignore[misc]
        return layout.deferred()

    def _create_or_restore_slot_variable(
        self, slot_variable_position: Any, slot_name: str,
        variable: tf.Variable, **kwargs: Any
    ) -> Any:
        return self._built_layout().slot(
            slot_variable_position, slot_name, variable, **kwargs
        )

    # `.keras` and `.weights.h5` files: Keras saves a Keras 3 inner
    # optimizer itself (as `inner_optimizer`, its variables by position);
    # the wrapper's own entry holds the loss scale state, then
    # `skipped_steps`, then the inner optimizer's class name, and the
    # variables of an inner optimizer that Keras does not save
    # (`InnerOptimizer.saved_by_keras`). (tf.train.Checkpoints hold neither
    # `skipped_steps` nor the class name: see `Layout.children`.)

    def save_own_variables(self, store: MutableMapping[str, Any]) -> None:
        """Saves the loss scale state, `skipped_steps` and the inner
        optimizer's class name (Keras files).

        Args:
            store: The dict-like store Keras passes.
        """
        layout = self._built_layout()
        for i, variable in enumerate(layout.file_state()):
            store[str(i)] = variable.numpy()
        for i, variable in enumerate(layout.inner_file_state()):
            store[f"{_INNER_VARIABLE}{i}"] = variable.numpy()
        # As bytes: every Keras weights store holds numeric arrays.
        store[_INNER_KIND] = np.frombuffer(layout.inner_kind().encode(),
                                           np.uint8)

    def load_own_variables(self, store: MutableMapping[str, Any]) -> None:
        """Loads what `save_own_variables` saved, or Keras 3's own class.

        Files written before `skipped_steps` (or `window_overflowed`, or
        the variables of an inner optimizer that Keras does not save) was
        saved hold less; what they hold is loaded, the rest stays as it is.
        The entry of Keras 3's `LossScaleOptimizer` (its layout:
        `compat.keras_loss_scale_optimizer_file_state`) gives its dynamic
        scale and counter.

        Args:
            store: The dict-like store Keras passes.

        Raises:
            ValueError: If the file was written around another kind of inner
                optimizer (Keras loads the inner optimizer's variables by
                position, so they would land in the wrong places), or if a
                value is out of range (a loss scale that is not positive and
                finite in float32, a negative count): the file is damaged;
                or if it holds another optimizer configuration's state (a
                fixed scale's or a dynamic one's, with or without gradient
                accumulation). Nothing of the loss scale state is loaded
                then.
        """
        layout = self._built_layout()
        keys = [key for key in store.keys()
                if not key.startswith(_INNER_VARIABLE)]
        if _INNER_KIND in keys:
            keys.remove(_INNER_KIND)
            saved = bytes(np.asarray(store[_INNER_KIND], np.uint8)).decode()
            if saved != layout.inner_kind():
                raise ValueError(
                    f"Cannot load the state of optimizer '{self.name}': the "
                    f"file was written by a loss scale optimizer around "
                    f"{saved}, and this one is around "
                    f"{layout.inner_kind()}. Keras loads the inner "
                    f"optimizer's variables by position, so they would land "
                    f"in the wrong places. Load the file into a new model "
                    f"compiled with a LossScaleOptimizer around {saved}."
                )
        else:
            keras_state = compat.keras_loss_scale_optimizer_file_state(
                store, layout.inner_variable_count())
            if keras_state is not None:
                self._load_keras_3_state(layout, keras_state)
                return
        self._load_inner_variables(layout, store)
        variables = layout.file_state()
        if len(layout.loss_scale.variables) <= len(keys) < len(variables):
            # Older files: the loss scale state only, or no
            # `window_overflowed` yet.
            variables = variables[:len(keys)]
        if len(keys) != len(variables):
            names = ", ".join(v.name.split(":")[0] for v in variables)
            raise ValueError(
                f"Cannot load the loss scale state of optimizer "
                f"'{self.name}': the file holds {len(keys)} values where "
                f"this optimizer keeps {len(variables)} ({names}), so it was "
                f"written by an optimizer of another configuration (a fixed "
                f"or dynamic loss scale, gradient accumulation). Nothing of "
                f"the loss scale state was loaded. Load the file into a "
                f"model compiled as the one that saved it."
            )
        values = [_checked(self.name, variable, store[str(i)])
                  for i, variable in enumerate(variables)]
        for variable, value in zip(variables, values):
            variable.assign(value)

    def _load_keras_3_state(self, layout: Layout,
                            state: tuple[Any, Any]) -> None:
        """Loads the entry of Keras 3's own LossScaleOptimizer: its dynamic
        scale and counter (Keras loads the inner optimizer itself).
        `skipped_steps`, which Keras 3 does not keep, stays as it is."""
        variables: list[Any] = [getattr(layout.loss_scale, name, None)
                                for name in _KERAS_STATE.values()]
        if any(variable is None for variable in variables):
            raise ValueError(
                f"Cannot load the loss scale state of optimizer "
                f"'{self.name}': the file was written by Keras 3's "
                f"LossScaleOptimizer, whose loss scale is dynamic, and this "
                f"optimizer's loss scale, {layout.loss_scale!r}, has no "
                f"dynamic scale and counter. Load the file into a "
                f"LossScaleOptimizer with dynamic=True (the default)."
            )
        values = [_checked(self.name, variable, value)
                  for variable, value in zip(variables, state)]
        for variable, value in zip(variables, values):
            variable.assign(value)

    def _load_inner_variables(self, layout: Layout,
                              store: MutableMapping[str, Any]) -> None:
        """Loads the variables of an inner optimizer that Keras does not
        save itself (`Layout.inner_file_state`), if the file has them."""
        count = sum(key.startswith(_INNER_VARIABLE) for key in store.keys())
        if not count:
            return  # Older files, or Keras saves the inner optimizer.
        # Copies: the file may be closed before a kind assigns them.
        layout.load_inner_variables(
            [np.array(store[f"{_INNER_VARIABLE}{i}"]) for i in range(count)],
            self.name)


def _checked(optimizer_name: str, variable: tf.Variable,
             value: Any) -> np.ndarray:
    """`value` in `variable`'s dtype, if in range for it.

    Every float in the saved state is a loss scale, every integer a count.
    """
    saved = np.asarray(value)
    with np.errstate(over="ignore", invalid="ignore"):
        value = saved.astype(variable.dtype.as_numpy_dtype)
    if variable.dtype.is_floating:
        ok, need = np.isfinite(value) and value > 0, "positive and finite"
    else:
        ok, need = value >= 0, "0 or more"
    if not ok:
        name = variable.name.split(":")[0]
        shown = str(value)
        if saved.dtype != value.dtype:
            shown = f"{saved} ({value} as {variable.dtype.name})"
        raise ValueError(
            f"Cannot load the loss scale state of optimizer "
            f"'{optimizer_name}': the file says {name} is {shown}, which "
            f"must be {need}. The file is damaged: load an earlier one."
        )
    return value


class _InnerOptimizerView(compat.Trackable):
    """Stands for the inner optimizer under a name older layouts used.

    Under `base_optimizer` (TF 2.2) and `inner_optimizer` (Keras 3's
    LossScaleOptimizer), it resolves names like the optimizer node itself.
    It has no children of its own, so it adds nothing to saved checkpoints.
    """

    def __init__(self, layout: Layout, keras_lso: bool = False) -> None:
        self._layout = layout
        self._keras_lso = keras_lso

    def _trackable_children(self, save_type: str = "checkpoint",
                            **kwargs: Any) -> dict[str, Any]:
        return {}

    def _lookup_dependency(self, name: str,
                           cached_dependencies: Any = None) -> Any:
        child = self._layout.inner_child(name)
        if self._keras_lso and name in _KERAS_WRAPPER_ONLY and child is not None:
            # The Keras 3 wrapper's own `_iterations`/`_learning_rate` (unused,
            # 0) also resolve to these variables. Restores run breadth-first,
            # so a second writer for this deeper path makes its value win.
            return _Overwrite(child)
        return child

    @property
    def _deferred_dependencies(self) -> dict[str, list[Any]]:
        return self._layout.deferred()

    def _create_or_restore_slot_variable(
        self, slot_variable_position: Any, slot_name: str,
        variable: tf.Variable, **kwargs: Any
    ) -> Any:
        return self._layout.slot(slot_variable_position, slot_name, variable,
                                 **kwargs)


class _Overwrite(compat.Trackable):
    """Restores into `variable` although another path restored it already."""

    def __init__(self, variable: tf.Variable) -> None:
        self._variable = variable

    def _serialize_to_tensors(self) -> dict[str, tf.Tensor]:
        return {compat.VARIABLE_VALUE: tf.convert_to_tensor(self._variable)}

    def _restore_from_tensors(
            self, restored_tensors: dict[str, tf.Tensor]) -> Any:
        return self._variable.assign(restored_tensors[compat.VARIABLE_VALUE])
