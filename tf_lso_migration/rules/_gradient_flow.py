"""The gradient flow behind `clip-before-unscale` and `unscale-once`.

Not a rule (it registers none): `gradient_events` runs once per file and
keeps its findings in `Context.notes`.

`gradient_events` follows values within each function (and the module's
own code): a loss scaled by `get_scaled_loss` (TF 2.x's protocol) or
`scale_loss` (Keras 3's), the gradients `tape.gradient` takes of it, and
what they pass through (assignments, tuple unpacking, `zip`, `list`,
indexing, comprehensions, `for` loops) up to `get_unscaled_gradients`,
`apply_gradients` or `apply`. A value is followed only while it is sure:
after an `if` only what both branches agree on, after a loop only what
held before it too; anything else done to a value (arithmetic, an unknown
call, an item assignment) stops following it. So what is reported is what
the code does on every path through the function.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from typing import Any

from tf_lso_migration import rule

TF2, KERAS3 = "tf2", "keras3"  # The protocols: who scaled the loss.

_CLIPS = frozenset({"clip_by_global_norm", "clip_by_norm", "clip_by_value",
                    "clip_by_average_norm"})
_NORMS = frozenset({"tf.linalg.global_norm", "tf.global_norm", "tf.norm",
                    "tf.linalg.norm", "tf.math.reduce_euclidean_norm"})
_GRADIENTS = frozenset({"tf.gradients", "tf.compat.v1.gradients"})


@dataclasses.dataclass(frozen=True)
class Value:
    """What the flow knows of a value.

    Attributes:
        kind: `loss` (a scaled loss), `grads` (gradients, any nest),
            `grad` (one gradient), `pairs` (gradient, variable) pairs,
            `norm` (a norm of gradients), `clip` (what
            `tf.clip_by_global_norm` returns: gradients and a norm).
        protocol: `TF2` or `KERAS3`: which call scaled the loss.
        unscaled: How many times `get_unscaled_gradients` divided them.
        by: `ast.dump` of the optimizer that unscaled them last, or "".
    """

    kind: str
    protocol: str
    unscaled: int = 0
    by: str = ""

    def becomes(self, kind: str) -> Value:
        return dataclasses.replace(self, kind=kind)

    @property
    def scaled(self) -> bool:
        """Gradients (or their norm) still times the loss scale."""
        return self.kind in ("grads", "grad", "pairs", "norm", "clip") and (
            not self.unscaled)


@dataclasses.dataclass(frozen=True)
class Event:
    """A place where the flow found a bug.

    Attributes:
        node: Where (a call).
        what: `clip` (clipped or normed before unscaling), `log` (logged
            before unscaling), `never` (applied never unscaled), `twice`
            (unscaled a second time).
        call: The function or method called there, as written.
        protocol: `TF2` or `KERAS3`.
    """

    node: ast.AST
    what: str
    call: str
    protocol: str


_Env = dict[str, Value]


def _merge(first: _Env | None, second: _Env | None) -> _Env | None:
    """What holds after either of two paths (None: a path that ended)."""
    if first is None:
        return second
    if second is None:
        return first
    return {k: v for k, v in first.items() if second.get(k) == v}


def _names_stored(node: ast.AST) -> Iterator[str]:
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and isinstance(child.ctx,
                                                      (ast.Store, ast.Del)):
            yield child.id


def _mentions_scale(nodes: list[ast.expr]) -> bool:
    """Whether an expression names a scale (a clip norm times the scale)."""
    for node in nodes:
        for child in ast.walk(node):
            word = (child.id if isinstance(child, ast.Name) else
                    child.attr if isinstance(child, ast.Attribute) else "")
            if "scale" in word.lower():
                return True
    return False


def _says_scaled(call: ast.Call) -> bool:
    """Whether a logging call labels what it logs as scaled, on purpose."""
    return any(isinstance(c, ast.Constant) and isinstance(c.value, str)
               and "scal" in c.value.lower() for c in ast.walk(call))


def _written(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover - ast.unparse handles any tree.
        return "the call"


class _Flow:
    """Follows scaled losses and their gradients through one file."""

    def __init__(self, context: rule.Context) -> None:
        self._context = context
        self.events: list[Event] = []

    # Scopes and statements.

    def scope(self, body: list[ast.stmt]) -> None:
        self._block(body, {})

    def _block(self, body: list[ast.stmt], env: _Env | None) -> _Env | None:
        for statement in body:
            if env is None:
                return None  # After a return: not reached.
            env = self._statement(statement, env)
        return env

    def _statement(self, node: ast.stmt, env: _Env) -> _Env | None:
        env = dict(env)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for default in node.args.defaults + node.args.kw_defaults:
                if default is not None:
                    self._eval(default, env)
            self.scope(node.body)  # A scope of its own.
            env.pop(node.name, None)
            return env
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                if isinstance(statement, (ast.FunctionDef,
                                          ast.AsyncFunctionDef)):
                    self.scope(statement.body)
            env.pop(node.name, None)
            return env
        if isinstance(node, ast.Assign):
            value = self._eval(node.value, env)
            for target in node.targets:
                self._bind(target, value, env)
            return env
        if isinstance(node, ast.AnnAssign):
            value = self._eval(node.value, env) if node.value else None
            self._bind(node.target, value, env)
            return env
        if isinstance(node, ast.AugAssign):
            self._eval(node.value, env)
            self._bind(node.target, None, env)
            return env
        if isinstance(node, ast.Expr):
            self._eval(node.value, env)
            return env
        if isinstance(node, (ast.Return, ast.Raise)):
            for child in ast.iter_child_nodes(node):
                self._eval(child, env)
            return None
        if isinstance(node, (ast.Break, ast.Continue)):
            return None
        if isinstance(node, ast.If):
            self._eval(node.test, env)
            return _merge(self._block(node.body, dict(env)),
                          self._block(node.orelse, dict(env)))
        if isinstance(node, (ast.For, ast.AsyncFor)):
            iterated = self._eval(node.iter, env)
            inside = dict(env)
            self._bind(node.target, None, inside)
            self._bind_item(node.target, iterated, inside)
            after = _merge(env, self._block(node.body, inside))
            for name in _names_stored(node):
                if after is not None and after.get(name) != env.get(name):
                    after.pop(name, None)
            return self._block(node.orelse, after) if after else after
        if isinstance(node, ast.While):
            self._eval(node.test, env)
            after = _merge(env, self._block(node.body, dict(env)))
            return self._block(node.orelse, after) if after else after
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                self._eval(item.context_expr, env)
                if item.optional_vars is not None:
                    self._bind(item.optional_vars, None, env)
            return self._block(node.body, env)
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            return self._try(node, env)
        # Anything else (import, del, global, match, ...): forget what it
        # stores, look at what it evaluates.
        for name in _names_stored(node):
            env.pop(name, None)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                env.pop((alias.asname or alias.name).split(".")[0], None)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self._eval(child, env)
            elif isinstance(child, ast.stmt):
                self._statement(child, dict(env))
        return env

    def _try(self, node: Any, env: _Env) -> _Env | None:
        """A `try` (or `try`/`except*`): the body, or any handler after
        part of it, then `finally`."""
        after = self._block(node.body, dict(env))
        after = self._block(node.orelse, after) if after else after
        for handler in node.handlers:
            started = dict(env)
            for name in _names_stored(node):
                started.pop(name, None)
            after = _merge(after, self._block(handler.body, started))
        if node.finalbody:
            started = dict(env) if after is None else after
            finished = self._block(node.finalbody, started)
            return None if after is None else finished
        return after

    def _bind(self, target: ast.AST, value: Value | None, env: _Env) -> None:
        if isinstance(target, ast.Name):
            if value is None:
                env.pop(target.id, None)
            else:
                env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            parts: list[Value | None] = [None] * len(target.elts)
            if value is not None and value.kind == "clip" and len(parts) == 2:
                parts = [value.becomes("grads"), value.becomes("norm")]
            elif value is not None and value.kind == "grads":
                parts = [value.becomes("grad")] * len(parts)
            for element, part in zip(target.elts, parts):
                if isinstance(element, ast.Starred):
                    self._bind(element.value, None, env)
                else:
                    self._bind(element, part, env)
        else:
            # `grads[i] = ...`, `grads.x = ...`: the value is no longer sure.
            base = target
            while isinstance(base, (ast.Subscript, ast.Attribute,
                                    ast.Starred)):
                base = base.value
            if isinstance(base, ast.Name):
                env.pop(base.id, None)
            for child in ast.iter_child_nodes(target):
                if isinstance(child, ast.expr):
                    self._eval(child, env)

    def _bind_item(self, target: ast.AST, iterated: Value | None,
                   env: _Env) -> None:
        """Binds `target` to one item of what `iterated` iterates over."""
        if iterated is None:
            return
        if iterated.kind == "grads" and isinstance(target, ast.Name):
            env[target.id] = iterated.becomes("grad")
        elif (iterated.kind == "pairs"
              and isinstance(target, (ast.Tuple, ast.List))
              and len(target.elts) == 2
              and isinstance(target.elts[0], ast.Name)):
            env[target.elts[0].id] = iterated.becomes("grad")

    # Expressions.

    def _eval(self, node: ast.AST | None, env: _Env) -> Value | None:
        """The value of `node`, if known; records the events inside it."""
        if node is None:
            return None
        if isinstance(node, ast.Name):
            return env.get(node.id) if isinstance(node.ctx, ast.Load) else None
        if isinstance(node, ast.Call):
            return self._call(node, env)
        if isinstance(node, ast.Subscript):
            value = self._eval(node.value, env)
            self._eval(node.slice, env)
            if value is None:
                return None
            if isinstance(node.slice, ast.Slice):
                return value if value.kind in ("grads", "pairs") else None
            if value.kind == "grads":
                return value.becomes("grad")
            if value.kind == "clip" and isinstance(
                    node.slice, ast.Constant) and isinstance(node.slice.value,
                                                             int):
                return {0: value.becomes("grads"),
                        1: value.becomes("norm")}.get(node.slice.value)
            return None
        if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
            return self._comprehension(node, env)
        if isinstance(node, ast.DictComp):
            self._comprehension(node, env)
            return None
        if isinstance(node, ast.IfExp):
            self._eval(node.test, env)
            first = self._eval(node.body, env)
            second = self._eval(node.orelse, env)
            return first if first == second else None
        if isinstance(node, ast.NamedExpr):
            value = self._eval(node.value, env)
            self._bind(node.target, value, env)
            return value
        if isinstance(node, ast.Lambda):
            return None  # A scope of its own, run who knows when.
        for child in ast.iter_child_nodes(node):
            self._eval(child, env)
        return None

    def _comprehension(self, node: Any, env: _Env) -> Value | None:
        inner = dict(env)
        for generator in node.generators:
            iterated = self._eval(generator.iter, inner)
            self._bind(generator.target, None, inner)
            if len(node.generators) == 1:
                self._bind_item(generator.target, iterated, inner)
            for condition in generator.ifs:
                self._eval(condition, inner)
        if isinstance(node, ast.DictComp):
            self._eval(node.key, inner)
            self._eval(node.value, inner)
            return None
        element = self._eval(node.elt, inner)
        if len(node.generators) != 1:
            return None
        if element is not None and element.kind == "grad":
            return element.becomes("grads")
        if isinstance(node.elt, ast.Tuple) and len(node.elt.elts) == 2:
            first = self._eval(node.elt.elts[0], inner)
            if first is not None and first.kind == "grad":
                return first.becomes("pairs")
        return None

    def _argument(self, node: ast.Call, index: int,
                  keyword: str) -> ast.AST | None:
        if len(node.args) > index and not any(
                isinstance(a, ast.Starred) for a in node.args[:index + 1]):
            return node.args[index]
        for item in node.keywords:
            if item.arg == keyword:
                return item.value
        return None

    def _call(self, node: ast.Call, env: _Env) -> Value | None:
        values = {id(a): self._eval(a, env) for a in node.args}
        values.update({id(k.value): self._eval(k.value, env)
                       for k in node.keywords})
        self._eval(node.func, env)

        def value_of(index: int, keyword: str) -> Value | None:
            argument = self._argument(node, index, keyword)
            return None if argument is None else values.get(id(argument))

        func = node.func
        method = func.attr if isinstance(func, ast.Attribute) else None
        found = self._context.resolve(func)
        name = found[0] if found else None
        simple = len(node.args) == 1 and not node.keywords and not isinstance(
            node.args[0], ast.Starred)
        if method == "get_scaled_loss" and simple:
            return Value("loss", TF2)
        if method == "scale_loss" and simple:
            return Value("loss", KERAS3)
        if method == "gradient" or name in _GRADIENTS:
            target = value_of(0, "target" if method else "ys")
            if target is not None and target.kind == "loss":
                return Value("grads", target.protocol)
            return None
        if method == "get_unscaled_gradients":
            grads = value_of(0, "grads")
            if grads is None or grads.kind not in ("grads", "grad"):
                return None
            if grads.unscaled:
                self._event(node, "twice", grads)
            by = ast.dump(func.value) if isinstance(func,
                                                    ast.Attribute) else ""
            return dataclasses.replace(grads, kind="grads",
                                       unscaled=grads.unscaled + 1, by=by)
        if method == "apply_gradients":
            pairs = value_of(0, "grads_and_vars")
            if (pairs is not None and pairs.kind == "pairs"
                    and pairs.protocol == TF2 and pairs.scaled):
                self._event(node, "never", pairs)
            return None
        if method == "apply":
            grads = value_of(0, "grads")
            if (grads is not None and grads.kind == "grads" and grads.unscaled
                    and isinstance(func, ast.Attribute)
                    and grads.by == ast.dump(func.value)):
                self._event(node, "twice", grads)
            return None
        if name is not None and name.startswith(("tf.", "tf.compat.v1.")):
            last = name.rpartition(".")[2]
            if last in _CLIPS and name in (f"tf.{last}",
                                           f"tf.compat.v1.{last}"):
                return self._clip(node, values, last)
            if name in _NORMS:
                grads = value_of(0, "t_list" if "global" in name else "tensor")
                if grads is not None and grads.scaled and grads.kind in (
                        "grads", "grad"):
                    return grads.becomes("norm")
                return None
        if self._logs(func, name):
            if not _says_scaled(node):
                for argument in self._logged(node):
                    logged = self._eval_quietly(argument, env)
                    if logged is not None and logged.scaled:
                        self._event(node, "log", logged)
                        break
            return None
        if isinstance(func, ast.Name) and func.id not in self._context.names:
            if func.id in ("list", "tuple") and simple:
                return values.get(id(node.args[0]))
            if func.id == "zip" and node.args:
                first = values.get(id(node.args[0]))
                if first is not None and first.kind == "grads":
                    return first.becomes("pairs")
        return None

    def _clip(self, node: ast.Call, values: dict[int, Value | None],
              last: str) -> Value | None:
        argument = self._argument(node, 0, "t_list" if "global" in last
                                  else "t")
        grads = None if argument is None else values.get(id(argument))
        if grads is None or not grads.scaled or grads.kind not in ("grads",
                                                                   "grad"):
            return None
        others = [a for a in node.args if a is not argument] + [
            k.value for k in node.keywords if k.value is not argument]
        if _mentions_scale(others):
            return None  # A clip norm scaled as the gradients are.
        self._event(node, "clip", grads)
        return grads.becomes("clip" if last == "clip_by_global_norm"
                             else grads.kind)

    def _logs(self, func: ast.AST, name: str | None) -> bool:
        """Whether a call logs or prints its arguments."""
        if isinstance(func, ast.Name) and func.id == "print":
            return func.id not in self._context.names
        if name is None:
            return False
        return (name == "tf.print" or name.startswith(
            ("tf.summary.", "tf.compat.v1.summary.", "wandb.", "logging.",
             "absl.logging.", "mlflow.")))

    @staticmethod
    def _logged(node: ast.Call) -> Iterator[ast.AST]:
        """The expressions a logging call logs (dict values, f-strings)."""
        pending: list[ast.AST] = [*node.args,
                                  *(k.value for k in node.keywords)]
        while pending:
            argument = pending.pop(0)
            if isinstance(argument, ast.Dict):
                pending.extend(argument.values)
            elif isinstance(argument, (ast.Tuple, ast.List)):
                pending.extend(argument.elts)
            elif isinstance(argument, ast.JoinedStr):
                pending.extend(v.value for v in argument.values
                               if isinstance(v, ast.FormattedValue))
            elif isinstance(argument, ast.BinOp) and isinstance(
                    argument.op, ast.Mod):  # "norm %s" % norm
                pending.append(argument.right)
            else:
                yield argument

    def _eval_quietly(self, node: ast.AST, env: _Env) -> Value | None:
        """`_eval` without recording events again (they were, once)."""
        events = list(self.events)
        try:
            return self._eval(node, dict(env))
        finally:
            self.events = events

    def _event(self, node: ast.Call, what: str, value: Value) -> None:
        self.events.append(Event(node, what, _written(node.func),
                                 value.protocol))


def gradient_events(context: rule.Context) -> list[Event]:
    """The gradient flow's findings in the file, computed once per file."""
    notes = context.notes["_gradient_flow"]
    if "events" not in notes:
        flow = _Flow(context)
        flow.scope(context.tree.body)
        unique = {(id(e.node), e.what): e for e in flow.events}
        notes["events"] = sorted(unique.values(), key=lambda e: (
            e.node.lineno, e.node.col_offset))
    return notes["events"]
