"""TF 2.2-2.4 style: a MirroredStrategy custom loop with loss scaling.

Unmodified legacy code. Run it on current TensorFlow with
`python -m tf_lso run examples/legacy/mirrored_loop.py`.
"""

import random
import sys

import numpy as np
import tensorflow as tf

random.seed(0)
np.random.seed(0)
tf.random.set_seed(0)

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 50
GLOBAL_BATCH_SIZE = 64

strategy = tf.distribute.MirroredStrategy()
print('Number of devices: %d' % strategy.num_replicas_in_sync)

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Dense(32, activation='tanh', input_shape=(8,)),
        tf.keras.layers.Dense(1),
    ])
    loss_scale = tf.mixed_precision.experimental.DynamicLossScale(
        initial_loss_scale=2 ** 10, increment_period=20)
    optimizer = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
        tf.keras.optimizers.Adam(1e-3), loss_scale)

x_train = np.random.normal(size=(GLOBAL_BATCH_SIZE * 8, 8)).astype('float32')
y_train = np.sin(x_train.sum(axis=1, keepdims=True))
dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).repeat()
dataset = dataset.batch(GLOBAL_BATCH_SIZE)
dist_dataset = strategy.experimental_distribute_dataset(dataset)


def step_fn(inputs):
    x, y = inputs
    with tf.GradientTape() as tape:
        per_example_loss = tf.reduce_sum(tf.square(model(x) - y), axis=1)
        loss = tf.nn.compute_average_loss(
            per_example_loss, global_batch_size=GLOBAL_BATCH_SIZE)
        scaled_loss = optimizer.get_scaled_loss(loss)
    scaled_grads = tape.gradient(scaled_loss, model.trainable_variables)
    grads = optimizer.get_unscaled_gradients(scaled_grads)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


@tf.function
def distributed_train_step(dist_inputs):
    per_replica_losses = strategy.run(step_fn, args=(dist_inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses,
                           axis=None)


iterator = iter(dist_dataset)
for step in range(1, STEPS + 1):
    loss = distributed_train_step(next(iterator))
    if step % 25 == 0:
        print('step %d: loss %.4f, loss scale %d'
              % (step, loss, loss_scale()))

print('result loss_scale', float(loss_scale()))
print('result weights', [float(np.sum(w)) for w in model.get_weights()])
