"""The TF 2.1-2.3 dtype policy API: `Policy(name, loss_scale='auto')`.

A `Policy` is a Keras 3 `DTypePolicy` with a loss scale. `model.compile`
wraps a plain optimizer in a loss scale optimizer with it (compile_hook.py).
"""

from __future__ import annotations

from typing import Any

import keras

from tf_lso._src import compat
from tf_lso._src.legacy_api import compile_hook
from tf_lso._src.scaling import loss_scale as loss_scale_lib
from tf_lso._src.scaling import serialization


@keras.saving.register_keras_serializable(package="tf_lso")
class Policy(keras.dtype_policies.FloatDTypePolicy):
    """A dtype policy with a loss scale, as in TF 2.1-2.3.

    Args:
        name: `'float32'`, `'float16'`, `'mixed_float16'`,
            `'mixed_bfloat16'`, any other float dtype name, or `'_infer'`
            (no dtypes: they come from the inputs).
        loss_scale: `'auto'` (a dynamic loss scale for `'mixed_float16'`,
            None otherwise), None, `'dynamic'`, a number (a fixed scale) or
            a `LossScale`.

    Raises:
        TypeError: If `name` is not a string.
        ValueError: If `name` is not a float policy name, or `loss_scale`
            cannot be interpreted.

    >>> policy = tf_lso.experimental.Policy("mixed_float16")
    >>> policy.compute_dtype, policy.variable_dtype
    ('float16', 'float32')
    >>> policy.loss_scale
    DynamicLossScale(current_loss_scale=32768.0, num_good_steps=0,
                     initial_loss_scale=32768.0, increment_period=2000,
                     multiplier=2.0)
    >>> tf_lso.experimental.Policy("float32").loss_scale is None
    True
    """

    def __init__(self, name: str, loss_scale: Any = "auto") -> None:
        if not isinstance(name, str):
            raise TypeError(
                "`name` must be a string, such as 'mixed_float16'. Received: "
                f"name={name!r} of type {type(name).__name__}. For a DType, "
                "pass its name (e.g. dtype.name)."
            )
        if name == "_infer":
            compat.init_dtype_policy_without_dtypes(self, name)
        else:
            super().__init__(name)
        if loss_scale == "auto":
            loss_scale = "dynamic" if name == "mixed_float16" else None
        self._loss_scale = (
            None if loss_scale is None else serialization.get(loss_scale)
        )

    @property
    def loss_scale(self) -> loss_scale_lib.LossScale | None:
        """The `LossScale` that `compile` uses, or None."""
        return self._loss_scale

    def get_config(self) -> dict[str, Any]:
        """Returns `{'name', 'loss_scale'}` (the loss scale serialized)."""
        return {
            "name": self.name,
            "loss_scale": None if self._loss_scale is None
            else serialization.serialize(self._loss_scale),
        }

    @classmethod
    def from_config(
        cls, config: dict[str, Any], custom_objects: dict | None = None
    ) -> Policy:
        """Creates a policy from the output of `get_config()`.

        Args:
            config: `{'name', 'loss_scale'}`.
            custom_objects: Optional dict of custom loss scale classes.
        """
        config = dict(config)
        loss_scale = config.pop("loss_scale", None)
        if isinstance(loss_scale, dict):
            loss_scale = serialization.deserialize(loss_scale, custom_objects)
        return cls(config.pop("name"), loss_scale=loss_scale, **config)

    def __repr__(self) -> str:
        return f'<Policy "{self.name}", loss_scale={self._loss_scale}>'


compile_hook.LossScalePolicy.register(Policy)


def _as_policy(policy: keras.DTypePolicy) -> Policy:
    if isinstance(policy, Policy):
        return policy
    return Policy(policy.name)


def set_policy(policy: Policy | keras.DTypePolicy | str | None) -> None:
    """Sets the global dtype policy, which later layers and `model.compile`
    use (TF 2.1-2.3's `set_policy`).

    Args:
        policy: A `Policy`, a Keras `DTypePolicy`, a policy name, or None
            (`'float32'`). `'_infer'` becomes `'float32'` too: Keras 3
            layers need concrete dtypes.

    Raises:
        ValueError: For a policy that is not a float policy, or a value that
            is not a policy.
    """
    if policy is None or policy == "_infer":
        new = Policy("float32")
    elif isinstance(policy, str):
        new = Policy(policy)
    elif isinstance(policy, keras.DTypePolicy):
        new = _as_policy(policy)
    else:
        raise ValueError(
            "set_policy() takes a Policy, a policy name such as "
            f"'mixed_float16', or None. Received: policy={policy!r}. Pass "
            "one of those."
        )
    if new.compute_dtype is None or not (
        new.compute_dtype.startswith(("float", "bfloat"))
    ):
        raise ValueError(
            "set_policy can only be used to set the global policy to "
            'floating-point policies, such as "float32" and '
            f'"mixed_float16", but got policy: {new.name}'
        )
    compile_hook.enable()
    keras.mixed_precision.set_global_policy(new)
    if compat.tf_keras_is_tf_keras():
        # The legacy-Keras route: `tf.keras` layers read tf_keras's global
        # policy (which has no loss scale; `compile` reads it from here).
        _tf_keras_mixed_precision().set_global_policy(
            "float32" if new.name == "_infer" else new.name)


def _tf_keras_mixed_precision() -> Any:
    import tensorflow as tf

    return tf.keras.mixed_precision


def global_policy() -> Policy:
    """Returns the global policy as a `Policy`.

    That is the policy given to `set_policy`, or Keras's global policy with
    an `'auto'` loss scale. On the legacy-Keras route, tf_keras's own
    `set_global_policy` counts too.
    """
    policy = _as_policy(keras.mixed_precision.global_policy())
    if compat.tf_keras_is_tf_keras():
        name = _tf_keras_mixed_precision().global_policy().name
        if name != policy.name:
            return Policy(name)
    return policy


def get_layer_policy(layer: keras.layers.Layer) -> Policy:
    """Returns the dtype policy of a Keras layer as a `Policy`.

    Raises:
        ValueError: If `layer` is not a Keras layer.
    """
    tf_keras = compat.tf_keras_module()
    if tf_keras is not None and isinstance(layer, tf_keras.layers.Layer):
        # tf_keras's policies carry no loss scale: the global one's counts
        # where the names agree.
        policy = global_policy()
        name = layer.dtype_policy.name
        return policy if policy.name == name else Policy(name)
    if not isinstance(layer, keras.layers.Layer):
        raise ValueError(
            f"get_policy can only be called on a layer, but got: {layer!r}"
        )
    return _as_policy(layer.dtype_policy)
