"""bfloat16_loss_scale_before.py *after* the fix: no loss scaling under
`mixed_bfloat16`; and loss scaling kept only where float16 is used.
`tf-lso check` reports nothing here."""

import keras
import tensorflow as tf

tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")


def build_optimizer(learning_rate):
    return tf.keras.optimizers.Adam(learning_rate)


def build_keras3_optimizer():
    return keras.optimizers.AdamW(1e-4)


def build_for_policy(optimizer):
    # Wrapped only when the policy is float16: not under bfloat16.
    if keras.mixed_precision.global_policy().name == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def fixed_scale(optimizer):
    # A fixed scale of 1 checks nothing and skips nothing.
    return tf.keras.mixed_precision.LossScaleOptimizer(
        optimizer, dynamic=False, initial_scale=1)
