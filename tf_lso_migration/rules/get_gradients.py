"""`get-gradients`: `opt.get_gradients(loss, params)`, graph mode only."""

import ast

from tf_lso_migration import rule


@rule.register
class GetGradients(rule.Rule):
    """`opt.get_gradients(loss, params)`: graph mode only

    OptimizerV2's `get_gradients` built gradients in a graph. Keras 3's
    optimizers and tf_keras's new ones (`tf.keras.optimizers.*`) have none;
    tf_lso's `LossScaleOptimizer` keeps it for graph mode
    (`tf.compat.v1`). In eager code compute gradients with
    `tf.GradientTape`.
    """

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
