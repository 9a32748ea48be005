"""`decayed-lr`: `opt._decayed_lr(...)`, gone with OptimizerV2."""

from tf_lso_migration import rule


@rule.register
class DecayedLr(rule.AttributeRule):
    """`opt._decayed_lr(...)`, gone with OptimizerV2

    OptimizerV2's private `_decayed_lr(dtype)` gave the learning rate at
    the current step. Neither Keras 3's optimizers nor tf_keras's
    `tf.keras.optimizers` (its new optimizers) have it: read the current
    value from `opt.learning_rate`.
    """

    id, severity = "decayed-lr", "error"
    section = "Other things you will hit"
    attribute = "_decayed_lr"
    message = ("`_decayed_lr` is gone with OptimizerV2; read the current "
               "value from `opt.learning_rate`.")
