"""Reading and writing the inner optimizer's attributes through the wrapper.

Explicit properties forward the attributes every optimizer has (learning
rate, clipping, iterations, ...). Any other *public* attribute that only the
inner optimizer has (Adam's `beta_1`, ...) is read with `__getattr__`, which
Python calls only after normal lookup failed, and written with a check in
`__setattr__`. Nothing else is forwarded.
"""


class _CallableList(list):
    """A list that can also be called, for both `opt.variables` spellings."""

    def __call__(self):
        return list(self)


def _forwarded(name):
    """A property that reads and writes `name` on the inner optimizer."""

    def fget(self):
        return getattr(self._optimizer, name)

    def fset(self, value):
        # Keras's base constructor assigns its own defaults (clipnorm=None,
        # ...) before the wrapper is ready; those must not reach the inner.
        if self.__dict__.get("_wrapper_ready"):
            setattr(self._optimizer, name, value)

    return property(fget, fset, doc=f"The inner optimizer's `{name}`.")


class InnerOptimizerForwarding:
    """Mixin for an optimizer wrapper holding `_optimizer` and `_inner`.

    `_optimizer` is the wrapped optimizer and `_inner` its adapter from
    `inner_optimizer.adapter_for`. Forwarding starts once the wrapper sets
    `_wrapper_ready`.
    """

    @property
    def inner_optimizer(self):
        """The optimizer that this LossScaleOptimizer wraps."""
        return self._optimizer

    @property
    def learning_rate(self):
        """The inner optimizer's learning rate.

        With a learning rate schedule on a Keras 3 inner optimizer this is a
        `ScheduledLearningRate`: TF 2.x code calls it with a step
        (`opt.learning_rate(opt.iterations)`), Keras 3 code uses it as the
        current value.
        """
        return self._inner.learning_rate(self._optimizer)

    learning_rate = learning_rate.setter(_forwarded("learning_rate").fset)
    clipnorm = _forwarded("clipnorm")
    clipvalue = _forwarded("clipvalue")
    global_clipnorm = _forwarded("global_clipnorm")
    weight_decay = _forwarded("weight_decay")
    use_ema = _forwarded("use_ema")
    ema_momentum = _forwarded("ema_momentum")
    ema_overwrite_frequency = _forwarded("ema_overwrite_frequency")
    gradient_accumulation_steps = _forwarded("gradient_accumulation_steps")

    @property
    def lr(self):
        """Alias of `learning_rate`."""
        return self.learning_rate

    @lr.setter
    def lr(self, value):
        self.learning_rate = value

    @property
    def iterations(self):
        """The inner optimizer's step counter (skipped steps count too)."""
        return self._optimizer.iterations

    @iterations.setter
    def iterations(self, value):
        if self.__dict__.get("_wrapper_ready"):
            self._inner.set_iterations(self._optimizer, value)

    def __getattr__(self, name):
        # Only reached when normal lookup fails: public attributes of the
        # inner optimizer (Adam's `beta_1`, ...) read through.
        inner = self.__dict__.get("_optimizer")
        if not name.startswith("_") and inner is not None:
            try:
                return getattr(inner, name)
            except AttributeError:
                pass
        raise AttributeError(
            f"'{type(self).__name__}' object has no attribute '{name}'"
        )

    def __setattr__(self, name, value):
        # A public attribute that only the inner optimizer has is set there.
        if (
            self.__dict__.get("_wrapper_ready")
            and not name.startswith("_")
            and not hasattr(type(self), name)
            and name not in self.__dict__
            and hasattr(self._optimizer, name)
        ):
            setattr(self._optimizer, name, value)
            return
        super().__setattr__(name, value)

    def __dir__(self):
        inner = [n for n in dir(self._optimizer) if not n.startswith("_")]
        return sorted(set(super().__dir__()) | set(inner))

    @property
    def variables(self):
        """The inner optimizer's variables; also callable as `variables()`."""
        return _CallableList(self._inner.variables(self._optimizer))

    @property
    def weights(self):
        """The inner optimizer's variables, as a list."""
        return list(self.variables)

    def get_weights(self):
        """Returns the values of the inner optimizer's variables (NumPy)."""
        return [v.numpy() for v in self.variables]

    def set_weights(self, weights):
        """Sets the inner optimizer's variables from a list of NumPy values.

        Args:
            weights: Values in the order of `get_weights()`.
        """
        self._optimizer.set_weights(weights)

    def get_slot_names(self):
        """The inner optimizer's slot names; `[]` if it has no slots API.

        Keras 3 and tf_keras optimizers keep per-variable state in
        `variables`, not in named slots; TensorFlow's checkpointing also asks
        every optimizer for its slot names.
        """
        if not self._inner.has_slots:
            return []
        return self._optimizer.get_slot_names()

    def get_slot(self, var, slot_name):
        """The inner optimizer's slot for `var` (tf_keras legacy optimizers).

        Args:
            var: A variable the optimizer was applied to.
            slot_name: A name from `get_slot_names()`.

        Returns:
            The slot variable.
        """
        return self._slot_owner("get_slot").get_slot(var, slot_name)

    def add_slot(self, var, slot_name, initializer="zeros", shape=None):
        """Adds a slot to the inner optimizer (tf_keras legacy optimizers).

        Args:
            var: A variable the slot belongs to.
            slot_name: The slot's name.
            initializer: Its initializer or initial value.
            shape: Optional shape, defaults to `var`'s.

        Returns:
            The slot variable.
        """
        return self._slot_owner("add_slot").add_slot(
            var, slot_name, initializer=initializer, shape=shape
        )

    def _slot_owner(self, method):
        if not self._inner.has_slots:
            raise AttributeError(
                f"{method}() needs an inner optimizer with slots (a "
                "tf_keras.optimizers.legacy optimizer), but this "
                f"LossScaleOptimizer wraps {self._optimizer!r}. Use "
                "`inner_optimizer.variables` instead."
            )
        return self._optimizer

