"""`enable_mixed_precision_graph_rewrite` for Keras 3 optimizers.

TensorFlow 2.16+ raises for Keras optimizers here. This module does what
TF 2.4-2.8 did for them; TF1-style optimizers still go to TensorFlow.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tf_lso._src import compat
from tf_lso._src.inner import wrapping
from tf_lso._src.optimizer import experimental_loss_scale_optimizer as v1

# TensorFlow's own function, kept before `tf_lso.install()` replaces it.
_TF_ENABLE = tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite
_PASS = "auto_mixed_precision"


def enable_mixed_precision_graph_rewrite(
    opt: Any, loss_scale: Any = "dynamic"
) -> Any:
    """Wraps `opt` in `tf_lso.experimental.LossScaleOptimizer(opt,
    loss_scale)` and switches on TensorFlow's mixed precision graph pass.

    The pass changes ops to float16 on NVIDIA GPUs only; elsewhere the loss
    scale optimizer works as usual. A `tf.compat.v1.train.Optimizer` goes to
    TensorFlow's own function, which takes tf_lso's loss scales too.

    Args:
        opt: A Keras 3, tf_keras or tf_keras legacy optimizer, or a
            `tf.compat.v1.train.Optimizer`.
        loss_scale: `'dynamic'` (default), a number (a fixed scale), or a
            `LossScale`, as `tf_lso.experimental.LossScaleOptimizer` takes.

    Returns:
        The loss scale optimizer to train with.

    Raises:
        ValueError: If a mixed precision Keras global policy is set, if
            `opt` is or has a loss scale optimizer already, or if it is not
            an optimizer.
    """
    if isinstance(opt, tf.compat.v1.train.Optimizer):
        return _TF_ENABLE(opt, loss_scale)
    _check_no_mixed_policy()
    if wrapping.is_loss_scale_optimizer(opt):
        raise ValueError(
            '"opt" must not already be an instance of a LossScaleOptimizer. '
            "`enable_mixed_precision_graph_rewrite` will automatically wrap "
            f"the optimizer with a LossScaleOptimizer. Received: opt={opt!r}. "
            "Pass its inner optimizer (`opt.inner_optimizer`), or use the "
            "loss scale optimizer without the graph rewrite."
        )
    if not wrapping.is_supported(opt):
        # TF's wording first, as code matches it.
        raise ValueError(
            '"opt" must be an instance of a tf.train.Optimizer or a '
            f"tf.keras.optimizers.Optimizer, but got: {opt!r}. It hands a "
            "`tf.compat.v1.train.Optimizer` to TensorFlow's own function, "
            f"and wraps {wrapping.describe_kinds()}."
        )
    wrapped = v1.LossScaleOptimizerV1(opt, loss_scale)
    tf.config.optimizer.set_experimental_options({_PASS: True})
    return wrapped


def disable_mixed_precision_graph_rewrite() -> None:
    """Switches TensorFlow's automatic mixed precision graph pass off.

    Optimizers that `enable_mixed_precision_graph_rewrite` wrapped keep
    scaling the loss. Graphs already optimized keep their dtypes.
    """
    tf.config.optimizer.set_experimental_options({_PASS: False})


def _check_no_mixed_policy() -> None:
    """TF's ValueError if a Keras global policy is mixed precision."""
    policies = [keras.mixed_precision.global_policy()]
    tf_keras = compat.tf_keras_module()
    if tf_keras is not None:
        policies.append(tf_keras.mixed_precision.global_policy())
    if any(policy.name.startswith("mixed_") for policy in policies):
        raise ValueError(
            "The mixed precision graph rewrite cannot be enabled, because the "
            "global Keras dtype Policy has been set to a mixed precision "
            "policy. At most, one of the following can be called:\n\n"
            "  1. tf.keras.mixed_precision.set_global_policy() with a mixed "
            "precision policy (You called this first)\n\n"
            "  2. tf.train.experimental.enable_mixed_precision_graph_rewrite() "
            "(You called this second)\n"
            "You called both functions, which is an error, because both "
            "functions enable you to use mixed precision. If in doubt which "
            "function to use, use the first, as it supports Eager execution "
            "and is more customizable."
        )
