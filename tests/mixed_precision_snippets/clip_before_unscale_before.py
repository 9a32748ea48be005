"""Gradients clipped, normed or logged before they are unscaled.

The shapes of the fixes issue 52 cites, rewritten in TF 2.x / Keras 3
terms, as they were *before* the fix. A `# finds: RULE` comment line marks
the line after it, which `tf-lso check` must report
(tests/migration_mixed_precision_test.py).
"""

import tensorflow as tf
import wandb
from gradient_accumulator import agc
from mylib import clipping


# rwth-i6/returnn PR #1595: the global norm clip ran on the scaled
# gradients, before the unscale.
def returnn_step(model, opt, x, y, loss_fn):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x))
        scaled_loss = opt.get_scaled_loss(loss)
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    # finds: clip-before-unscale
    grads, _ = tf.clip_by_global_norm(grads, 5.0)
    grads = opt.get_unscaled_gradients(grads)
    opt.apply_gradients(zip(grads, model.trainable_variables))


# NCAR/miles-credit PR #141: a per-tensor norm clip over the scaled
# gradients, in a comprehension.
def miles_credit_step(model, optimizer, batch, max_norm):
    with tf.GradientTape() as tape:
        scaled = optimizer.get_scaled_loss(model.loss(batch))
    scaled_grads = tape.gradient(scaled, model.trainable_variables)
    # finds: clip-before-unscale
    clipped = [tf.clip_by_norm(g, max_norm)
               for g in scaled_grads]
    optimizer.apply_gradients(
        zip(optimizer.get_unscaled_gradients(clipped),
            model.trainable_variables))


# milesial/Pytorch-UNet issue #468 / PR #470: value clipping of the scaled
# gradients, pairs built with zip.
def unet_step(net, opt, images, masks, criterion, clip_value=1.0):
    with tf.GradientTape() as tape:
        loss = criterion(masks, net(images))
        scaled_loss = opt.get_scaled_loss(loss)
    pairs = zip(tape.gradient(scaled_loss, net.trainable_variables),
                net.trainable_variables)
    # finds: clip-before-unscale
    pairs = [(tf.clip_by_value(g, -clip_value, clip_value), v)
             for g, v in pairs]
    grads = opt.get_unscaled_gradients([g for g, _ in pairs])
    opt.apply_gradients(zip(grads, net.trainable_variables))


# victorchall/EveryDream2trainer PR #175 ("you have to pass values like
# 1e5 ... rather than the expected 1.0"): Keras 3's protocol, where
# `apply` unscales inside, after the clip.
def everydream_step(unet, optimizer, batch, clip_grad_norm=1.0):
    with tf.GradientTape() as tape:
        loss = unet.compute_loss(batch)
        scaled_loss = optimizer.scale_loss(loss)
    grads = tape.gradient(scaled_loss, unet.trainable_variables)
    if clip_grad_norm is not None:
        # finds: clip-before-unscale
        grads, _ = tf.clip_by_global_norm(grads, clip_grad_norm)
    optimizer.apply(grads, unet.trainable_variables)


# languini-kitchen PR #7 (unscale before logging): the gradient norm was
# logged from the scaled gradients.
def languini_step(model, opt, x, y, step):
    with tf.GradientTape() as tape:
        loss = model.loss(x, y)
        scaled_loss = opt.get_scaled_loss(loss)
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    grad_norm = tf.linalg.global_norm(grads)
    # finds: clip-before-unscale
    tf.summary.scalar("grad_norm", grad_norm, step=step)
    grads = opt.get_unscaled_gradients(grads)
    opt.apply_gradients(zip(grads, model.trainable_variables))


# wandb issues #4369 and #9092, Lightning issue #11407: scaled gradients
# logged as histograms and norms ("an hour lost thinking clipping was
# broken").
def logged_gradients_step(model, opt, x, y, step):
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    for grad, var in zip(grads, model.trainable_variables):
        # finds: clip-before-unscale
        tf.summary.histogram(var.name, grad, step=step)
    # finds: clip-before-unscale
    wandb.log({"grad_norm": tf.linalg.global_norm(grads)})
    opt.apply_gradients(zip(opt.get_unscaled_gradients(grads),
                            model.trainable_variables))


# Issue 60's shapes, as real code writes them.

# andreped/GradientAccumulator issue #19: the loss is scaled under a flag,
# adaptive gradient clipping (a function of another module) runs on the
# scaled gradients, and the unscale comes after, under the same flag.
class GAModelWrapper(tf.keras.Model):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compiled_loss(y, y_pred)
            if self.mixed_precision:
                loss = self.optimizer.get_scaled_loss(loss)
        gradients = tape.gradient(loss, self.trainable_variables)
        if self.use_agc:
            # finds: clip-before-unscale
            gradients = agc.adaptive_clip_grad(
                self.trainable_variables, gradients,
                clip_factor=self.clip_factor, eps=self.eps)
        if self.mixed_precision:
            gradients = self.optimizer.get_unscaled_gradients(gradients)
        self.optimizer.apply_gradients(
            zip(gradients, self.trainable_variables))


# The same with a conditional expression.
def ternary_step(model, opt, x, y, fp16, step):
    with tf.GradientTape() as tape:
        loss = model.loss(x, y)
        scaled_loss = opt.get_scaled_loss(loss) if fp16 else loss
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    # finds: clip-before-unscale
    tf.summary.scalar("grad_norm", tf.linalg.global_norm(grads), step=step)
    if fp16:
        grads = opt.get_unscaled_gradients(grads)
    opt.apply_gradients(zip(grads, model.trainable_variables))


# A helper of the same file that clips its argument.
def clip_gradients(grads, max_norm):
    clipped, _ = tf.clip_by_global_norm(grads, max_norm)
    return clipped


def helper_clip_step(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    # finds: clip-before-unscale
    grads = clip_gradients(grads, 1.0)
    grads = opt.get_unscaled_gradients(grads)
    opt.apply_gradients(zip(grads, model.trainable_variables))


# A method of the same class that returns the gradients of its (scaled)
# argument, then an element-wise op, then the clip.
class HelperTrainer:
    def gradients(self, tape, loss):
        return tape.gradient(loss, self.model.trainable_variables)

    def step(self, x, y):
        with tf.GradientTape() as tape:
            scaled_loss = self.optimizer.get_scaled_loss(self.model.loss(x, y))
        grads = self.gradients(tape, scaled_loss)
        grads = [tf.where(tf.math.is_finite(g), g, tf.zeros_like(g))
                 for g in grads]
        # finds: clip-before-unscale
        grads = [tf.clip_by_norm(g, 5.0) for g in grads]
        grads = self.optimizer.get_unscaled_gradients(grads)
        self.optimizer.apply_gradients(
            zip(grads, self.model.trainable_variables))


# A function of another module whose name says it clips.
def named_clip_step(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    # finds: clip-before-unscale
    grads = clipping.clip_gradients_by_norm(grads, 1.0)
    opt.apply_gradients(zip(opt.get_unscaled_gradients(grads),
                            model.trainable_variables))
