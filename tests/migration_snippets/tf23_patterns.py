"""TF 2.1-2.3 style code with every pattern `check` knows (not runnable)."""

import re

import tensorflow as tf
from tensorflow.keras import mixed_precision
from tensorflow.python.training.experimental.loss_scale import FixedLossScale

policy = mixed_precision.experimental.Policy('mixed_float16', loss_scale=128)
mixed_precision.experimental.set_policy(policy)
strategy = tf.distribute.MirroredStrategy()


class ClippedSGD(tf.keras.optimizers.Optimizer):
    """An OptimizerV2 subclass, as TF 2.x code wrote them."""

    def __init__(self, learning_rate=0.01, name='ClippedSGD', **kwargs):
        super().__init__(name, **kwargs)
        self._set_hyper('learning_rate', learning_rate)

    def _resource_apply_dense(self, grad, var, apply_state=None):
        lr = self._decayed_lr(var.dtype.base_dtype)
        return var.assign_sub(lr * tf.clip_by_value(grad, -1.0, 1.0))


with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(
        ClippedSGD(), loss_scale=FixedLossScale(128))
tf.train.experimental.enable_mixed_precision_graph_rewrite(
    tf.keras.optimizers.SGD())


def step(x, y):
    with tf.GradientTape() as tape:
        outputs = model(x)
        if outputs.dtype.name == 'float16':
            outputs = tf.cast(outputs, 'float32')
        loss = opt.get_scaled_loss(tf.reduce_mean(tf.square(outputs - y)))
    grads = opt.get_unscaled_gradients(tape.gradient(loss, model.weights))
    opt.apply_gradients(zip(grads, model.weights),
                        experimental_aggregate_gradients=False)
    return loss


strategy.experimental_run_v2(step, args=(tf.ones([8, 4]), tf.ones([8, 1])))
kernels = [v for v in model.weights if re.search('kernel:0', v.name)]
print(opt.loss_scale(), opt.learning_rate(opt.iterations))
print(opt._optimizer, opt._loss_scale, opt.get_gradients(loss=None, params=[]))
