"""The global policies a file sets, and where its calls run.

Not a rule (it registers none): what `bfloat16-loss-scale` and
`float16-output` share. `policy_sets` finds the global policies a file
sets; `runs_under` says whether a call runs under one (same file),
skipping what an `if` keeps apart. Each is computed once per file and
kept in `Context.notes`. Also the readings of a tree that these rules and
the gradient flow share (`dotted`, `names_stored`, `truth`,
`local_names`).
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from typing import Any

from tf_lso_migration import legacy_names
from tf_lso_migration import rule


def dotted(node: ast.AST) -> str | None:
    """`self.opt.x` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def names_stored(node: ast.AST) -> Iterator[str]:
    """The names `node` stores or deletes."""
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx,
                                                      (ast.Store, ast.Del)):
            yield child.id


def truth(test: ast.expr) -> bool | None:
    """Whether a constant test holds (`if False:`, `if not 0:`); None for
    another test: a path follows it."""
    holds = True
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, holds = test.operand, not holds
    if isinstance(test, ast.Constant):
        return bool(test.value) == holds
    return None


def defaults(function: Any) -> dict[str, ast.expr]:
    """A function's parameters that have a default, and the default."""
    arguments = function.args
    positional = [*arguments.posonlyargs, *arguments.args]
    found = dict(zip(reversed([a.arg for a in positional]),
                     reversed(arguments.defaults)))
    found.update((a.arg, d) for a, d in zip(arguments.kwonlyargs,
                                             arguments.kw_defaults)
                 if d is not None)
    return found


def local_names(function: Any) -> set[str]:
    """A function's parameters and the names it stores."""
    arguments = function.args
    names = {a.arg for a in [*arguments.posonlyargs, *arguments.args,
                             *arguments.kwonlyargs, arguments.vararg,
                             arguments.kwarg] if a is not None}
    for statement in function.body:
        names.update(names_stored(statement))
    return names


_SET_POLICY = frozenset({
    "tf.keras.mixed_precision.set_global_policy",
    "tf_lso.experimental.set_policy",
    "tf.keras.config.set_dtype_policy",
    "tf.keras.mixed_precision.set_dtype_policy",
})
_POLICY_CLASSES = frozenset({
    "tf.keras.mixed_precision.Policy", "tf.keras.mixed_precision.DTypePolicy",
    "tf.keras.DTypePolicy", "tf.keras.dtype_policies.DTypePolicy",
    "tf_lso.experimental.Policy",
})
# Words that make an `if` around a call a question about the policy: a
# call only made when the policy is float16 is not made under bfloat16.
_POLICY_WORDS = ("float16", "fp16", "half", "policy", "dtype", "precision")


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a call is: the branches it is in, and its function.

    Attributes:
        branches: ((the `if`/`try` node, the branch), ...) from outermost.
        scope: The innermost function (or the module) around it.
    """

    branches: tuple[tuple[ast.AST, str], ...]
    scope: ast.AST


def places(context: rule.Context) -> dict[int, Place]:
    """id(call) -> `Place`, for every call in the file (computed once)."""
    notes = context.notes["_policies"]
    if "places" in notes:
        return notes["places"]
    found: dict[int, Place] = {}

    def walk(node: ast.AST, branches: tuple[tuple[ast.AST, str], ...],
             scope: ast.AST) -> None:
        if isinstance(node, ast.Call):
            found[id(node)] = Place(branches, scope)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.Lambda)):
            scope = node
        for field, value in ast.iter_fields(node):
            children = value if isinstance(value, list) else [value]
            branch = branches
            if isinstance(node, (ast.If, ast.IfExp)) and field in ("body",
                                                                   "orelse"):
                branch = branches + ((node, field),)
            elif isinstance(node, ast.Try) and field in ("body", "handlers"):
                branch = branches + ((node, field),)
            for child in children:
                if isinstance(child, ast.AST):
                    walk(child, branch, scope)

    walk(context.tree, (), context.tree)
    notes["places"] = found
    return found


def apart(first: Place, second: Place) -> bool:
    """Whether two places are in different branches of one `if`/`try`."""
    branches = dict(first.branches)
    return any(node in branches and branches[node] != branch
               for node, branch in second.branches)


def _words(node: ast.AST) -> Iterator[str]:
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            yield child.id.lower()
        elif isinstance(child, ast.Attribute):
            yield child.attr.lower()
        elif isinstance(child, ast.Constant) and isinstance(child.value, str):
            yield child.value.lower()


def asks_about_policy(place: Place, policy_place: Place) -> bool:
    """Whether an `if` around `place` (not around the policy's) asks about
    the policy or dtype: what it guards may not run under this policy."""
    shared = {id(node) for node, _ in policy_place.branches}
    for node, _ in place.branches:
        if id(node) in shared:
            continue
        test = getattr(node, "test", None)
        if test is None:
            continue  # A `try`.
        for word in _words(test):
            if word.replace("bfloat16", "") and any(
                    w in word.replace("bfloat16", "") for w in _POLICY_WORDS):
                return True
    return False


def string_argument(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _assigned(context: rule.Context, name: str,
              scope: ast.AST) -> list[ast.AST | None]:
    """The values assigned to `name` directly in `scope`'s own code."""
    values: list[ast.AST | None] = []
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name
                for t in node.targets):
            values.append(node.value)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For,
                               ast.With, ast.NamedExpr)) and name in set(
                names_stored(node)):
            values.append(None)  # Stored otherwise: not sure.
    del context
    return values


def _policy_name(context: rule.Context, node: ast.AST | None,
                 scope: ast.AST) -> str | None:
    """The policy name an argument of a policy setter spells, or None."""
    if isinstance(node, ast.Name):
        assigned = _assigned(context, node.id, scope)
        if len(assigned) != 1:
            return None
        node = assigned[0]
    text = string_argument(node)
    if text is not None:
        return text
    if isinstance(node, ast.Call) and _behaviour(context, node.func) in (
            _POLICY_CLASSES):
        argument = node.args[0] if node.args else next(
            (k.value for k in node.keywords if k.arg == "name"), None)
        return string_argument(argument)
    return None


def _behaviour(context: rule.Context, node: ast.AST) -> str | None:
    found = context.resolve(node)
    return legacy_names.behaviour(found[0]) if found else None


@dataclasses.dataclass(frozen=True)
class PolicySet:
    """A call that sets the global policy.

    Attributes:
        node: The call.
        name: The policy's name, or None where it is not a literal.
        place: Where the call is.
    """

    node: ast.Call
    name: str | None
    place: Place


def policy_sets(context: rule.Context) -> list[PolicySet]:
    """Every call in the file that sets the global policy (computed once)."""
    notes = context.notes["_policies"]
    if "policy_sets" in notes:
        return notes["policy_sets"]
    where = places(context)
    found = []
    for node in ast.walk(context.tree):
        if isinstance(node, ast.Call) and _behaviour(
                context, node.func) in _SET_POLICY:
            place = where[id(node)]
            argument = node.args[0] if node.args else next(
                (k.value for k in node.keywords), None)
            found.append(PolicySet(node, _policy_name(context, argument,
                                                      place.scope), place))
    notes["policy_sets"] = found
    return found


def file_policy(context: rule.Context, name: str) -> PolicySet | None:
    """The first policy set to `name`, if every policy the file sets is
    `name` (spelled as a literal); else None: the file's policy is not sure."""
    sets = policy_sets(context)
    if not sets or any(s.name != name for s in sets):
        return None
    return min(sets, key=lambda s: (s.node.lineno, s.node.col_offset))


# `if __name__ == "__main__":`, as `ast.unparse` writes it.
_MAIN = ("__name__ == '__main__'", "'__main__' == __name__")


def policy_path(context: rule.Context, node: ast.Call,
                policy: PolicySet) -> tuple[tuple[str, bool], ...]:
    """Where the policy holds for `node`: the tests of the `if`s around
    every call that sets it (`policy` and its like) and not around `node`,
    as (test as written, holds)."""
    around = {id(branch) for branch, _ in places(context)[id(node)].branches}
    every = set.intersection(*({(id(branch), field) for branch, field in
                                other.place.branches}
                               for other in policy_sets(context)))
    path = []
    for branch, field in policy.place.branches:
        if id(branch) in around or (id(branch), field) not in every or (
                not isinstance(branch, ast.If)) or truth(
                branch.test) is not None or ast.unparse(branch.test) in _MAIN:
            continue  # Around both, not all, a `try`, a constant, the script.
        test, holds = branch.test, field == "body"
        while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            test, holds = test.operand, not holds
        path.append((ast.unparse(test), holds))
    return tuple(path)


def phrase(path: Any) -> str:
    """A path's (test, holds) pairs in words: "When `a` is true, "."""
    if not path:
        return ""
    return "When " + " and ".join(
        f"`{test}` is {'true' if holds else 'false'}"
        for test, holds in path) + ", "


def runs_under(context: rule.Context, node: ast.Call,
               policy: PolicySet) -> bool:
    """Whether the call `node` runs under `policy`, as far as the file says.

    Not when an `if`/`try` puts them in different branches, when an `if`
    around the call asks about the policy or a dtype, or when the call
    comes before the policy is set in the same function.
    """
    place = places(context)[id(node)]
    if apart(place, policy.place) or asks_about_policy(place, policy.place):
        return False
    if place.scope is policy.place.scope and (
            node.lineno, node.col_offset) < (policy.node.lineno,
                                             policy.node.col_offset):
        return False
    return True


def behaviour(context: rule.Context, node: ast.AST) -> str | None:
    """The canonical name (tf_lso's for a legacy one) `node` spells."""
    return _behaviour(context, node)
