"""TF 2.1-2.3 style: log opt.loss_scale() and checkpoint with tf.train.Checkpoint.

Trains, checkpoints every 20 steps, provokes an overflow now and then, then
restores the last checkpoint into fresh objects. Legacy code, run with
`python -m tf_lso run examples/legacy/checkpoint_loop.py`. It logs with
`tf.summary`, which needs TensorBoard on TensorFlow 2.16+
(`pip install tensorboard`, or `pip install "tf_lso[examples]"`).
"""

import os
import random
import sys
import tempfile

import numpy as np
import tensorflow as tf

try:
    import tensorboard  # noqa: F401 - what tf.summary needs on TF 2.16+.
except ImportError:
    sys.exit('This example logs with tf.summary, which needs TensorBoard on '
             'TensorFlow 2.16+: pip install tensorboard '
             '(or pip install "tf_lso[examples]").')

random.seed(0)
np.random.seed(0)
tf.random.set_seed(0)

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 45
checkpoint_dir = tempfile.mkdtemp()


def make_model_and_optimizer():
    model = tf.keras.Sequential([
        tf.keras.layers.Dense(16, activation='relu', input_shape=(4,)),
        tf.keras.layers.Dense(1),
    ])
    loss_scale = tf.train.experimental.DynamicLossScale(
        initial_loss_scale=2 ** 12, increment_period=10, multiplier=2.)
    opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
        tf.keras.optimizers.Adam(1e-2), loss_scale)
    return model, opt


model, opt = make_model_and_optimizer()
checkpoint = tf.train.Checkpoint(model=model, optimizer=opt)
manager = tf.train.CheckpointManager(checkpoint, checkpoint_dir, max_to_keep=2)
summary_writer = tf.summary.create_file_writer(
    os.path.join(checkpoint_dir, 'logs'))


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
        scaled_loss = opt.get_scaled_loss(loss)
    grads = opt.get_unscaled_gradients(
        tape.gradient(scaled_loss, model.trainable_variables))
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


for step in range(1, STEPS + 1):
    x = np.random.normal(size=(32, 4)).astype('float32')
    y = x.sum(axis=1, keepdims=True)
    if step % 15 == 0:
        with np.errstate(over='ignore'):
            y = y * 1e38  # the gradients overflow: this step is skipped
    loss = train_step(x, y)
    with summary_writer.as_default():
        tf.summary.scalar('loss_scale', opt.loss_scale(), step=step)
    if step % 20 == 0:
        print('step %d: loss scale %d, iterations %d'
              % (step, opt.loss_scale(), opt.iterations))
        manager.save()

restored_model, restored_opt = make_model_and_optimizer()
# Keras 3 optimizers create their slots when built: building before the
# restore fills them now (else they wait for the first step, and deleting the
# objects before one warns about "Value in checkpoint could not be found").
restored_opt.build(restored_model.trainable_variables)
tf.train.Checkpoint(model=restored_model, optimizer=restored_opt).restore(
    manager.latest_checkpoint).assert_consumed()
print('restored loss scale %d' % restored_opt.loss_scale())
print('result loss_scale', float(opt.loss_scale()))
print('result restored_loss_scale', float(restored_opt.loss_scale()))
print('result restored_iterations', int(restored_opt.iterations))
print('result weights', [float(np.sum(w)) for w in model.get_weights()])
