"""The same steps as clip_before_unscale_before.py, *after* the fixes.

Unscale first, then clip or log (google/automl's EfficientDet order); with
Keras 3's protocol, clip on the inner optimizer. `tf-lso check` reports
nothing here.
"""

import tensorflow as tf
import wandb
from gradient_accumulator import agc
from mylib import clipping


def returnn_step(model, opt, x, y, loss_fn):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x))
        scaled_loss = opt.get_scaled_loss(loss)
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    grads = opt.get_unscaled_gradients(grads)
    grads, _ = tf.clip_by_global_norm(grads, 5.0)
    opt.apply_gradients(zip(grads, model.trainable_variables))


def miles_credit_step(model, optimizer, batch, max_norm):
    with tf.GradientTape() as tape:
        scaled = optimizer.get_scaled_loss(model.loss(batch))
    scaled_grads = tape.gradient(scaled, model.trainable_variables)
    grads = optimizer.get_unscaled_gradients(scaled_grads)
    clipped = [tf.clip_by_norm(g, max_norm) for g in grads]
    optimizer.apply_gradients(zip(clipped, model.trainable_variables))


def unet_step(net, opt, images, masks, criterion, clip_value=1.0):
    with tf.GradientTape() as tape:
        loss = criterion(masks, net(images))
        scaled_loss = opt.get_scaled_loss(loss)
    grads = opt.get_unscaled_gradients(
        tape.gradient(scaled_loss, net.trainable_variables))
    pairs = [(tf.clip_by_value(g, -clip_value, clip_value), v)
             for g, v in zip(grads, net.trainable_variables)]
    opt.apply_gradients(pairs)


def everydream_step(unet, optimizer, batch):
    # The clip is the inner optimizer's (`global_clipnorm=1.0`), which
    # sees unscaled gradients.
    with tf.GradientTape() as tape:
        loss = unet.compute_loss(batch)
        scaled_loss = optimizer.scale_loss(loss)
    grads = tape.gradient(scaled_loss, unet.trainable_variables)
    optimizer.apply(grads, unet.trainable_variables)


def languini_step(model, opt, x, y, step):
    with tf.GradientTape() as tape:
        loss = model.loss(x, y)
        scaled_loss = opt.get_scaled_loss(loss)
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    grads = opt.get_unscaled_gradients(grads)
    tf.summary.scalar("grad_norm", tf.linalg.global_norm(grads), step=step)
    opt.apply_gradients(zip(grads, model.trainable_variables))


def logged_gradients_step(model, opt, x, y, step):
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    grads = opt.get_unscaled_gradients(
        tape.gradient(scaled_loss, model.trainable_variables))
    for grad, var in zip(grads, model.trainable_variables):
        tf.summary.histogram(var.name, grad, step=step)
    wandb.log({"grad_norm": tf.linalg.global_norm(grads)})
    opt.apply_gradients(zip(grads, model.trainable_variables))


def scaled_clip_norm_step(model, opt, x, y):
    # Clipping the scaled gradients to a norm scaled the same way is right.
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    grads, _ = tf.clip_by_global_norm(grads, 1.0 * opt.loss_scale)
    grads = opt.get_unscaled_gradients(grads)
    tf.print("scaled gradient norm:", tf.linalg.global_norm(grads) * opt.loss_scale)
    opt.apply_gradients(zip(grads, model.trainable_variables))


def conditional_scaling_step(model, opt, x, y, mixed):
    # Scaled and unscaled under the same test: on the path where the loss
    # is scaled, the gradients are unscaled before the clip; on the other
    # they were never scaled.
    with tf.GradientTape() as tape:
        loss = model.loss(x, y)
        if mixed:
            loss = opt.get_scaled_loss(loss)
    grads = tape.gradient(loss, model.trainable_variables)
    if mixed:
        grads = opt.get_unscaled_gradients(grads)
    grads, _ = tf.clip_by_global_norm(grads, 1.0)
    opt.apply_gradients(zip(grads, model.trainable_variables))


class GAModelWrapper(tf.keras.Model):
    # The GradientAccumulator fix: unscale, then clip.
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compiled_loss(y, y_pred)
            if self.mixed_precision:
                loss = self.optimizer.get_scaled_loss(loss)
        gradients = tape.gradient(loss, self.trainable_variables)
        if self.mixed_precision:
            gradients = self.optimizer.get_unscaled_gradients(gradients)
        if self.use_agc:
            gradients = agc.adaptive_clip_grad(
                self.trainable_variables, gradients,
                clip_factor=self.clip_factor, eps=self.eps)
        self.optimizer.apply_gradients(
            zip(gradients, self.trainable_variables))


def ternary_step(model, opt, x, y, fp16, step):
    with tf.GradientTape() as tape:
        loss = model.loss(x, y)
        scaled_loss = opt.get_scaled_loss(loss) if fp16 else loss
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    if fp16:
        grads = opt.get_unscaled_gradients(grads)
    tf.summary.scalar("grad_norm", tf.linalg.global_norm(grads), step=step)
    opt.apply_gradients(zip(grads, model.trainable_variables))


def clip_gradients(grads, max_norm):
    clipped, _ = tf.clip_by_global_norm(grads, max_norm)
    return clipped


def helper_clip_step(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    grads = opt.get_unscaled_gradients(grads)
    grads = clip_gradients(grads, 1.0)
    opt.apply_gradients(zip(grads, model.trainable_variables))


class HelperTrainer:
    def gradients(self, tape, loss):
        return tape.gradient(loss, self.model.trainable_variables)

    def step(self, x, y):
        with tf.GradientTape() as tape:
            scaled_loss = self.optimizer.get_scaled_loss(self.model.loss(x, y))
        grads = self.gradients(tape, scaled_loss)
        grads = self.optimizer.get_unscaled_gradients(grads)
        grads = [tf.where(tf.math.is_finite(g), g, tf.zeros_like(g))
                 for g in grads]
        grads = [tf.clip_by_norm(g, 5.0) for g in grads]
        self.optimizer.apply_gradients(
            zip(grads, self.model.trainable_variables))


def named_clip_step(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    grads = clipping.clip_gradients_by_norm(
        opt.get_unscaled_gradients(grads), 1.0)
    opt.apply_gradients(zip(grads, model.trainable_variables))
