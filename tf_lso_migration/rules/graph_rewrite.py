"""`graph-rewrite`: TensorFlow's own `enable_mixed_precision_graph_rewrite`."""

import ast

from tf_lso_migration import legacy_names
from tf_lso_migration import rule

_NAME = "enable_mixed_precision_graph_rewrite"


@rule.register
class GraphRewrite(rule.Rule):
    """`tf.compat.v1`'s `enable_mixed_precision_graph_rewrite`, which
    TensorFlow 2.16+ keeps for TF1 optimizers only

    TensorFlow's own graph rewrite raises ValueError for a Keras 3
    optimizer and for tf_keras's new optimizers (it takes
    `tf.compat.v1.train.Optimizer`s, and tf_keras's `legacy` ones).
    `tf_lso.experimental.enable_mixed_precision_graph_rewrite(opt)` takes
    both kinds; better still, set the `'mixed_float16'` policy and wrap the
    optimizer in `tf_lso.LossScaleOptimizer`.
    """

    id, severity = "graph-rewrite", "warning"
    section = "Other things you will hit"
    visits = (ast.Import, ast.ImportFrom, ast.Attribute)

    def visit(self, node, context):
        if isinstance(node, ast.Import):
            names = [legacy_names.canonical(a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if not node.module or node.level:
                return
            module = legacy_names.canonical(node.module)
            if module in legacy_names.LEGACY_MODULES:
                return  # `legacy-name`'s.
            names = [f"{module}.{a.name}" for a in node.names]
        else:
            if node.attr != _NAME:
                return
            found = context.resolve(node)
            # Not tf_lso's own, nor a legacy name (`legacy-name`'s).
            if found is None or not (legacy_names.is_ours(found[0])
                                     or legacy_names.is_legacy(found[0])):
                self._report(node, context)
            return
        for name in names:
            if (name.endswith("." + _NAME) and not legacy_names.is_ours(name)
                    and legacy_names.replacement(name) is None):
                self._report(node, context)

    def _report(self, node, context):
        context.report(node, self.id, f"TensorFlow's `{_NAME}` takes TF1 "
                       "optimizers (`tf.compat.v1.train.Optimizer`) only; "
                       "with a Keras optimizer it raises ValueError. "
                       f"`tf_lso.experimental.{_NAME}` takes both (TF1 ones "
                       "go to TensorFlow's).")
