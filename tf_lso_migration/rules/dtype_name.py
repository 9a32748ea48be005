"""`dtype-name`: `x.dtype.name`, which fails on Keras 3 tensors."""

import ast

from tf_lso_migration import rule


@rule.register
class DtypeName(rule.Rule):
    """`x.dtype.name`, which fails on Keras 3 tensors (their dtype is a
    string)

    On Keras 3 a Keras tensor's (and a Keras variable's) `dtype` is a
    string such as `'float16'`, so `outputs.dtype.name` raises
    AttributeError. Write `outputs.dtype` where a string will do, or
    `tf.as_dtype(x.dtype).name`, which works for both.

    Only where `tf.keras` is Keras 3: tf_keras's dtypes are `tf.DType`s.
    """

    id, severity = "dtype-name", "warning"
    routes = ("keras3",)
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
