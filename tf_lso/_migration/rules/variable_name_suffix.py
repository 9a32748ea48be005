"""`variable-name-suffix`: a variable name ending in `:0`.

Keras 3 variable names have no `:0`, so a pattern or a comparison with one
matches nothing. Reported in strings that are patterns of the `re`
functions, or compared with (or searched in) a `.name`.
"""

import ast
import re

from tf_lso._migration import rule

# `kernel:0`, `dense_1/kernel:0`, `w1:0`, `%s:0`, `.*:0`; not `ratio 1:0`.
_VARIABLE_SUFFIX = re.compile(r"(?:[A-Za-z_/*.)\]]|[A-Za-z_]\d+):0(?!\d)")
# Device strings: `/gpu:0`, `device:GPU:0`, `/job:worker/replica:0/task:0`.
_DEVICE = re.compile(r"(?i)(?:^|[/:])(?:device|gpu|cpu|tpu|xla_[a-z]+|job|"
                     r"replica|task)(?::|$)")
# Where a string is a pattern or a value that variable names are matched
# against: the `re` functions, and `str` methods called on a `.name`.
_REGEX_FUNCTIONS = frozenset({
    "compile", "search", "match", "fullmatch", "findall", "finditer", "sub",
    "subn", "split",
})
_NAME_METHODS = frozenset({
    "endswith", "startswith", "replace", "find", "index", "rfind", "split",
    "count", "removesuffix",
})


@rule.register
class VariableNameSuffix(rule.Rule):
    """a variable name ending in `:0` in a regex or compared with a
    `.name`, which Keras 3 variable names never match

    TF 2.x variable names ended in `:0` (`'dense/kernel:0'`); Keras 3's
    have no suffix and no scope (`v.name == 'kernel'`, `v.path ==
    'dense/kernel'`). A pattern or name with `:0` then matches nothing,
    and what it drove (weight decay, freezing, per-variable learning
    rates) silently does nothing. Match `v.path` without the `:0`.
    Reported in strings passed to the `re` functions or to `str` methods of
    a `.name`, compared with a `.name`, or bound to a name (an assignment
    or a parameter default in the same function) that is used so.

    Only where `tf.keras` is Keras 3: tf_keras keeps the `:0`.
    """

    id, severity = "variable-name-suffix", "warning"
    routes = ("keras3",)
    section = "Other things you will hit"
    visits = (ast.Call, ast.Compare)

    def visit(self, node, context):
        if isinstance(node, ast.Compare):
            operands = [node.left] + node.comparators
            if any(_mentions_name(operand) for operand in operands):
                self._strings_in(operands, context)
            return
        func = node.func
        found = context.resolve(func)
        is_regex = found is not None and found[1] == "re" and (
            found[0].rpartition(".")[2] in _REGEX_FUNCTIONS)
        on_a_name = (isinstance(func, ast.Attribute)
                     and func.attr in _NAME_METHODS
                     and _mentions_name(func.value))
        if is_regex or on_a_name:
            self._strings_in(node.args, context)

    def _strings_in(self, nodes, context):
        """Reports the strings among `nodes` that end a variable name in :0."""
        for node in nodes:
            for string in _strings(node):
                if (_VARIABLE_SUFFIX.search(string.value)
                        and not _DEVICE.search(string.value)):
                    context.report(string, self.id, "Keras 3 variable names "
                                   "have no ':0' (`v.name == 'kernel'`, "
                                   "`v.path == 'dense/kernel'`); a pattern "
                                   "with ':0' matches nothing. Match "
                                   "`v.path`.")


def _strings(node):
    """The string constants `node` is made of (a literal, a collection of
    them, `'%s:0' % x`, an f-string's text)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [s for element in node.elts for s in _strings(element)]
    if isinstance(node, ast.BinOp):
        return _strings(node.left)
    if isinstance(node, ast.JoinedStr):
        return [v for v in node.values if isinstance(v, ast.Constant)]
    return []


def _mentions_name(node):
    """Whether an expression reads a `.name` (a variable's, usually)."""
    return any(isinstance(sub, ast.Attribute) and sub.attr == "name"
               for sub in ast.walk(node))
