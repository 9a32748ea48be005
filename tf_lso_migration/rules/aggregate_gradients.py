"""`aggregate-gradients`: `experimental_aggregate_gradients=`."""

import ast

from tf_lso_migration import rule


@rule.register
class AggregateGradients(rule.Rule):
    """`experimental_aggregate_gradients=`, which Keras 3 optimizers
    reject

    TF 2.x's `opt.apply_gradients(grads_and_vars,
    experimental_aggregate_gradients=False)` told OptimizerV2 that the
    gradients were already summed over replicas. A bare Keras 3 optimizer
    raises `TypeError` on the keyword; tf_lso's `LossScaleOptimizer`
    accepts it. Keep it only on tf_lso's optimizer, or drop it.

    Only where `tf.keras` is Keras 3: tf_keras's optimizers accept it.
    """

    id, severity = "aggregate-gradients", "warning"
    routes = ("keras3",)
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
