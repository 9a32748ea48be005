"""What tf_lso needs from the optimizers it wraps, for each kind of optimizer.

Three kinds are supported: Keras 3 optimizers (`tf.keras.optimizers.*` on
TF >= 2.16), tf_keras optimizers (`tf_keras.optimizers.*`) and tf_keras
legacy optimizers (`tf_keras.optimizers.legacy.*`, the OptimizerV2 of
TF 2.x). tf_keras is optional and never imported here unless a config asks
for it.
"""

import importlib

import keras
import tensorflow as tf

from tf_lso._src import compat
from tf_lso._src import tensor_like


class _KerasInner:
    """A Keras 3 optimizer."""

    has_slots = False
    # Keras 3 clips each replica's gradients before its all-reduce; TF 2.4
    # clipped the sum. tf_lso sums first for this kind (see `_apply`).
    aggregates_before_clipping = False

    def build(self, optimizer, var_list):
        if not optimizer.built:
            with keras.name_scope(optimizer.name, caller=optimizer):
                optimizer.build(var_list)

    def apply(self, optimizer, grads_and_vars, name, aggregate):
        del name  # Keras 3 optimizers take no name.
        if aggregate:
            optimizer.apply_gradients(grads_and_vars)
        else:
            compat.keras_apply_without_all_reduce(optimizer, grads_and_vars)

    def serialize(self, optimizer):
        config = keras.optimizers.serialize(optimizer)
        if compat.keras_is_auto_name(optimizer):
            # Not configuration: it depends on how many optimizers of the
            # class were built before (TF 2.x names did not).
            config["config"].pop("name", None)
        return config

    def check_variables(self, optimizer, var_list):
        """Raises the inner optimizer's error for variables it cannot update."""
        compat.keras_check_variables_are_known(optimizer, var_list)

    def variables(self, optimizer):
        return list(optimizer.variables)

    def set_iterations(self, optimizer, value):
        optimizer.iterations.assign(value)

    def learning_rate(self, optimizer):
        """The learning rate, callable with a step if it follows a schedule."""
        schedule = compat.keras_learning_rate_schedule(optimizer)
        if schedule is None:
            return optimizer.learning_rate
        return tensor_like.ScheduledLearningRate(
            schedule, lambda: optimizer.learning_rate
        )

    def skip_step(self, optimizer):
        """What a skipped step does instead of `apply`: counts the call.

        With gradient accumulation it also empties the accumulators: the
        window that the non-finite gradient reached is dropped as a whole.
        """
        if not getattr(optimizer, "gradient_accumulation_steps", None):
            optimizer.iterations.assign_add(1)
            return
        compat.keras_step_counter(optimizer).assign_add(1)
        for accumulator in compat.keras_gradient_accumulators(
            optimizer, compat.keras_trainable_variables(optimizer)
        ):
            accumulator.assign(tf.zeros_like(accumulator))

    def accumulation_window(self, optimizer, var_list):
        """`(is_window_end, accumulators)` with gradient accumulation, else None.

        `is_window_end` is a bool tensor: True when this `apply` call ends a
        window and updates the variables; `accumulators` holds the gradient
        sums of the window so far for `var_list`.
        """
        steps = getattr(optimizer, "gradient_accumulation_steps", None)
        if not steps:
            return None
        counter = compat.keras_step_counter(optimizer)
        is_window_end = tf.equal((counter + 1) % steps, 0)
        return is_window_end, compat.keras_gradient_accumulators(
            optimizer, var_list
        )


class _TfKerasInner(_KerasInner):
    """A tf_keras optimizer (the "new" optimizer of TF 2.11-2.15)."""

    aggregates_before_clipping = True

    def build(self, optimizer, var_list):
        optimizer.build(var_list)  # A no-op once built.

    def apply(self, optimizer, grads_and_vars, name, aggregate):
        optimizer.apply_gradients(
            grads_and_vars, name=name, skip_gradients_aggregation=not aggregate
        )

    def serialize(self, optimizer):
        return compat.tf_keras_module().optimizers.serialize(optimizer)

    def check_variables(self, optimizer, var_list):
        compat.tf_keras_check_variables_are_known(optimizer, var_list)


    def learning_rate(self, optimizer):
        return optimizer.learning_rate

    def skip_step(self, optimizer):
        optimizer.iterations.assign_add(1)

    def accumulation_window(self, optimizer, var_list):
        del optimizer, var_list  # tf_keras optimizers do not accumulate.
        return None


class _TfKerasLegacyInner(_TfKerasInner):
    """A tf_keras legacy optimizer (OptimizerV2, the TF 2.1-2.10 optimizer)."""

    has_slots = True

    def build(self, optimizer, var_list):
        compat.legacy_create_all_weights(optimizer, var_list)

    def apply(self, optimizer, grads_and_vars, name, aggregate):
        optimizer.apply_gradients(
            grads_and_vars,
            name=name,
            experimental_aggregate_gradients=aggregate,
        )

    def variables(self, optimizer):
        return list(optimizer.variables())

    def check_variables(self, optimizer, var_list):
        del optimizer, var_list  # OptimizerV2 updates any variable.


def _is_loss_scale_optimizer(optimizer):
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return True
    tf_keras = compat.tf_keras_module()
    return tf_keras is not None and isinstance(
        optimizer, tf_keras.mixed_precision.LossScaleOptimizer
    )


def adapter_for(optimizer, argument_name):
    """Returns the adapter for `optimizer`, or raises a TypeError.

    Args:
        optimizer: The optimizer to wrap.
        argument_name: The constructor argument it came from, for messages.

    Raises:
        TypeError: If `optimizer` is a loss scale optimizer, or not an
            optimizer of a supported kind.
    """
    if _is_loss_scale_optimizer(optimizer):
        raise TypeError(
            "LossScaleOptimizer cannot wrap another LossScaleOptimizer, but "
            f"got: {optimizer!r}. Wrap its inner optimizer instead (e.g. "
            f"`{argument_name}=opt.inner_optimizer`)."
        )
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return _KerasInner()
    tf_keras = compat.tf_keras_module()
    if tf_keras is not None:
        if isinstance(optimizer, tf_keras.optimizers.legacy.Optimizer):
            return _TfKerasLegacyInner()
        if isinstance(optimizer, tf_keras.optimizers.Optimizer):
            return _TfKerasInner()
    raise TypeError(
        f'"{argument_name}" must be an instance of '
        "`tf.keras.optimizers.Optimizer` (a Keras 3 optimizer), or of a "
        "tf_keras optimizer (`tf_keras.optimizers.Optimizer` or "
        "`tf_keras.optimizers.legacy.Optimizer`), but got: "
        f"{optimizer!r} of type {type(optimizer).__name__}."
    )


def _is_tf_keras_config(config):
    inner_config = config.get("config", {})
    return config.get("module") == "keras.optimizers.legacy" or (
        isinstance(inner_config, dict) and "is_legacy_optimizer" in inner_config
    )


def deserialize(config, custom_objects=None):
    """Creates an optimizer from a serialized inner optimizer.

    Configs written by tf_keras (`module: keras.optimizers.legacy`, or an
    `is_legacy_optimizer` entry) are rebuilt with tf_keras; everything else,
    including TF 2.x configs without a module, with Keras 3.

    Args:
        config: A serialized optimizer dict, or an optimizer instance.
        custom_objects: Optional dict of custom classes.

    Returns:
        An optimizer.
    """
    if not isinstance(config, dict):
        return config
    if _is_tf_keras_config(config):
        tf_keras = importlib.import_module("tf_keras")
        return tf_keras.optimizers.deserialize(
            config, custom_objects=custom_objects
        )
    return keras.optimizers.deserialize(config, custom_objects=custom_objects)
