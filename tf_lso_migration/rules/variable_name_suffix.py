"""`variable-name-suffix`: a variable name ending in `:0`.

Keras 3 variable names have no `:0`, so a pattern or a comparison with one
matches nothing. Reported in strings that are patterns of the `re`
functions, or compared with (or searched in) a `.name`; also when the
string is bound to a name that is used so (`Scopes`): an assignment or a
parameter default, the name's only binding in its scope.
"""

import ast
import re

from tf_lso_migration import rule

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
    a `.name`, compared with a `.name`, or bound to a name that is used
    so (its one assignment, or a parameter default, in the function or
    module that reads it).

    Only where `tf.keras` is Keras 3: tf_keras keeps the `:0`.
    """

    id, severity = "variable-name-suffix", "warning"
    routes = ("keras3",)
    section = "Other things you will hit"
    visits = (ast.Call, ast.Compare)
    mentions = (":0",)

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
        notes = context.notes[self.id]
        for node in nodes:
            if isinstance(node, ast.Name):  # A pattern held in a name.
                if "scopes" not in notes:
                    notes["scopes"] = Scopes(context.tree)
                node = notes["scopes"].value(node)
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


class Scopes:
    """Which value a name read in a file stands for, where that is certain.

    Python's scopes: a module, each function and lambda (their parameters
    included), each class body (not seen from the functions in it). A name
    read in a scope stands for the value bound to it in the innermost scope
    that binds it, if that scope binds it once, by an assignment of one
    value or a parameter default. Any other binding there (a second
    assignment, a loop, an import, `global`, a parameter without a
    default, ...) leaves the name's value unknown.
    """

    def __init__(self, tree):
        self._bindings = {}  # scope -> {name: [value, or None]}
        self._parent = {tree: None}  # scope -> the scope it is in
        self._scope_of = {}  # ast.Name read -> its scope
        self._visit(tree, tree)

    def value(self, name):
        """The expression `name` (an `ast.Name` read) stands for, or None."""
        scope = self._scope_of.get(name)
        first = scope
        while scope is not None:
            bound = self._bindings.get(scope, {}).get(name.id)
            if bound is not None and (scope is first or not isinstance(
                    scope, ast.ClassDef)):
                return bound[0] if len(bound) == 1 else None
            scope = self._parent[scope]
        return None

    def _bind(self, scope, name, value=None):
        self._bindings.setdefault(scope, {}).setdefault(name, []).append(
            value)

    def _bind_targets(self, scope, target, value=None):
        if isinstance(target, ast.Name):
            self._bind(scope, target.id, value)
        elif isinstance(target, (ast.Tuple, ast.List, ast.Starred)):
            elements = (target.elts if not isinstance(target, ast.Starred)
                        else [target.value])
            for element in elements:
                self._bind_targets(scope, element)

    def _new_scope(self, node, scope):
        self._parent[node] = scope
        return node

    def _visit(self, node, scope):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.Lambda)):
            self._function(node, scope)
            return
        if isinstance(node, ast.ClassDef):
            self._bind(scope, node.name)
            for child in node.bases + node.keywords + node.decorator_list:
                self._visit(child, scope)
            inner = self._new_scope(node, scope)
            for child in node.body:
                self._visit(child, inner)
            return
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                self._scope_of[node] = scope
            else:
                self._bind(scope, node.id)  # Unless recorded with a value.
            return
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target])
            single = len(targets) == 1 and isinstance(targets[0], ast.Name)
            for target in targets:
                if single and node.value is not None:
                    self._bind(scope, target.id, node.value)
                else:
                    self._bind_targets(scope, target)
                if not isinstance(target, ast.Name):
                    self._visit(target, scope)
            if node.value is not None:
                self._visit(node.value, scope)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                self._bind(scope, (alias.asname or alias.name).split(".")[0])
            return
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                self._bind(scope, name)
            return
        if isinstance(node, ast.ExceptHandler) and node.name:
            self._bind(scope, node.name)
        for child in ast.iter_child_nodes(node):
            self._visit(child, scope)

    def _function(self, node, scope):
        arguments = node.args
        for default in arguments.defaults + [
                d for d in arguments.kw_defaults if d is not None]:
            self._visit(default, scope)
        if not isinstance(node, ast.Lambda):
            self._bind(scope, node.name)
            for child in node.decorator_list + (
                    [node.returns] if node.returns else []):
                self._visit(child, scope)
        inner = self._new_scope(node, scope)
        positional = arguments.posonlyargs + arguments.args
        defaults = ([None] * (len(positional) - len(arguments.defaults))
                    + arguments.defaults)
        for argument, default in zip(
                positional + arguments.kwonlyargs,
                defaults + arguments.kw_defaults):
            self._bind(inner, argument.arg, default)
        for argument in (arguments.vararg, arguments.kwarg):
            if argument is not None:
                self._bind(inner, argument.arg)
        body = node.body if isinstance(node.body, list) else [node.body]
        for child in body:
            self._visit(child, inner)
