"""`loss-scale-call`: `opt.loss_scale()`, TF 2.1-2.3's call."""

import ast

from tf_lso_migration import rule


@rule.register
class LossScaleCall(rule.Rule):
    """`opt.loss_scale()`: TF 2.1-2.3's call, which the experimental
    class keeps (TF 2.4's class has a tensor there)

    On `tf_lso.experimental.LossScaleOptimizer` `opt.loss_scale` is the
    `LossScale` object, callable as in TF 2.1-2.3 and usable as a tensor;
    on `tf_lso.LossScaleOptimizer` (and tf_keras's class) it is a tensor,
    as in TF 2.4, and calling it fails. Nothing to change while the code
    keeps the experimental class.
    """

    id, severity = "loss-scale-call", "info"
    section = "Deliberate differences from TF 2.4"
    visits = (ast.Call,)

    def visit(self, node, context):
        if (isinstance(node.func, ast.Attribute)
                and node.func.attr == "loss_scale"
                and not node.args and not node.keywords):
            context.report(node, self.id, "`opt.loss_scale()` works on "
                           "`tf_lso.experimental.LossScaleOptimizer` (TF "
                           "2.1-2.3's class: a LossScale object, also usable "
                           "as a tensor); on `tf_lso.LossScaleOptimizer` (TF "
                           "2.4's) `opt.loss_scale` is a tensor, as in TF 2.4.")
