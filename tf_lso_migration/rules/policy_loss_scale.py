"""`policy-loss-scale`: `Policy(name, loss_scale=...)`, TF 2.1-2.3's policy."""

import ast

from tf_lso_migration import legacy_names
from tf_lso_migration import rule


@rule.register
class PolicyLossScale(rule.Rule):
    """`Policy(name, loss_scale=...)`: kept by
    `tf_lso.experimental.Policy` (Keras 3's policies have no loss scale)

    TF 2.1-2.3's policy carried a loss scale that `model.compile` used to
    wrap the optimizer. Keras 3's and tf_keras's policies take no
    `loss_scale` (TypeError). `tf_lso.experimental.Policy` keeps it, and
    under it `compile` wraps the optimizer in
    `tf_lso.experimental.LossScaleOptimizer` as TF 2.1-2.3 did.
    """

    id, severity = "policy-loss-scale", "info"
    section = "The legacy policy API"
    visits = (ast.Call,)

    def visit(self, node, context):
        found = context.resolve(node.func)
        if not found or legacy_names.behaviour(found[0]) != (
                "tf_lso.experimental.Policy"):
            return
        if len(node.args) > 1 or any(k.arg == "loss_scale"
                                     for k in node.keywords):
            context.report(node, self.id, "A policy with a loss scale: "
                           "`tf_lso.experimental.Policy` keeps it and "
                           "`model.compile` wraps the optimizer, as in TF "
                           "2.1-2.3; Keras 3's policies have no loss scale.")
