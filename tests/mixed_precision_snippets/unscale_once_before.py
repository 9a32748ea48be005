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
