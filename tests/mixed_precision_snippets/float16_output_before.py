"""A float16 model output that a loss reads, under `mixed_float16`.

TensorFlow's mixed precision guide: keep the model's last activation in
float32. Issue 52's and issue 60's shapes *before* the fix. A
`# finds: RULE` comment line marks the line after it, which `tf-lso check`
must report (tests/migration_mixed_precision_test.py).
"""

import keras
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


def binary_classifier():
    inputs = tf.keras.Input(shape=(16,))
    hidden = layers.Dense(64, activation="relu")(inputs)
    # finds: float16-output
    return tf.keras.Model(inputs, layers.Dense(1, activation="sigmoid")(hidden))


# tensorflow/models PR #6309 (ResNet-50): `x` reassigned layer by layer.
def resnet_head(img_input, x, num_classes):
    x = layers.GlobalAveragePooling2D()(x)
    # finds: float16-output
    x = layers.Dense(num_classes, activation="softmax", name="fc1000")(x)
    return tf.keras.Model(img_input, x, name="resnet50")


# larq/zoo PR #135 (QuickNet, BiRealNet, BinaryAlexNet): the output
# reassigned under `if include_top:`.
def quicknet(input_tensor, x, num_classes, include_top=True):
    if include_top:
        x = layers.GlobalAvgPool2D()(x)
        # finds: float16-output
        x = layers.Dense(num_classes, activation="softmax")(x)
    return tf.keras.Model(inputs=input_tensor, outputs=x)


# Layers added one by one.
def added_classifier():
    model = tf.keras.Sequential()
    model.add(layers.Dense(128, activation="relu", input_shape=(784,)))
    # finds: float16-output
    model.add(layers.Dense(10, activation="softmax"))
    model.compile(loss="sparse_categorical_crossentropy", optimizer="adam")
    return model


# A subclassed model whose `call` returns a float16 softmax.
class Classifier(keras.Model):
    def __init__(self, num_classes):
        super().__init__()
        self.hidden = layers.Dense(64, activation="relu")
        self.logits = layers.Dense(num_classes)

    def call(self, inputs):
        # finds: float16-output
        return tf.nn.softmax(self.logits(self.hidden(inputs)))


# horovod's elastic TF2 MNIST example: its input is cast to float32, and
# its output stays a float16 softmax, which the loss reads.
(images, labels), _ = tf.keras.datasets.mnist.load_data()
dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(images / 255.0, tf.float32), tf.cast(labels, tf.int64)))
mnist_model = tf.keras.Sequential([
    layers.Conv2D(32, [3, 3], activation="relu"),
    layers.Flatten(),
    # finds: float16-output
    layers.Dense(10, activation="softmax"),
])
loss = tf.losses.SparseCategoricalCrossentropy()


@tf.function
def training_step(images, labels):
    with tf.GradientTape() as tape:
        probs = mnist_model(images, training=True)
        loss_value = loss(labels, probs)
    return tape.gradient(loss_value, mnist_model.trainable_variables)


# Where the models meet a loss.
model = classifier(10)
model.compile(loss="sparse_categorical_crossentropy", optimizer="adam")
functional = functional_classifier(10)
functional.compile("adam", "sparse_categorical_crossentropy")
binary = binary_classifier()
binary.fit(images, labels)
resnet = resnet_head(tf.keras.Input((224, 224, 3)), None, 1000)
resnet.compile(optimizer="sgd", loss="categorical_crossentropy")
quick = quicknet(tf.keras.Input((224, 224, 3)), None, 1000)
quick.compile(optimizer="adam", loss="categorical_crossentropy")
subclassed = Classifier(10)
subclassed.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
