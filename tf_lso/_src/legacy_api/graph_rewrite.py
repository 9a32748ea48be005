"""`enable_mixed_precision_graph_rewrite` for Keras 3 optimizers.

TF 2.1-2.3 scripts call `tf.train.experimental.
enable_mixed_precision_graph_rewrite(opt)` and then train with the optimizer
it returns. TensorFlow 2.16+ keeps the function only for TF1-style
optimizers (`tf.compat.v1.mixed_precision`); for Keras optimizers it raises.
This one does what TF 2.4-2.8 did for Keras optimizers: wrap the optimizer
in the experimental loss scale optimizer (the wrapper TF registered for
them) and switch on TensorFlow's automatic mixed precision graph pass.
TF1-style optimizers still go to TensorFlow's own function.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tf_lso._src import compat
from tf_lso._src.inner import wrapping
from tf_lso._src.optimizer import experimental_loss_scale_optimizer as v1

# TensorFlow's own function (TF1-style optimizers), as it was at import:
# `tf_lso.install()` puts `enable_mixed_precision_graph_rewrite` in its place.
_TF_ENABLE = tf.compat.v1.mixed_precision.enable_mixed_precision_graph_rewrite
_PASS = "auto_mixed_precision"


def enable_mixed_precision_graph_rewrite(
    opt: Any, loss_scale: Any = "dynamic"
) -> Any:
    """Wraps `opt` for loss scaling and switches on the graph rewrite.

    TF 2.1-2.8's function, for Keras 3 and tf_keras optimizers too: the
    optimizer is wrapped in `tf_lso.experimental.LossScaleOptimizer(opt,
    loss_scale)` (the class TF 2.4-2.8 wrapped Keras optimizers in), and
    TensorFlow's automatic mixed precision graph pass is switched on
    (`tf.config.optimizer.set_experimental_options`). That pass changes
    float32 ops to float16 on NVIDIA GPUs only: on CPUs (and TPUs) the graph
    is left as it is, and the loss scale optimizer works as usual. A
    TF1-style optimizer (`tf.compat.v1.train.Optimizer`) goes to
    TensorFlow's own function, which takes tf_lso's loss scales as its own.

    Args:
        opt: A Keras 3, tf_keras or tf_keras legacy optimizer, or a
            `tf.compat.v1.train.Optimizer`.
        loss_scale: `'dynamic'` (default), a number (a fixed scale), or a
            `LossScale`, as `tf_lso.experimental.LossScaleOptimizer` takes.

    Returns:
        The optimizer to train with: the loss scale optimizer wrapping `opt`.

    Raises:
        ValueError: If a mixed precision Keras global policy is set (use one
            of the two, not both), if `opt` is a loss scale optimizer or
            wrapped by one already, or if it is not an optimizer.
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
        # TF's wording first (code matches it), then what tf_lso takes.
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
