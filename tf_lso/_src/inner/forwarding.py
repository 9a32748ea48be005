"""The inner optimizer's attributes, read and written through the wrapper.

`InnerOptimizerForwarding` is the base of `LossScaleOptimizer`. Explicit
properties forward what every optimizer has: learning rate, clipping,
iterations, variables, slots. The inner optimizer's hyperparameters
(Adam's `beta_1`, `epsilon`, ...) are forwarded by name. Flags such as
SGD's `nesterov` are not. Any other attribute is the wrapper's own.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tf_lso._src.inner import inner_optimizer


class _CallableList(list):
    """A list that can also be called, for both `opt.variables` spellings."""

    def __call__(self) -> list:
        return list(self)


def _set_on_inner(wrapper: Any, name: str, value: Any) -> None:
    # Keras's constructor assigns its defaults (clipnorm=None, ...) before
    # the inner optimizer is set. They must not reach it.
    if _is_wrapping(wrapper):
        setattr(wrapper.inner_optimizer, name, value)


def _forwarded(name: str) -> property:
    """A property that reads and writes `name` on the inner optimizer."""

    def fget(self: Any) -> Any:
        return getattr(self.inner_optimizer, name)

    def fset(self: Any, value: Any) -> None:
        _set_on_inner(self, name, value)

    return property(fget, fset, doc=f"The inner optimizer's `{name}`.")


def _is_wrapping(wrapper: Any) -> bool:
    return "_inner" in wrapper.__dict__


def start_forwarding(wrapper: InnerOptimizerForwarding,
                     inner: inner_optimizer.InnerOptimizer) -> None:
    """Makes `wrapper`'s attributes read through to `inner` from now on. The
    subclass calls it after Keras's constructor, whose defaults must not
    reach `inner`."""
    wrapper.__dict__["_forwarded_names"] = frozenset(
        name for name in inner.hyperparameter_names()
        if not name.startswith("_"))
    wrapper._inner = inner


class InnerOptimizerForwarding:
    """A Keras optimizer whose state is another optimizer's. Forwarding
    starts when the subclass calls `start_forwarding`."""

    #: The `InnerOptimizer`, set by `start_forwarding`.
    _inner: inner_optimizer.InnerOptimizer

    #: The inner optimizer's hyperparameters, which read and write through.
    #: They are fixed when it is wrapped.
    _forwarded_names: frozenset = frozenset()

    @property
    def inner_optimizer(self) -> Any:
        """The optimizer that this LossScaleOptimizer wraps."""
        return self._inner.optimizer

    @property
    def _optimizer(self) -> Any:
        # TF 2.x code reads the inner optimizer here (`python -m tf_lso
        # check` suggests `inner_optimizer`).
        return self._inner.optimizer

    @property
    def learning_rate(self) -> Any:
        """The inner optimizer's learning rate.

        With a schedule on a Keras 3 inner optimizer, it is a
        `ScheduledLearningRate`. TF 2.x code calls it with a step, and
        Keras 3 code reads it as the current value.
        """
        return self._inner.learning_rate()

    @learning_rate.setter
    def learning_rate(self, value: Any) -> None:
        _set_on_inner(self, "learning_rate", value)
    clipnorm = _forwarded("clipnorm")
    clipvalue = _forwarded("clipvalue")
    global_clipnorm = _forwarded("global_clipnorm")
    weight_decay = _forwarded("weight_decay")
    use_ema = _forwarded("use_ema")
    ema_momentum = _forwarded("ema_momentum")
    ema_overwrite_frequency = _forwarded("ema_overwrite_frequency")
    gradient_accumulation_steps = _forwarded("gradient_accumulation_steps")

    @property
    def lr(self) -> Any:
        """Alias of `learning_rate`."""
        return self.learning_rate

    @lr.setter
    def lr(self, value: Any) -> None:
        self.learning_rate = value

    @property
    def iterations(self) -> tf.Variable:
        """The inner optimizer's step counter (skipped steps count too)."""
        return self._inner.iterations

    @iterations.setter
    def iterations(self, value: Any) -> None:
        if _is_wrapping(self):
            self._inner.set_iterations(value)

    def _forwards(self, name: str) -> bool:
        return name in self._forwarded_names

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails.
        if self._forwards(name):
            return getattr(self._inner.optimizer, name)
        inner = self.__dict__.get("_inner")
        hint = "" if inner is None or name.startswith("_") else (
            f" Besides its own attributes it forwards the hyperparameters of "
            f"its inner optimizer {type(inner.optimizer).__name__}: "
            f"{sorted(self._forwarded_names)}. Other attributes of "
            "the inner optimizer are on `inner_optimizer`."
        )
        raise AttributeError(
            f"'{type(self).__name__}' object has no attribute '{name}'.{hint}"
        )  # Python's own wording first: code may match it.

    def __setattr__(self, name: str, value: Any) -> None:
        # A hyperparameter of the inner optimizer is set there.
        if (
            self._forwards(name)
            and not hasattr(type(self), name)
            and name not in self.__dict__
        ):
            setattr(self._inner.optimizer, name, value)
            return
        super().__setattr__(name, value)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | self._forwarded_names)

    @property
    def variables(self) -> list[tf.Variable]:
        """The inner optimizer's variables; also callable as `variables()`."""
        return _CallableList(self._inner.variables())

    @property
    def weights(self) -> list[tf.Variable]:
        """The inner optimizer's variables, as a list."""
        return list(self.variables)

    def get_weights(self) -> list[np.ndarray]:
        """The values of the inner optimizer's `variables`, as NumPy arrays."""
        return self._inner.get_weights()

    def set_weights(self, weights: list[np.ndarray]) -> None:
        """Sets the inner optimizer's variables, in `get_weights()`'s order."""
        self._inner.optimizer.set_weights(weights)

    def get_slot_names(self) -> list[str]:
        """The inner optimizer's slot names, or `[]` if it has none.

        Only tf_keras legacy optimizers have named slots. The others keep
        their state in `variables`.
        """
        return self._inner.slot_names()

    def get_slot(self, var: tf.Variable, slot_name: str) -> tf.Variable:
        """The inner optimizer's slot for `var` (tf_keras legacy optimizers).

        Args:
            var: A variable the optimizer was applied to.
            slot_name: A name from `get_slot_names()`.

        Returns:
            The slot variable.

        Raises:
            AttributeError: If the inner optimizer has no named slots.
        """
        return self._inner.slot_owner("get_slot").get_slot(var, slot_name)

    def add_slot(
        self,
        var: tf.Variable,
        slot_name: str,
        initializer: Any = "zeros",
        shape: Any = None,
    ) -> tf.Variable:
        """Adds a slot to the inner optimizer (tf_keras legacy optimizers).

        Args:
            var: A variable the slot belongs to.
            slot_name: The slot's name.
            initializer: Its initializer or initial value.
            shape: Optional shape, defaults to `var`'s.

        Returns:
            The slot variable.

        Raises:
            AttributeError: If the inner optimizer has no named slots.
        """
        return self._inner.slot_owner("add_slot").add_slot(
            var, slot_name, initializer=initializer, shape=shape
        )
