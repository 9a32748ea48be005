"""Gradients of a scaled loss applied never unscaled, or unscaled twice.

Issue 52's shapes *before* the fix. A `# finds: RULE` comment line marks
the line after it, which `tf-lso check` must report
(tests/migration_mixed_precision_test.py).
"""

import tensorflow as tf


# TF 2.x's protocol with the unscale left out: every step 32768 times too
# large, or skipped.
def never_unscaled(model, optimizer, x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
        scaled_loss = optimizer.get_scaled_loss(loss)
    gradients = tape.gradient(scaled_loss, model.trainable_variables)
    # finds: unscale-once
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))


# The same through a list of pairs, as many loops build it.
def never_unscaled_pairs(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    variables = model.trainable_variables
    grads = tape.gradient(scaled_loss, variables)
    grads_and_vars = [(g, v) for g, v in zip(grads, variables)
                      if g is not None]
    # finds: unscale-once
    opt.apply_gradients(grads_and_vars)


# Unscaled twice: a helper unscaled already, and the loop unscales again.
def unscaled_twice(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    grads = opt.get_unscaled_gradients(
        tape.gradient(scaled_loss, model.trainable_variables))
    # finds: unscale-once
    grads = opt.get_unscaled_gradients(grads)
    opt.apply_gradients(zip(grads, model.trainable_variables))


# TF 2.x's unscale, then Keras 3's `apply`, which unscales again.
def unscaled_then_apply(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.scale_loss(model.loss(x, y))
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    grads = opt.get_unscaled_gradients(grads)
    # finds: unscale-once
    opt.apply(grads, model.trainable_variables)


# Issue 60's shapes, as real code writes them.

# The loss scaled under a flag (as all 20 real `get_scaled_loss` call
# sites issue 60 found are), the unscale left out on the flag's path.
class FlaggedModel(tf.keras.Model):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compiled_loss(y, self(x, training=True))
            if self.mixed_precision:
                loss = self.optimizer.get_scaled_loss(loss)
        gradients = tape.gradient(loss, self.trainable_variables)
        # finds: unscale-once
        self.optimizer.apply_gradients(
            zip(gradients, self.trainable_variables))
        return {}


# A helper of the same file that returns the gradients of its argument.
def compute_gradients(tape, loss, variables):
    return tape.gradient(loss, variables)


def helper_gradients_step(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    grads = compute_gradients(tape, scaled_loss, model.trainable_variables)
    # finds: unscale-once
    opt.apply_gradients(zip(grads, model.trainable_variables))


# A helper that unscales, and the step unscales again.
def unscale(optimizer, grads):
    return optimizer.get_unscaled_gradients(grads)


def helper_unscaled_twice(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    grads = unscale(opt, tape.gradient(scaled_loss, model.trainable_variables))
    # finds: unscale-once
    grads = opt.get_unscaled_gradients(grads)
    opt.apply_gradients(zip(grads, model.trainable_variables))


# An alias of the optimizer: `opt` unscales, `self.optimizer.apply`
# (Keras 3's protocol) unscales again.
class AliasTrainer:
    def step(self, x, y):
        opt = self.optimizer
        with tf.GradientTape() as tape:
            scaled_loss = opt.scale_loss(self.model.loss(x, y))
        grads = tape.gradient(scaled_loss, self.model.trainable_variables)
        grads = opt.get_unscaled_gradients(grads)
        # finds: unscale-once
        self.optimizer.apply(grads, self.model.trainable_variables)


# An element-wise op between two unscales keeps what the gradients are.
def masked_unscaled_twice(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    grads = opt.get_unscaled_gradients(
        tape.gradient(scaled_loss, model.trainable_variables))
    grads = [tf.where(tf.math.is_finite(g), g, tf.zeros_like(g))
             for g in grads]
    # finds: unscale-once
    grads = opt.get_unscaled_gradients(grads)
    opt.apply_gradients(zip(grads, model.trainable_variables))


# Unscaled by hand, then by `get_unscaled_gradients`.
def divided_then_unscaled(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    grads = [g / opt.loss_scale for g in grads]
    # finds: unscale-once
    grads = opt.get_unscaled_gradients(grads)
    opt.apply_gradients(zip(grads, model.trainable_variables))


# `minimize` scales the loss itself: this one is scaled twice.
def minimize_scaled(model, opt, x, y):
    # finds: unscale-once
    opt.minimize(lambda: opt.get_scaled_loss(model.loss(x, y)),
                 model.trainable_variables)


# Keras 3's protocol: `scale_loss`, a division by the loss scale by hand,
# then `apply`, which unscales again.
def keras3_divided_then_applied(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.scale_loss(model.loss(x, y))
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    grads = [g / opt.loss_scale for g in grads]
    # finds: unscale-once
    opt.apply(grads, model.trainable_variables)


# Gradients accumulated into tf.Variables (andreped/GradientAccumulator's
# wrapper) and applied without unscaling.
class AccumulatingModel(tf.keras.Model):
    def __init__(self, accum_steps, **kwargs):
        super().__init__(**kwargs)
        self.accum_steps = accum_steps
        self.step = tf.Variable(0, trainable=False)
        self.accumulated = [tf.Variable(tf.zeros_like(v), trainable=False)
                            for v in self.trainable_variables]

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compiled_loss(y, self(x, training=True))
            scaled_loss = self.optimizer.get_scaled_loss(loss)
        gradients = tape.gradient(scaled_loss, self.trainable_variables)
        for i in range(len(self.accumulated)):
            self.accumulated[i].assign_add(
                gradients[i] / tf.cast(self.accum_steps, tf.float32))
        self.step.assign_add(1)
        tf.cond(tf.equal(self.step, self.accum_steps),
                self.apply_accumulated, lambda: None)
        return {}

    def apply_accumulated(self):
        # finds: unscale-once
        self.optimizer.apply_gradients(
            zip(self.accumulated, self.trainable_variables))
        self.step.assign(0)
        for i in range(len(self.accumulated)):
            self.accumulated[i].assign(tf.zeros_like(self.accumulated[i]))
