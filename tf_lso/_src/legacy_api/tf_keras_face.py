"""tf_lso's loss scale optimizers as tf_keras's `Model.compile` takes them.

On the legacy-Keras route (`TF_USE_LEGACY_KERAS=1`) `tf.keras` is tf_keras
2.x, whose `compile` accepts only tf_keras optimizer classes. A tf_lso loss
scale optimizer around a tf_keras optimizer is one: its class is a subclass
of the tf_lso class that is also tf_keras's `LossScaleOptimizer` and
`Optimizer` (`kinds/tf_keras.py`, `tf_keras_wrapper_class`), so tf_keras's
`compile` keeps it (`model.optimizer is opt`, as TF 2.1-2.4 gave), and
`isinstance`, `get_config`, serialization and saving see the user's
optimizer itself.

While the compile hook is enabled (`tf_lso.install()`, `set_policy`),
tf_keras's `Model.compile`

* refuses a tf_lso optimizer around a Keras 3 optimizer, saying what to do
  (tf_keras's own message would be "Could not interpret optimizer
  identifier");
* under a `tf_lso.experimental.Policy` with a loss scale (TF 2.1-2.3), wraps
  a plain tf_keras optimizer in `tf_lso.experimental.LossScaleOptimizer`
  with that loss scale, as TF 2.1-2.3's `compile` did (a policy whose loss
  scale is None: a fixed scale of 1, which scales nothing, so that
  tf_keras's own `compile` does not wrap it in a dynamic one).
"""

from __future__ import annotations

from typing import Any

from tf_lso._src import compat
from tf_lso._src.inner import wrapping
from tf_lso._src.inner.kinds import tf_keras as tf_keras_kinds
from tf_lso._src.optimizer import experimental_loss_scale_optimizer as v1
from tf_lso._src.optimizer import loss_scale_optimizer as v2
from tf_lso._src.scaling import loss_scale as loss_scale_lib


def compile_optimizer(model: Any, optimizer: Any, policy: Any = None) -> Any:
    """The optimizer tf_keras's `model.compile` should get.

    Args:
        model: The tf_keras model being compiled.
        optimizer: What was passed to `compile`.
        policy: The global TF 2.1-2.3 `Policy` (one with a `loss_scale`), or
            None. It applies to a model whose dtype policy has its name.

    Returns:
        `optimizer` unchanged, or a new
        `tf_lso.experimental.LossScaleOptimizer` around it.

    Raises:
        TypeError: For a tf_lso optimizer around a Keras 3 optimizer, which
            a tf_keras model cannot train.
    """
    if isinstance(optimizer, v2.LossScaleOptimizer):
        kind = wrapping.kind_of(optimizer.inner_optimizer)
        if kind is None or not issubclass(kind, tf_keras_kinds.TfKerasKind):
            inner = type(optimizer.inner_optimizer)
            raise TypeError(
                "A tf_keras model (tf.keras is tf_keras here: "
                "TF_USE_LEGACY_KERAS=1) cannot be trained by a Keras 3 "
                f"optimizer. Received: optimizer={optimizer!r} around a "
                f"{inner.__module__}.{inner.__name__}. Wrap a tf.keras "
                "optimizer instead, e.g. "
                "tf_lso.LossScaleOptimizer(tf.keras.optimizers.SGD(...))."
            )
        return optimizer
    model_policy = getattr(model, "dtype_policy", None)
    if policy is None or model_policy is None or (
            model_policy.name != policy.name):
        return optimizer
    loss_scale = policy.loss_scale
    if loss_scale is None and policy.name != "mixed_float16":
        return optimizer
    tf_keras = compat.tf_keras_module()
    assert tf_keras is not None  # Its compile calls this.
    optimizer = tf_keras.optimizers.get(optimizer)
    if isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer):
        return optimizer
    previous: Any = getattr(model, "optimizer", None)
    if isinstance(previous, v1.LossScaleOptimizerV1) and (
            previous.inner_optimizer is optimizer):
        return previous  # A recompile with the same optimizer.
    if loss_scale is None:
        # TF 2.1-2.3: no loss scaling. A fixed scale of 1 changes nothing
        # (x * 1 and x / 1 are exact) and keeps tf_keras's compile from
        # wrapping the optimizer in a dynamic one under 'mixed_float16'.
        loss_scale = loss_scale_lib.FixedLossScale(1)
    elif isinstance(loss_scale, loss_scale_lib.LossScale):
        # Each model its own loss scale state (TF 2.1-2.3 shared one).
        loss_scale = type(loss_scale).from_config(loss_scale.get_config())
    return v1.LossScaleOptimizerV1(optimizer, loss_scale)

