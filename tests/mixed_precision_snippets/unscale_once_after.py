"""The steps of unscale_once_before.py, *after* the fixes, and the other
right orders. `tf-lso check` reports nothing here."""

import tensorflow as tf


def tf2_protocol(model, optimizer, x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
        scaled_loss = optimizer.get_scaled_loss(loss)
    scaled_gradients = tape.gradient(scaled_loss, model.trainable_variables)
    gradients = optimizer.get_unscaled_gradients(scaled_gradients)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))


def tf2_protocol_pairs(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    variables = model.trainable_variables
    grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, variables))
    opt.apply_gradients([(g, v) for g, v in zip(grads, variables)
                         if g is not None])


def keras3_protocol(model, opt, x, y):
    # `apply` (and tf_lso's `apply_gradients` after `scale_loss`) unscales.
    with tf.GradientTape() as tape:
        scaled_loss = opt.scale_loss(model.loss(x, y))
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    opt.apply(grads, model.trainable_variables)


def keras3_protocol_apply_gradients(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.scale_loss(model.loss(x, y))
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))


def keras3_protocol_logging_unscaled(model, opt, x, y, step):
    # Unscaled for the log only; `apply` gets the scaled ones.
    with tf.GradientTape() as tape:
        scaled_loss = opt.scale_loss(model.loss(x, y))
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    unscaled = opt.get_unscaled_gradients(grads)
    tf.summary.scalar("grad_norm", tf.linalg.global_norm(unscaled), step=step)
    opt.apply(grads, model.trainable_variables)


def unscaled_by_hand(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    grads = [g / opt.loss_scale for g in grads]
    opt.apply_gradients(zip(grads, model.trainable_variables))


def summed_over_replicas_first(model, opt, x, y):
    # What an all-reduce returns is not followed: not sure, not reported.
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    grads = tf.distribute.get_replica_context().all_reduce("sum", grads)
    grads = opt.get_unscaled_gradients(grads)
    opt.apply_gradients(zip(grads, model.trainable_variables),
                        experimental_aggregate_gradients=False)


def only_if_mixed(model, opt, x, y, mixed):
    with tf.GradientTape() as tape:
        loss = model.loss(x, y)
        scaled_loss = opt.get_scaled_loss(loss) if mixed else loss
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    if mixed:
        grads = opt.get_unscaled_gradients(grads)
    opt.apply_gradients(zip(grads, model.trainable_variables))
