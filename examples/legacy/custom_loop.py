"""TF 2.1-2.3 style: a custom GradientTape loop with a loss scale optimizer.

Unmodified legacy code. Run it on current TensorFlow with
`python -m tf_lso run examples/legacy/custom_loop.py`.
"""

import random
import sys

import numpy as np
import tensorflow as tf

random.seed(0)
np.random.seed(0)
tf.random.set_seed(0)

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 60

policy = tf.keras.mixed_precision.experimental.Policy('mixed_float16')
tf.keras.mixed_precision.experimental.set_policy(policy)

model = tf.keras.Sequential([
    tf.keras.layers.Dense(64, activation='relu', input_shape=(16,)),
    tf.keras.layers.Dense(64, activation='relu'),
    tf.keras.layers.Dense(1),
    tf.keras.layers.Activation('linear', dtype='float32'),
])
optimizer = tf.keras.optimizers.SGD(learning_rate=0.01)
optimizer = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
    optimizer, loss_scale='dynamic')

x_train = np.random.normal(size=(512, 16)).astype('float32')
y_train = x_train.sum(axis=1, keepdims=True) / 4.0
dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(32)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        predictions = model(x)
        loss = tf.reduce_mean(tf.square(predictions - y))
        scaled_loss = optimizer.get_scaled_loss(loss)
    scaled_gradients = tape.gradient(scaled_loss, model.trainable_variables)
    gradients = optimizer.get_unscaled_gradients(scaled_gradients)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return loss


step = 0
while step < STEPS:
    for x, y in dataset:
        loss = train_step(x, y)
        step += 1
        if step % 50 == 0:
            print('step %d: loss %.4f, loss scale %d'
                  % (step, loss, optimizer.loss_scale()))
        if step == STEPS:
            break

print('result loss_scale', float(optimizer.loss_scale()))
print('result weights', [float(np.sum(w)) for w in model.get_weights()])
