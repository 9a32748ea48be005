"""`get-gradients`: `opt.get_gradients(loss, params)`, graph mode only."""

import ast

from tf_lso._migration import rule


@rule.register
class GetGradients(rule.Rule):
    """`opt.get_gradients(loss, params)`: graph mode only"""

    id, severity = "get-gradients", "warning"
    section = "Other things you will hit"
    visits = (ast.Call,)

    def visit(self, node, context):
        if (isinstance(node.func, ast.Attribute)
                and node.func.attr == "get_gradients"):
            context.report(node, self.id, "`get_gradients` works only in "
                           "graph mode (tf.compat.v1), as in TF 2.x; in eager "
                           "code use `tf.GradientTape`. Keras 3 optimizers do "
                           "not have it.")
