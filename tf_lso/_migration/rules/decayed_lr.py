"""`decayed-lr`: `opt._decayed_lr(...)`, gone with OptimizerV2."""

from tf_lso._migration import rule


@rule.register
class DecayedLr(rule.AttributeRule):
    """`opt._decayed_lr(...)`, gone with OptimizerV2"""

    id, severity = "decayed-lr", "error"
    section = "Other things you will hit"
    attribute = "_decayed_lr"
    message = ("`_decayed_lr` is gone with OptimizerV2; read the current "
               "value from `opt.learning_rate`.")
