"""float16_output_before.py *after* the fix: the last layer, or an extra
last activation, in float32; and float16 outputs that no loss reads.
`tf-lso check` reports nothing here."""

import keras
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


def binary_classifier():
    inputs = tf.keras.Input(shape=(16,))
    hidden = layers.Dense(64, activation="relu")(inputs)
    return tf.keras.Model(inputs, layers.Dense(1, activation="sigmoid",
                                               dtype="float32")(hidden))


def regressor():
    # A float16 linear output: Keras 3's losses read it in float32.
    inputs = tf.keras.Input(shape=(16,))
    hidden = layers.Dense(64, activation="relu")(inputs)
    return tf.keras.Model(inputs, layers.Dense(1)(hidden))


def resnet_head(img_input, x, num_classes):
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(num_classes, name="fc1000")(x)
    x = layers.Activation("softmax", dtype="float32")(x)
    return tf.keras.Model(img_input, x, name="resnet50")


def quicknet(input_tensor, x, num_classes, include_top=True):
    if include_top:
        x = layers.GlobalAvgPool2D()(x)
        x = layers.Dense(num_classes)(x)
        x = layers.Activation("softmax", dtype="float32")(x)
    return tf.keras.Model(inputs=input_tensor, outputs=x)


def added_classifier():
    model = tf.keras.Sequential()
    model.add(layers.Dense(128, activation="relu", input_shape=(784,)))
    model.add(layers.Dense(10))
    model.add(layers.Activation("softmax", dtype="float32"))
    model.compile(loss="sparse_categorical_crossentropy", optimizer="adam")
    return model


class Classifier(keras.Model):
    def __init__(self, num_classes):
        super().__init__()
        self.hidden = layers.Dense(64, activation="relu")
        self.logits = layers.Dense(num_classes)

    def call(self, inputs):
        logits = self.logits(self.hidden(inputs))
        return tf.nn.softmax(tf.cast(logits, tf.float32))


(images, labels), _ = tf.keras.datasets.mnist.load_data()
dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(images / 255.0, tf.float32), tf.cast(labels, tf.int64)))
mnist_model = tf.keras.Sequential([
    layers.Conv2D(32, [3, 3], activation="relu"),
    layers.Flatten(),
    layers.Dense(10, activation="softmax", dtype="float32"),
])
loss = tf.losses.SparseCategoricalCrossentropy()


@tf.function
def training_step(images, labels):
    with tf.GradientTape() as tape:
        probs = mnist_model(images, training=True)
        loss_value = loss(labels, probs)
    return tape.gradient(loss_value, mnist_model.trainable_variables)


def cast_by_hand():
    # What a Lambda returns is up to its code.
    return tf.keras.Sequential([
        layers.Dense(4, input_shape=(2,)),
        layers.Lambda(lambda t: tf.cast(t, tf.float32)),
    ])


# Not the output a loss reads: an encoder whose output feeds a float32
# head, and a GAN generator, whose output the discriminator reads.
def encoder_and_head():
    inputs = tf.keras.Input(shape=(784,))
    encoder = tf.keras.Model(inputs, layers.Dense(64)(inputs))
    features = encoder(inputs)
    outputs = layers.Dense(10, activation="softmax", dtype="float32")(features)
    model = tf.keras.Model(inputs, outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


generator = tf.keras.Sequential([
    layers.Dense(256, activation="relu", input_shape=(100,)),
    layers.Dense(784, activation="tanh"),
])
discriminator = tf.keras.Sequential([
    layers.Dense(256, activation="relu", input_shape=(784,)),
    layers.Dense(1, dtype="float32"),
])
cross_entropy = tf.keras.losses.BinaryCrossentropy(from_logits=True)


def generator_loss(noise):
    fake = generator(noise, training=True)
    fake_output = discriminator(fake, training=True)
    return cross_entropy(tf.ones_like(fake_output), fake_output)


# A float16 output cast to float32 where the loss reads it.
scorer = tf.keras.Sequential([layers.Dense(10, input_shape=(4,))])


def scored_loss(x, y):
    scores = scorer(x)
    return loss(y, tf.cast(scores, tf.float32))


model = classifier(10)
model.compile(loss="sparse_categorical_crossentropy", optimizer="adam")
functional = functional_classifier(10)
functional.compile("adam", "sparse_categorical_crossentropy")
binary = binary_classifier()
binary.fit(images, labels)
regression = regressor()
regression.fit(images, labels)
resnet = resnet_head(tf.keras.Input((224, 224, 3)), None, 1000)
resnet.compile(optimizer="sgd", loss="categorical_crossentropy")
quick = quicknet(tf.keras.Input((224, 224, 3)), None, 1000)
quick.compile(optimizer="adam", loss="categorical_crossentropy")
subclassed = Classifier(10)
subclassed.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
lambda_model = cast_by_hand()
lambda_model.compile(optimizer="adam", loss="mse")
