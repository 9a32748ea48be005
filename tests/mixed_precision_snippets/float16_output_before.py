"""A float16 model output under the `mixed_float16` policy.

TensorFlow's mixed precision guide: keep the model's last activation in
float32. Issue 52's shapes *before* the fix. A `# finds: RULE` comment line
marks the line after it, which `tf-lso check` must report
(tests/migration_mixed_precision_test.py).
"""

import tensorflow as tf
from tensorflow.keras import layers

policy = tf.keras.mixed_precision.Policy("mixed_float16")
tf.keras.mixed_precision.set_global_policy(policy)


def classifier(num_classes):
    return tf.keras.Sequential([
        layers.Conv2D(32, 3, activation="relu", input_shape=(28, 28, 1)),
        layers.Flatten(),
        # finds: float16-output
        layers.Dense(num_classes, activation="softmax"),
    ])


def functional_classifier(num_classes):
    inputs = tf.keras.Input(shape=(784,), name="digits")
    x = layers.Dense(64, activation="relu")(inputs)
    # finds: float16-output
    outputs = layers.Dense(num_classes, activation="softmax")(x)
    return tf.keras.Model(inputs=inputs, outputs=outputs)


def regressor():
    inputs = tf.keras.Input(shape=(16,))
    hidden = layers.Dense(64, activation="relu")(inputs)
    # finds: float16-output
    return tf.keras.Model(inputs, layers.Dense(1)(hidden))
