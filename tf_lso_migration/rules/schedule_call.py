"""`schedule-call`: `opt.learning_rate(step)`, callable on tf_lso's only."""

import ast

from tf_lso_migration import rule


@rule.register
class ScheduleCall(rule.Rule):
    """`opt.learning_rate(step)` / `opt.lr(step)`: callable on tf_lso's
    optimizers only

    TF 2.x code with a learning rate schedule called
    `opt.learning_rate(opt.iterations)`. On Keras 3's optimizers and
    tf_keras's new ones `opt.learning_rate` is the current value (a
    variable or tensor), and calling it fails ("object is not callable").
    tf_lso's optimizers keep it callable with a step. On a bare optimizer
    call the schedule itself.
    """

    id, severity = "schedule-call", "warning"
    section = "Deliberate differences from TF 2.4"
    visits = (ast.Call,)

    def visit(self, node, context):
        func = node.func
        if (isinstance(func, ast.Attribute)
                and func.attr in ("learning_rate", "lr")
                and len(node.args) == 1):
            context.report(node, self.id, f"`opt.{func.attr}(step)`: the "
                           "learning rate of a Keras 3 optimizer (or of "
                           "tf_keras's new ones) is a value, not the "
                           "schedule (\"object is not callable\"); tf_lso's "
                           "optimizers keep it callable. On a bare optimizer "
                           "call the schedule itself.")
