"""float16_output_before.py *after* the fix: the last layer, or an extra
last activation, in float32. `tf-lso check` reports nothing here."""

import tensorflow as tf
from tensorflow.keras import layers

policy = tf.keras.mixed_precision.Policy("mixed_float16")
tf.keras.mixed_precision.set_global_policy(policy)


def classifier(num_classes):
    return tf.keras.Sequential([
        layers.Conv2D(32, 3, activation="relu", input_shape=(28, 28, 1)),
        layers.Flatten(),
        layers.Dense(num_classes),
        layers.Activation("softmax", dtype="float32"),
    ])


def functional_classifier(num_classes):
    inputs = tf.keras.Input(shape=(784,), name="digits")
    x = layers.Dense(64, activation="relu")(inputs)
    x = layers.Dense(num_classes)(x)
    outputs = layers.Activation("softmax", dtype="float32")(x)
    return tf.keras.Model(inputs=inputs, outputs=outputs)


def regressor():
    inputs = tf.keras.Input(shape=(16,))
    hidden = layers.Dense(64, activation="relu")(inputs)
    return tf.keras.Model(inputs, layers.Dense(1, dtype="float32")(hidden))


def cast_by_hand():
    # What a Lambda returns is up to its code.
    return tf.keras.Sequential([
        layers.Dense(4, input_shape=(2,)),
        layers.Lambda(lambda t: tf.cast(t, tf.float32)),
    ])


def built_then_added():
    model = tf.keras.Sequential([layers.Dense(4, input_shape=(2,))])
    model.add(layers.Dense(1, dtype="float32"))
    return model
