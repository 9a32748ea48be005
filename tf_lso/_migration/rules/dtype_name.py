"""`dtype-name`: `x.dtype.name`, which fails on Keras 3 tensors."""

import ast

from tf_lso._migration import rule


@rule.register
class DtypeName(rule.Rule):
    """`x.dtype.name`, which fails on Keras 3 tensors (their dtype is a
    string)"""

    id, severity = "dtype-name", "warning"
    section = "Other things you will hit"
    visits = (ast.Attribute,)

    def visit(self, node, context):
        if (node.attr == "name" and isinstance(node.value, ast.Attribute)
                and node.value.attr == "dtype"
                and context.resolve(node) is None):
            context.report(node, self.id, "On Keras 3 a Keras tensor's "
                           "`dtype` is a string ('float16'), so `.dtype.name` "
                           "raises AttributeError; use `tf.as_dtype(x.dtype)."
                           "name` (works for both).")
