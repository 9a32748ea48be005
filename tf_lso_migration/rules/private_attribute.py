"""`private-attribute`: TF's private `opt._optimizer` / `opt._loss_scale`."""

import ast

from tf_lso_migration import rule

_PUBLIC = {"_optimizer": "inner_optimizer", "_loss_scale": "loss_scale"}


@rule.register
class PrivateAttribute(rule.Rule):
    """`opt._optimizer` / `opt._loss_scale`, TF's private attributes

    TF 2.x's LossScaleOptimizer kept the inner optimizer in `_optimizer`
    and the loss scale in `_loss_scale`. Keras 3's and tf_lso's
    optimizers do not promise either: use the public `opt.inner_optimizer`
    and `opt.loss_scale`. (`self._optimizer` inside a class is the class's
    own and is not reported.)

    Only where `tf.keras` is Keras 3: tf_keras's LossScaleOptimizer still
    has both.
    """

    id, severity = "private-attribute", "warning"
    routes = ("keras3",)
    section = "Other things you will hit"
    visits = (ast.Attribute,)

    def visit(self, node, context):
        if node.attr in _PUBLIC and not (
                isinstance(node.value, ast.Name) and node.value.id == "self"):
            context.report(node, self.id, f"`{node.attr}` is a private "
                           "attribute of TF's LossScaleOptimizer; use the "
                           f"public `{_PUBLIC[node.attr]}`.")
