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


class FlaggedModel(tf.keras.Model):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compiled_loss(y, self(x, training=True))
            if self.mixed_precision:
                loss = self.optimizer.get_scaled_loss(loss)
        gradients = tape.gradient(loss, self.trainable_variables)
        if self.mixed_precision:
            gradients = self.optimizer.get_unscaled_gradients(gradients)
        self.optimizer.apply_gradients(
            zip(gradients, self.trainable_variables))
        return {}


def compute_gradients(tape, loss, variables):
    return tape.gradient(loss, variables)


def helper_gradients_step(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    grads = compute_gradients(tape, scaled_loss, model.trainable_variables)
    grads = opt.get_unscaled_gradients(grads)
    opt.apply_gradients(zip(grads, model.trainable_variables))


def unscale(optimizer, grads):
    return optimizer.get_unscaled_gradients(grads)


def helper_unscaled_once(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    grads = unscale(opt, tape.gradient(scaled_loss, model.trainable_variables))
    opt.apply_gradients(zip(grads, model.trainable_variables))


class AliasTrainer:
    def step(self, x, y):
        opt = self.optimizer
        with tf.GradientTape() as tape:
            scaled_loss = opt.scale_loss(self.model.loss(x, y))
        grads = tape.gradient(scaled_loss, self.model.trainable_variables)
        self.optimizer.apply(grads, self.model.trainable_variables)


def masked_unscaled_once(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    grads = opt.get_unscaled_gradients(
        tape.gradient(scaled_loss, model.trainable_variables))
    grads = [tf.where(tf.math.is_finite(g), g, tf.zeros_like(g))
             for g in grads]
    opt.apply_gradients(zip(grads, model.trainable_variables))


def divided_by_hand_only(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.get_scaled_loss(model.loss(x, y))
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    grads = [g / opt.loss_scale for g in grads]
    opt.apply_gradients(zip(grads, model.trainable_variables))


def minimize_scales(model, opt, x, y):
    opt.minimize(lambda: model.loss(x, y), model.trainable_variables)


def keras3_applied_scaled(model, opt, x, y):
    with tf.GradientTape() as tape:
        scaled_loss = opt.scale_loss(model.loss(x, y))
    grads = tape.gradient(scaled_loss, model.trainable_variables)
    opt.apply(grads, model.trainable_variables)


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
        gradients = self.optimizer.get_unscaled_gradients(gradients)
        for i in range(len(self.accumulated)):
            self.accumulated[i].assign_add(
                gradients[i] / tf.cast(self.accum_steps, tf.float32))
        self.step.assign_add(1)
        tf.cond(tf.equal(self.step, self.accum_steps),
                self.apply_accumulated, lambda: None)
        return {}

    def apply_accumulated(self):
        self.optimizer.apply_gradients(
            zip(self.accumulated, self.trainable_variables))
        self.step.assign(0)
        for i in range(len(self.accumulated)):
            self.accumulated[i].assign(tf.zeros_like(self.accumulated[i]))
