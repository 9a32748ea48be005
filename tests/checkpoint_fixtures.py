"""Writes the checkpoint layouts tf_lso restores, with the real libraries.

Nothing here is hand-edited: each layout is produced by the code that
produced it historically (tf_keras's LossScaleOptimizer for TF 2.3/2.4,
Keras 3's LossScaleOptimizer) or, for TF 2.2, by an object graph with the
same dependencies as TF 2.2's LossScaleOptimizer (`base_optimizer` and
`loss_scale` children, slots recorded on the base optimizer).
"""

import keras
import numpy as np
import tensorflow as tf

from test_util import tf_keras

X = tf.constant([[1.0, 2.0], [3.0, -1.0]])
Y = tf.constant([[1.0], [0.5]])


class Linear(tf.Module):
    """Two plain tf.Variables. Both are named "Variable" on purpose."""

    def __init__(self):
        super().__init__()
        self.w = tf.Variable([[0.5], [-0.25]])
        self.b = tf.Variable([0.1])

    def loss(self, factor):
        prediction = tf.matmul(X, self.w) + self.b
        return tf.reduce_mean(tf.square(prediction - Y)) * factor


def _step(model, opt, factor):
    keras3_lso = type(opt) is keras.optimizers.LossScaleOptimizer
    legacy_protocol = hasattr(opt, "get_scaled_loss")
    variables = list(model.trainable_variables)
    with tf.GradientTape() as tape:
        loss = model.loss(factor)
        if legacy_protocol:
            loss = opt.get_scaled_loss(loss)
        elif keras3_lso:
            loss = opt.scale_loss(loss)
    grads = tape.gradient(loss, variables)
    if legacy_protocol:
        grads = opt.get_unscaled_gradients(grads)
    opt.apply_gradients(zip(grads, variables))


def train(model, opt, factors=(1.0,), use_tf_function=False, strategy=None):
    """One optimizer step per factor (inf makes the step overflow)."""
    strategy = strategy or tf.distribute.get_strategy()

    def step(factor):
        strategy.run(_step, args=(model, opt, factor))

    step = tf.function(step) if use_tf_function else step
    for factor in factors:
        step(tf.constant(factor, tf.float32))


def tf_keras_lso(inner, initial_scale=None, growth_steps=None):
    kwargs = {}
    if initial_scale is not None:
        kwargs["initial_scale"] = initial_scale
    if growth_steps is not None:
        kwargs["dynamic_growth_steps"] = growth_steps
    return tf_keras.mixed_precision.LossScaleOptimizer(inner, **kwargs)


def train_and_save(directory, opt, factors=(1.0, 1.0, np.inf)):
    """Trains a new `Linear` with `opt`; returns it and the checkpoint path."""
    model = Linear()
    train(model, opt, factors)
    path = tf.train.Checkpoint(model=model, optimizer=opt).save(
        directory + "/ckpt"
    )
    return model, path


def tf2_2_checkpoint(directory):
    """A checkpoint in TF 2.2's LossScaleOptimizer layout.

    Returns:
        (model, base optimizer, path); the loss scale is 32768 with a counter
        of 1, as in TF's own `lso_ckpt_tf2.2` test checkpoint.
    """
    model = Linear()
    base = tf_keras.optimizers.legacy.SGD(0.1, momentum=0.9)
    train(model, base)
    loss_scale = tf.Module()
    loss_scale.current_loss_scale = tf.Variable(32768.0)
    loss_scale.good_steps = tf.Variable(1, dtype=tf.int64)
    optimizer = tf.Module()
    optimizer.base_optimizer = base
    optimizer.loss_scale = loss_scale
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(
        directory + "/ckpt"
    )
    return model, base, path


# (Keras 3 class name, TF 2.x slot name) -> Keras 3 per-variable list.
_KERAS3_SLOT_LISTS = {
    ("SGD", "momentum"): "momentums",
    ("Adam", "m"): "_momentums",
    ("Adam", "v"): "_velocities",
    ("Adam", "vhat"): "_velocity_hats",
    ("RMSprop", "rms"): "_velocities",
    ("RMSprop", "momentum"): "_momentums",
    ("RMSprop", "mg"): "_average_gradients",
}


def keras3_slot(optimizer, variable, legacy_name):
    """A Keras 3 optimizer's value for TF 2.x slot `legacy_name`, by index."""
    slots = getattr(
        optimizer, _KERAS3_SLOT_LISTS[type(optimizer).__name__, legacy_name]
    )
    return slots[optimizer._get_variable_index(variable)].numpy()


def build(optimizer, variables):
    """Creates an optimizer's slots without a step."""
    if isinstance(optimizer, keras.optimizers.Optimizer):
        optimizer.build(variables)
    else:  # A tf_keras legacy optimizer.
        optimizer._create_all_weights(variables)
