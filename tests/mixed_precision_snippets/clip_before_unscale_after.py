"""The same steps as clip_before_unscale_before.py, *after* the fixes.

Unscale first, then clip or log (google/automl's EfficientDet order); with
Keras 3's protocol, clip on the inner optimizer. `tf-lso check` reports
nothing here.
"""

import tensorflow as tf
import wandb


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
    # Scaled and unscaled on the same condition: sure on neither path.
    with tf.GradientTape() as tape:
        loss = model.loss(x, y)
        if mixed:
            loss = opt.get_scaled_loss(loss)
    grads = tape.gradient(loss, model.trainable_variables)
    if mixed:
        grads = opt.get_unscaled_gradients(grads)
    grads, _ = tf.clip_by_global_norm(grads, 1.0)
    opt.apply_gradients(zip(grads, model.trainable_variables))
