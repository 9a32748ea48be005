"""A dynamic loss scale kept under the `mixed_bfloat16` policy.

Issue 52's shapes *before* the fix (huggingface/transformers PR #21428 and
accelerate PR #1036, DeepSpeed PR #3166, HorizonRobotics/alf PR #1734,
ecmwf/WeatherGenerator issue #874, decoderesearch/SAELens PR #723: a loss
scaler kept for bfloat16). A `# finds: RULE` comment line marks the line
after it, which `tf-lso check` must report
(tests/migration_mixed_precision_test.py).
"""

import keras
import tensorflow as tf

tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")


# TF 2.4's wrapper kept when the policy moved to bfloat16.
def build_optimizer(learning_rate):
    optimizer = tf.keras.optimizers.Adam(learning_rate)
    # finds: bfloat16-loss-scale
    return tf.keras.mixed_precision.LossScaleOptimizer(optimizer)


# The same with TF 2.1-2.3's experimental class and its dynamic scale.
def build_optimizer_tf23(learning_rate):
    optimizer = tf.keras.optimizers.SGD(learning_rate)
    # finds: bfloat16-loss-scale
    return tf.keras.mixed_precision.experimental.LossScaleOptimizer(
        optimizer, loss_scale="dynamic")


# Keras 3's own class, wrapped "just in case" under a flag.
def build_keras3_optimizer(use_loss_scaling=True):
    optimizer = keras.optimizers.AdamW(1e-4)
    if use_loss_scaling:
        # finds: bfloat16-loss-scale
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
