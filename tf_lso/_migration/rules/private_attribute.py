"""`private-attribute`: TF's private `opt._optimizer` / `opt._loss_scale`."""

import ast

from tf_lso._migration import rule

_PUBLIC = {"_optimizer": "inner_optimizer", "_loss_scale": "loss_scale"}


@rule.register
class PrivateAttribute(rule.Rule):
    """`opt._optimizer` / `opt._loss_scale`, TF's private attributes"""

    id, severity = "private-attribute", "warning"
    section = "Other things you will hit"
    visits = (ast.Attribute,)

    def visit(self, node, context):
        if node.attr in _PUBLIC and not (
                isinstance(node.value, ast.Name) and node.value.id == "self"):
            context.report(node, self.id, f"`{node.attr}` is a private "
                           "attribute of TF's LossScaleOptimizer; use the "
                           f"public `{_PUBLIC[node.attr]}`.")
