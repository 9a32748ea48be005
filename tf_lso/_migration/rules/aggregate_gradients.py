"""`aggregate-gradients`: `experimental_aggregate_gradients=`."""

import ast

from tf_lso._migration import rule


@rule.register
class AggregateGradients(rule.Rule):
    """`experimental_aggregate_gradients=`, which Keras 3 optimizers
    reject"""

    id, severity = "aggregate-gradients", "warning"
    section = "Other things you will hit"
    visits = (ast.Call,)

    def visit(self, node, context):
        for keyword in node.keywords:
            if keyword.arg == "experimental_aggregate_gradients":
                context.report(keyword.value, self.id, "Keras 3 optimizers "
                               "raise a TypeError on "
                               "`experimental_aggregate_gradients`; tf_lso's "
                               "LossScaleOptimizer accepts it (a bare inner "
                               "optimizer does not).")
