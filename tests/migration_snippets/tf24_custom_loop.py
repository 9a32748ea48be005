"""TF 2.4 style: the non-experimental LossScaleOptimizer in a custom loop.

Written for tests/migration_fix_test.py: it runs under `python -m tf_lso run`
as is, and as plain Python after `python -m tf_lso check --fix --write`.
"""

import random
import sys

import numpy as np
import tensorflow as tf
# The TF 2.4 names, as its mixed precision guide imported them.
from tensorflow.keras.mixed_precision import LossScaleOptimizer, set_global_policy

random.seed(0)
np.random.seed(0)
tf.random.set_seed(0)
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 30

set_global_policy('mixed_float16')
model = tf.keras.Sequential([
    tf.keras.layers.Dense(8, activation='relu', input_shape=(4,)),
    tf.keras.layers.Dense(1, dtype='float32'),
])
opt = LossScaleOptimizer(tf.keras.optimizers.SGD(0.01), dynamic=True,
                         initial_scale=2 ** 14,  # small on purpose
                         dynamic_growth_steps=5)
x = np.random.normal(size=(64, 4)).astype('float32')
y = x.sum(axis=1, keepdims=True)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
        scaled_loss = opt.get_scaled_loss(loss)
    scaled_grads = tape.gradient(scaled_loss, model.trainable_variables)
    grads = opt.get_unscaled_gradients(scaled_grads)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


for step in range(STEPS):
    # Every tenth batch has targets that overflow float16 gradients.
    loss = train_step(x, y * (1e5 if step % 10 == 9 else 1.0))
print('result loss_scale', float(opt.loss_scale))
print('result iterations', int(opt.iterations.numpy()))
print('result weights', [float(np.sum(w)) for w in model.get_weights()])
