"""How a tf_lso optimizer appears in `tf.train.Checkpoint`s and Keras files.

tf_lso writes TF 2.3/2.4's layout: the optimizer node holds the inner
optimizer's children and slots directly, plus `loss_scale/...` and an empty
`base_optimizer`. So its checkpoints restore into the bare inner optimizer
and into TF 2.4's classes, and theirs into tf_lso. It also restores TF 2.2's
and Keras 3's `LossScaleOptimizer`'s layouts (table in docs/keras.md).

`assert_consumed()` fails on any node one side lacks, so checkpoints leave
out what TF 2.4 did not have: `skipped_steps` and the overflow record. Users
who want `skipped_steps` add it as an entry of its own. SavedModels add
`apply_step`, because a traced step captures those variables. Keras files
hold `skipped_steps` (`LayoutCheckpointing.save_own_variables`), not the
overflow record. Gradient
accumulation, which TF 2.4 lacked, adds `window_overflowed`: without it, a
window restored mid-way after a non-finite call would be applied in part.

Every call into another object's private tracking API goes through `compat`.
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
    `LayoutCheckpointing`'s `Trackable` methods forward here."""

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
        """`_trackable_children`, as the module docstring says."""
        children = dict(self._inner.checkpoint_children(save_type, **kwargs))
        if self.loss_scale.variables:
            children[LOSS_SCALE] = self.loss_scale
        children[BASE_OPTIMIZER] = self._base_optimizer_view
        if self._step.window_overflowed is not None:
            children[WINDOW_OVERFLOWED] = self._step.window_overflowed
        if compat.is_saved_model(save_type):
            children[APPLY_STEP] = self._step
        return children

    def file_state(self) -> list[tf.Variable]:
        """The optimizer's own variables in Keras files, in order."""
        state = list(self.loss_scale.variables) + [self._step.skipped_steps]
        if self._step.window_overflowed is not None:
            state.append(self._step.window_overflowed)
        return state

    def inner_file_state(self) -> list[tf.Variable]:
        """The inner optimizer's variables, unless Keras saves it itself."""
        if self._inner.saved_by_keras:
            return []
        return list(self._inner.variables())

    def load_inner_variables(self, values: list[Any], owner: str) -> None:
        """Loads what `inner_file_state` saved."""
        self._inner.load_variables(values, owner)

    def inner_variable_count(self) -> int:
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
    """Base of `LossScaleOptimizer`, whose checkpoint node is a `Layout`.

    TensorFlow calls these private `Trackable` methods on the object itself,
    so they are overridden here, outside compat.py. Until a subclass sets
    `_checkpoint` (last in its constructor), they defer to `super()`:
    TensorFlow's `Trackable`, a later base that mypy does not see.
    """

    name: str  # The optimizer's name: Keras's optimizer base defines it.

    def _checkpoint_layout(self) -> Layout | None:
        return self.__dict__.get("_checkpoint")

    def _built_layout(self) -> Layout:
        """The `Layout`; only a constructed optimizer's methods use it."""
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

    # `.keras` and `.weights.h5` files. Keras saves a Keras 3 inner
    # optimizer itself, its variables by position. The wrapper's entry
    # holds `Layout.file_state`, the inner class name, and the variables of
    # an inner optimizer that Keras does not save.

    def save_own_variables(self, store: MutableMapping[str, Any]) -> None:
        """Saves the loss scale state, `skipped_steps` and the inner
        optimizer's class name into Keras's `store`."""
        layout = self._built_layout()
        for i, variable in enumerate(layout.file_state()):
            store[str(i)] = variable.numpy()
        for i, variable in enumerate(layout.inner_file_state()):
            store[f"{_INNER_VARIABLE}{i}"] = variable.numpy()
        # As bytes: every Keras weights store holds numeric arrays.
        store[_INNER_KIND] = np.frombuffer(layout.inner_kind().encode(),
                                           np.uint8)

    def load_own_variables(self, store: MutableMapping[str, Any]) -> None:
        """Loads what `save_own_variables` saved, or Keras 3's class saved.

        Older files hold less; what they hold is loaded, the rest stays.

        Raises:
            ValueError: If the file was written around another kind of inner
                optimizer (its variables would land in the wrong places), or
                by another configuration (fixed or dynamic scale, gradient
                accumulation), or holds an out-of-range value (a damaged
                file). Nothing of the loss scale state is loaded then.
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
            # Older files lack `skipped_steps` or `window_overflowed`.
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
        """Loads Keras 3's LossScaleOptimizer's dynamic scale and counter;
        Keras loads the inner optimizer itself."""
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
        """Loads `Layout.inner_file_state`, if the file has it."""
        count = sum(key.startswith(_INNER_VARIABLE) for key in store.keys())
        if not count:
            return  # Older files, or Keras saves the inner optimizer.
        # Copies: the file may be closed before a kind assigns them.
        layout.load_inner_variables(
            [np.array(store[f"{_INNER_VARIABLE}{i}"]) for i in range(count)],
            self.name)


def _checked(optimizer_name: str, variable: tf.Variable,
             value: Any) -> np.ndarray:
    """`value` in `variable`'s dtype; raises if out of range (every float
    saved is a loss scale, every integer a count)."""
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
    """The inner optimizer under an older layout's name: `base_optimizer`
    (TF 2.2) or `inner_optimizer` (Keras 3). It has no children, so it adds
    nothing to saved checkpoints."""

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
            # The Keras 3 wrapper's own unused `_iterations` and
            # `_learning_rate` (0) resolve to the same variables. Restores
            # run breadth-first, so writing again here makes this value win.
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
