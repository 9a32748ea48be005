"""The gradient flow behind `clip-before-unscale` and `unscale-once`.

Not a rule (it registers none): `gradient_events` runs once per file and
keeps its findings in `Context.notes`.

It follows values within each function (and the module's own code): a
loss scaled by `get_scaled_loss` (TF 2.x's protocol) or `scale_loss`
(Keras 3's), the gradients `tape.gradient` takes of it, and what they pass
through (assignments, tuple unpacking, `zip`, `list`, indexing,
comprehensions, `for` loops, element-wise ops such as `tf.where` and
`tf.cast`, a product or quotient with something that is not a number or a
loss scale) up to `get_unscaled_gradients` (or a division by
`opt.loss_scale`), `apply_gradients` or `apply`. Anything else done to a
value (an unknown call, an item assignment) stops following it.

Paths. A value made in one branch of an `if` (or of a conditional
expression) whose test reads only names, attributes, constants and calls
of them is followed on that branch's path: after `if self.mixed_precision:
loss = opt.get_scaled_loss(loss)` the loss is scaled *when
`self.mixed_precision` is true*; a later `if` with the same test (in the
same function, or on `self` in any method of the class) takes the same
path, and a finding on it names the condition. Where both branches make a
value and the two differ, it is followed no further; a store to a name
the test reads ends the path. A constant test is no path: `if False:`
and `while False:` never run, `if True:` always does.

Calls. A call of a function or method defined in the same file
(`helper(g)`, `self.helper(g)`) is that function, whatever its name, and
is followed one level down with the caller's values: what it returns,
and what it does to them (reported at the call); two levels down, what
it returns is not known. A protocol method's name called on another
object where a class of the file has a method of that name
(`averager.scale_loss(loss)`), or on `self` in a class that is not an
optimizer (inherited from another module), is not the protocol, and is
not followed. An optimizer named by a plain alias (`opt =
self.optimizer`) is the optimizer it names. Gradients accumulated with
`assign_add` into `tf.Variable`s held on `self` are followed into the
method of the same class that applies them.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

from tf_lso_migration import rule
from tf_lso_migration.rules import _policies as mp

TF2, KERAS3 = "tf2", "keras3"  # The protocols: who scaled the loss.

#: What a file mentions if the flow can find anything in it: a scaling call.
MENTIONS = ("scale_loss", "scaled_loss")

_CLIPS = frozenset({"clip_by_global_norm", "clip_by_norm", "clip_by_value",
                    "clip_by_average_norm"})
_NORMS = frozenset({"tf.linalg.global_norm", "tf.global_norm", "tf.norm",
                    "tf.linalg.norm", "tf.math.reduce_euclidean_norm"})
_GRADIENTS = frozenset({"tf.gradients", "tf.compat.v1.gradients"})
# The loss scaling protocol's methods, and what accumulates gradients.
_PROTOCOL = frozenset({
    "get_scaled_loss", "scale_loss", "gradient", "get_unscaled_gradients",
    "apply_gradients", "apply", "minimize", "assign_add", "assign",
    "assign_sub",
})
# Ops whose result is what their tensor argument was (scaled or not).
_ELEMENTWISE = frozenset({
    "tf.where", "tf.identity", "tf.cast", "tf.dtypes.cast",
    "tf.convert_to_tensor", "tf.reshape", "tf.ensure_shape",
    "tf.debugging.check_numerics", "tf.stop_gradient", "tf.keras.ops.where",
    "tf.keras.ops.cast", "tf.keras.ops.convert_to_tensor",
})
_TENSOR_KEYWORDS = frozenset({"x", "input", "value", "tensor"})
_OPERATORS: dict[str, ast.operator] = {
    **dict.fromkeys(("tf.math.divide", "tf.divide", "tf.math.truediv",
                     "tf.truediv", "tf.keras.ops.divide"), ast.Div()),
    **dict.fromkeys(("tf.math.multiply", "tf.multiply",
                     "tf.keras.ops.multiply"), ast.Mult()),
}
# The attributes that hold a loss scale optimizer's current scale (tf_lso's
# and TF 2.4's `loss_scale`, Keras 3's `dynamic_scale`).
_SCALE_ATTRIBUTES = frozenset({"loss_scale", "dynamic_scale"})
# What an `if` test may read for a path to follow it: values, not effects.
_STABLE = (ast.Name, ast.Attribute, ast.Constant, ast.Compare, ast.BoolOp,
           ast.UnaryOp, ast.Subscript, ast.Call, ast.keyword, ast.cmpop,
           ast.boolop, ast.unaryop, ast.expr_context)


@dataclasses.dataclass(frozen=True)
class Condition:
    """The test of an `if` that a path follows.

    Attributes:
        key: What makes two tests one: the test's `ast.dump`, and where it
            holds (its function's; its class's if it reads `self`; none if
            it reads only globals).
        text: The test as written, without its `not`.
        reads: The names and dotted names it reads.
        at: Where it is (line, column): an outer `if`'s comes first.
    """

    key: str
    text: str = dataclasses.field(compare=False)
    reads: frozenset[str] = dataclasses.field(compare=False)
    at: tuple[int, int] = dataclasses.field(compare=False)


#: A path's conditions: (condition, whether it holds) pairs, all true.
When = frozenset[tuple[Condition, bool]]


@dataclasses.dataclass(frozen=True)
class Value:
    """What the flow knows of a value.

    Attributes:
        kind: `loss` (a scaled loss), `grads` (gradients, any nest),
            `grad` (one gradient), `pairs` (gradient, variable) pairs,
            `norm` (a norm of gradients), `clip` (what
            `tf.clip_by_global_norm` returns: gradients and a norm);
            `alias` (a plain name for what `by` is), `scale` (a number
            that may be the loss scale).
        protocol: `TF2` or `KERAS3`: which call scaled the loss.
        unscaled: How many times the gradients were divided by the scale.
        by: Which optimizer (`_Flow._key`) scaled the loss, unscaled the
            gradients last, or the alias names.
        when: The path it holds on (empty: every path).
        via: Where the gradients were accumulated (`self.acc`), or "".
    """

    kind: str
    protocol: str = ""
    unscaled: int = 0
    by: str = ""
    when: When = frozenset()
    via: str = ""

    def becomes(self, kind: str) -> Value:
        return dataclasses.replace(self, kind=kind)

    def under(self, conditions: Any) -> Value:
        """The value on a path: with `conditions` (pairs) added."""
        return dataclasses.replace(self, when=self.when | frozenset(
            conditions))

    @property
    def scaled(self) -> bool:
        """Gradients (or their norm) still times the loss scale."""
        return self.kind in ("grads", "grad", "pairs", "norm", "clip") and (
            not self.unscaled)

    @property
    def gradients(self) -> bool:
        return self.kind in ("grads", "grad")


def _followed(value: Value | None) -> bool:
    """Whether a value is one the flow follows (not an alias or a scale,
    which only say what an untracked value names)."""
    return value is not None and value.kind not in ("alias", "scale")


@dataclasses.dataclass(frozen=True)
class Event:
    """A place where the flow found a bug.

    Attributes:
        node: Where (a call, or a division).
        what: `clip` (clipped before unscaling), `log` (logged before
            unscaling), `never` (applied never unscaled), `twice`
            (unscaled a second time), `scaled-twice` (a scaled loss scaled
            again).
        call: The function or method called there, as written.
        protocol: `TF2` or `KERAS3`.
        when: The path it is on, in words ("`mixed` is true"), or "".
        clip: For a clip, how it clips ("at 5.0", "to [-1.0, 1.0]"), or ""
            where that is not known.
        inside: For a call followed into, the call inside it that does it.
        via: Where the gradients were accumulated, or "".
    """

    node: ast.AST
    what: str
    call: str
    protocol: str
    when: str = ""
    clip: str = ""
    inside: str = ""
    via: str = ""


_Env = dict[str, Value]
_Held = tuple[int, str]  # An attribute of a class: (id of the class, `self.x`)
_Function = Any  # ast.FunctionDef or ast.AsyncFunctionDef
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _merge(first: _Env | None, second: _Env | None,
           test: tuple[Condition, bool] | None = None) -> _Env | None:
    """What holds after either of two paths (None: a path that ended).

    A value that only the first path (where `test` holds) or only the
    second makes holds on that path.
    """
    if first is None:
        return second
    if second is None:
        return first
    merged = {}
    for name in first.keys() | second.keys():
        one = _on_path(first.get(name), second.get(name), test)
        if one is not None:
            merged[name] = one
    return merged


def _on_path(one: Value | None, other: Value | None,
             test: tuple[Condition, bool] | None) -> Value | None:
    """One value for `one` where `test` holds and `other` where not: the
    same, or the one the flow follows on its path; else None."""
    if one == other:
        return one
    kinds = {value.kind for value in (one, other) if value is not None}
    if "scale" in kinds and not (_followed(one) or _followed(other)):
        return Value("scale")  # It may be the loss scale, on one path.
    if test is None:
        return None
    if _followed(one) and not _followed(other):
        return one.under({test})  # type: ignore[union-attr]
    if _followed(other) and not _followed(one):
        return other.under({(test[0], not test[1])})  # type: ignore[union-attr]
    return None


def _assume(env: _Env, test: tuple[Condition, bool] | None) -> _Env:
    """`env` on the path where `test` holds."""
    if test is None:
        return dict(env)
    condition, holds = test
    assumed = {}
    for name, value in env.items():
        if (condition, not holds) in value.when:
            continue  # Not on this path.
        assumed[name] = dataclasses.replace(
            value, when=value.when - {(condition, holds)})
    return assumed


def _reads(condition: Condition, stored: str) -> bool:
    """Whether a test reads `stored` (a name or dotted name)."""
    return any(read == stored or read.startswith(stored + ".")
               for read in condition.reads)


def _forget(env: _Env, stored: str) -> None:
    """Ends the paths whose test reads `stored`."""
    for name, value in list(env.items()):
        if any(_reads(condition, stored) for condition, _ in value.when):
            del env[name]


def _phrase(when: When) -> str:
    """The conditions of a path in words, outermost first."""
    return " and ".join(
        f"`{condition.text}` is {'true' if holds else 'false'}"
        for condition, holds in sorted(when, key=lambda c: c[0].at))


def _mentions_scale(nodes: Sequence[ast.AST]) -> bool:
    """Whether an expression names a scale (a clip norm times the scale)."""
    for node in nodes:
        for child in ast.walk(node):
            word = (child.id if isinstance(child, ast.Name) else
                    child.attr if isinstance(child, ast.Attribute) else "")
            if "scale" in word.lower():
                return True
    return False


def _scaled_too(nodes: Sequence[ast.AST], env: _Env) -> bool:
    """Whether expressions (a clip's other arguments) name the loss scale,
    or read a name that may hold it (`threshold = max_norm *
    opt.loss_scale`, `s = opt.loss_scale`)."""
    return _mentions_scale(nodes) or any(
        isinstance(child, ast.Name) and child.id in env and (
            env[child.id].kind == "scale" or env[child.id].kind == "alias"
            and "scale" in env[child.id].by.lower())
        for node in nodes for child in ast.walk(node))


def _says_scaled(call: ast.Call) -> bool:
    """Whether a logging call labels what it logs as scaled, on purpose."""
    return any(isinstance(c, ast.Constant) and isinstance(c.value, str)
               and "scal" in c.value.lower() for c in ast.walk(call))


def _is_zero(node: ast.AST | None) -> bool:
    """`0`, `tf.zeros_like(v)`, `tf.zeros(...)`: a reset."""
    if isinstance(node, ast.Constant):
        return node.value == 0
    return isinstance(node, ast.Call) and (
        mp.dotted(node.func) or "").rpartition(".")[2] in ("zeros_like",
                                                          "zeros")


def _written(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover - ast.unparse handles any tree.
        return "the call"


class _Flow:
    """Follows scaled losses and their gradients through one file.

    Args:
        context: The file.
        accumulators: What pass one found accumulated on `self` (`_held`
            -> the gradients), read as such in pass two.
    """

    def __init__(self, context: rule.Context,
                 accumulators: dict[_Held, Value] | None = None) -> None:
        self._context = context
        self.events: list[Event] = []  # The current analysis's.
        self._events: dict[int, list[Event]] = {}  # scope -> its events
        #: `_held` -> what `assign_add` put in it (None: unsure).
        self.accumulated: dict[_Held, Value | None] = {}
        self._accumulators = accumulators or {}
        # Where the analysis is: its function, whether it follows a call
        # (then the returns it collects, and the caller's arguments by
        # parameter), and the conditions of the path.
        self._function: ast.AST = context.tree
        self._depth = 0
        self._returns: list[tuple[Value | None, When]] | None = None
        self._arguments: dict[str, ast.AST] = {}
        self._path: When = frozenset()
        # Where the file's functions are.
        self._defs: dict[int, dict[str, _Function]] = {}
        self._parent: dict[int, ast.AST] = {}
        self._locals: dict[int, set[str]] = {}
        self._methods: set[str] = set()  # The names of the file's methods.
        self._index(context.tree.body, context.tree)
        self._tapes = _tapes(context.tree)

    def _index(self, body: list[ast.stmt], scope: ast.AST) -> None:
        """Records the functions defined in `body` (of `scope`)."""
        for node in body:
            if isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
                if isinstance(node, _FUNCTIONS):
                    self._defs.setdefault(id(scope), {})[node.name] = node
                    if isinstance(scope, ast.ClassDef):
                        self._methods.add(node.name)
                self._parent[id(node)] = scope
                self._index(node.body, node)
                continue
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, ()):
                    if isinstance(child, ast.ExceptHandler):
                        self._index(child.body, scope)
                    elif isinstance(child, ast.stmt):
                        self._index([child], scope)

    # Scopes and statements.

    def analyze(self, scope: ast.AST) -> list[Event]:
        """Follows the values of `scope` (the module or a function), once;
        its findings."""
        if id(scope) in self._events:
            return self._events[id(scope)]
        self._events[id(scope)] = []
        saved = (self._function, self._depth, self._returns,
                 self._arguments, self._path, self.events)
        self._function, self._depth, self._returns = scope, 0, None
        self._arguments, self._path, self.events = {}, frozenset(), []
        try:
            self._block(getattr(scope, "body", []), {})
            self._events[id(scope)] = self.events
        finally:
            (self._function, self._depth, self._returns, self._arguments,
             self._path, self.events) = saved
        return self._events[id(scope)]

    def all_events(self) -> list[Event]:
        """Every finding, sorted by position, each once."""
        unique = {(id(e.node), e.what): e
                  for events in self._events.values() for e in events}
        return sorted(unique.values(), key=lambda e: (
            e.node.lineno, e.node.col_offset))  # type: ignore[attr-defined]

    def _block(self, body: list[ast.stmt], env: _Env | None) -> _Env | None:
        for statement in body:
            if env is None:
                return None  # After a return: not reached.
            env = self._statement(statement, env)
        return env

    def _statement(self, node: ast.stmt, env: _Env) -> _Env | None:
        env = dict(env)
        if isinstance(node, _FUNCTIONS):
            for default in node.args.defaults + node.args.kw_defaults:
                if default is not None:
                    self._eval(default, env)
            self.analyze(node)  # A scope of its own.
            env.pop(node.name, None)
            return env
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                if isinstance(statement, _FUNCTIONS):
                    self.analyze(statement)
            env.pop(node.name, None)
            return env
        if isinstance(node, ast.Assign):
            value = self._eval(node.value, env) or self._plain(node.value,
                                                               env)
            for target in node.targets:
                self._bind(target, value, env)
            return env
        if isinstance(node, ast.AnnAssign):
            value = self._eval(node.value, env) if node.value else None
            self._bind(node.target, value, env)
            return env
        if isinstance(node, ast.AugAssign):
            self._eval(node.value, env)
            scaled = _scaled_too([node.target, node.value], env)
            self._bind(node.target, Value("scale") if scaled else None, env)
            return env
        if isinstance(node, ast.Expr):
            self._eval(node.value, env)
            return env
        if isinstance(node, ast.Return):
            value = self._eval(node.value, env)
            if self._returns is not None:
                self._returns.append((value, self._path))
            return None
        if isinstance(node, ast.Raise):
            for child in ast.iter_child_nodes(node):
                self._eval(child, env)
            return None
        if isinstance(node, (ast.Break, ast.Continue)):
            return None
        if isinstance(node, ast.If):
            self._eval(node.test, env)
            known = mp.truth(node.test)
            if known is not None:  # `if False:` never runs; `if True:` does.
                return self._block(node.body if known else node.orelse, env)
            test = self._condition(node.test)
            return _merge(self._branch(node.body, env, test),
                          self._branch(node.orelse, env, test and (
                              test[0], not test[1])), test)
        if isinstance(node, (ast.For, ast.AsyncFor)):
            iterated = self._eval(node.iter, env)
            inside = dict(env)
            self._bind(node.target, None, inside)
            self._bind_item(node.target, iterated, inside)
            after = _merge(env, self._block(node.body, inside))
            for name in mp.names_stored(node):
                if after is not None and after.get(name) != env.get(name):
                    after.pop(name, None)
            return self._block(node.orelse, after) if after else after
        if isinstance(node, ast.While):
            self._eval(node.test, env)
            if mp.truth(node.test) is False:  # `while False:` never runs.
                return self._block(node.orelse, env)
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
        for name in mp.names_stored(node):
            self._bind(ast.Name(name, ast.Store()), None, env)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                env.pop((alias.asname or alias.name).split(".")[0], None)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self._eval(child, env)
            elif isinstance(child, ast.stmt):
                self._statement(child, dict(env))
        return env

    def _branch(self, body: list[ast.stmt], env: _Env,
                test: tuple[Condition, bool] | None) -> _Env | None:
        """A branch of an `if`, on the path where `test` holds."""
        saved = self._path
        if test is not None:
            self._path = saved | {test}
        try:
            return self._block(body, _assume(env, test))
        finally:
            self._path = saved

    def _try(self, node: Any, env: _Env) -> _Env | None:
        """A `try` (or `try`/`except*`): the body, or any handler after
        part of it, then `finally`."""
        after = self._block(node.body, dict(env))
        after = self._block(node.orelse, after) if after else after
        for handler in node.handlers:
            started = dict(env)
            for name in mp.names_stored(node):
                started.pop(name, None)
            after = _merge(after, self._block(handler.body, started))
        if node.finalbody:
            started = dict(env) if after is None else after
            finished = self._block(node.finalbody, started)
            return None if after is None else finished
        return after

    def _condition(self, test: ast.expr) -> tuple[Condition, bool] | None:
        """The condition an `if` test is, and whether it holds in the
        body; None for a test a path cannot follow."""
        holds = True
        while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            test, holds = test.operand, not holds
        reads = set()
        for child in ast.walk(test):
            if not isinstance(child, _STABLE) or (
                    isinstance(child, ast.UnaryOp)
                    and not isinstance(child.op, (ast.Not, ast.USub))):
                return None
            if isinstance(child, (ast.Name, ast.Attribute)):
                reads.add(mp.dotted(child) or "")
        roots = {read.split(".")[0] for read in reads if read}
        own = roots & self._local_names(self._function)
        where = ("" if not own else f"class {id(self._class())}"
                 if own == {"self"} and self._class() is not None
                 else f"function {id(self._function)}")
        at = (test.lineno, test.col_offset)
        return Condition(f"{ast.dump(test)} in {where}", _written(test),
                         frozenset(reads), at), holds

    def _local_names(self, function: ast.AST) -> set[str]:
        """The parameters and names a function stores (the module's: none
        apart from globals, which are the same everywhere)."""
        if not isinstance(function, _FUNCTIONS):
            return set()
        if id(function) not in self._locals:
            self._locals[id(function)] = mp.local_names(function)
        return self._locals[id(function)]

    def _held(self, node: ast.AST) -> _Held:
        """Where an attribute is held: its class's id, and `self.acc`."""
        return id(self._class()), mp.dotted(node) or ""

    def _class(self) -> ast.ClassDef | None:
        """The class whose method the analyzed function is, if any."""
        parent = self._parent.get(id(self._function))
        return parent if isinstance(parent, ast.ClassDef) else None

    def _bind(self, target: ast.AST, value: Value | None, env: _Env) -> None:
        if isinstance(target, ast.Name):
            _forget(env, target.id)
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
            stored = mp.dotted(target)
            if stored is not None:
                _forget(env, stored)
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

    def _plain(self, node: ast.AST, env: _Env) -> Value | None:
        """What an untracked value still says: an alias of a dotted name
        (`opt = self.optimizer`), or a number that may be the loss scale."""
        if mp.dotted(node) is not None:
            return Value("alias", by=self._key(node, env))
        if _scaled_too([node], env):
            return Value("scale")
        return None

    def _key(self, node: ast.AST, env: _Env) -> str:
        """Which object an expression names, aliases resolved: its dotted
        name (`self.optimizer`), else its `ast.dump`."""
        if isinstance(node, ast.Name):
            value = env.get(node.id)
            if value is not None and value.kind == "alias":
                return value.by
        return mp.dotted(node) or ast.dump(node)

    # Expressions.

    def _eval(self, node: ast.AST | None, env: _Env) -> Value | None:
        """The value of `node`, if known; records the events inside it."""
        if node is None:
            return None
        if isinstance(node, ast.Name):
            return env.get(node.id) if isinstance(node.ctx, ast.Load) else None
        if isinstance(node, ast.Attribute):
            self._eval(node.value, env)
            if isinstance(node.ctx, ast.Load):
                return self._accumulators.get(self._held(node))
            return None
        if isinstance(node, ast.Call):
            return self._call(node, env)
        if isinstance(node, ast.BinOp):
            left = self._eval(node.left, env)
            right = self._eval(node.right, env)
            return self._arithmetic(node, node.op, (node.left, left),
                                    (node.right, right), env)
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
            known = mp.truth(node.test)
            if known is not None:
                return self._eval(node.body if known else node.orelse, env)
            test = self._condition(node.test)
            first = self._eval(node.body, _assume(env, test))
            second = self._eval(node.orelse, _assume(env, test and (
                test[0], not test[1])))
            return _on_path(first, second, test)
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
            # A test of each element (`x if x is not None else None`) is
            # not a path of the list.
            targets = set(mp.names_stored(node.generators[0].target))
            return dataclasses.replace(element, kind="grads", when=frozenset(
                (condition, holds) for condition, holds in element.when
                if not any(_reads(condition, t) for t in targets)))
        if isinstance(node.elt, ast.Tuple) and len(node.elt.elts) == 2:
            first = self._eval_quietly(node.elt.elts[0], inner)
            if first is not None and first.kind == "grad":
                return first.becomes("pairs")
        return None

    def _arithmetic(self, node: ast.AST, op: ast.operator,
                    left: tuple[ast.AST, Value | None],
                    right: tuple[ast.AST, Value | None],
                    env: _Env) -> Value | None:
        """`left op right`: gradients times or divided by something keep
        what they are, unless it is a number or may be the loss scale;
        divided by an optimizer's `loss_scale` they are unscaled."""
        (left_node, left_value), (right_node, right_value) = left, right
        if not isinstance(op, (ast.Mult, ast.Div)):
            return None
        if left_value is not None and left_value.gradients:
            grads, other_node, other = left_value, right_node, right_value
        elif (isinstance(op, ast.Mult) and right_value is not None
              and right_value.gradients):
            grads, other_node, other = right_value, left_node, left_value
        else:
            return None
        by = self._loss_scale_of(other_node, env)
        if isinstance(op, ast.Div) and other_node is right_node and by:
            if grads.unscaled:
                self._event(node, "twice", grads)
            return dataclasses.replace(grads, unscaled=grads.unscaled + 1,
                                       by=by)
        if other is not None or _mentions_scale([other_node]) or any(
                isinstance(n, ast.Constant) for n in ast.walk(other_node)):
            return None  # Maybe the loss scale, or a number: not sure.
        return grads

    def _loss_scale_of(self, node: ast.AST, env: _Env) -> str:
        """The optimizer whose loss scale `node` reads (`opt.loss_scale`,
        `opt.loss_scale()`, cast), or ""."""
        if isinstance(node, ast.Call) and (
                not node.args or self._name(node.func) in _ELEMENTWISE):
            node = node.args[0] if node.args else node.func
        if isinstance(node, ast.Attribute) and node.attr in _SCALE_ATTRIBUTES:
            return self._key(node.value, env)
        return ""

    def _name(self, node: ast.AST) -> str | None:
        found = self._context.resolve(node)
        return found[0] if found else None

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
        func = node.func
        self._eval(func.value if isinstance(func, ast.Attribute) else func,
                   env)
        method = func.attr if isinstance(func, ast.Attribute) else None
        name = self._name(func)
        if name in _GRADIENTS:
            method = "gradient"  # tf.gradients(ys, xs)
        followed = self._follow(node, values, env)  # The file's own first.
        if followed is not None:
            return followed[0]
        if method in _PROTOCOL and self._is_protocol(node, method):
            return self._protocol(node, method, values, env)
        return self._library(node, name, values, env)

    def _is_protocol(self, node: ast.Call, method: str) -> bool:
        """Whether a call of a protocol method's name (not of the file's
        own, `_follow`) is the protocol's: not where a class of the file
        has a method of that name (`averager.scale_loss(loss)`), nor on
        `self` in a class that is not an optimizer (a method it inherits
        from another module); a scaling call takes the loss alone."""
        if method in ("get_scaled_loss", "scale_loss") and not (
                len(node.args) == 1 and not node.keywords
                and not isinstance(node.args[0], ast.Starred)):
            return False  # PyTorch's apex: `amp.scale_loss(loss, opt)`.
        if not isinstance(node.func, ast.Attribute):
            return True  # tf.gradients(ys, xs)
        if method == "gradient" and mp.dotted(node.func.value) in self._tapes:
            return True  # A tape's, whatever the file's classes have.
        if method in self._methods:
            return False
        owner = self._class()
        return mp.dotted(node.func.value) != "self" or (
            owner is not None and any(
                "Optimizer" in _written(base) for base in owner.bases))

    def _value_of(self, node: ast.Call, values: dict[int, Value | None],
                  index: int, keyword: str) -> Value | None:
        argument = self._argument(node, index, keyword)
        return None if argument is None else values.get(id(argument))

    def _protocol(self, node: ast.Call, method: str,
                  values: dict[int, Value | None], env: _Env) -> Value | None:
        """A call of the loss scaling protocol: scale, take gradients,
        unscale, apply, minimize, accumulate."""
        func = node.func
        receiver = self._key(func.value, env) if isinstance(
            func, ast.Attribute) else ""
        if method in ("get_scaled_loss", "scale_loss"):
            loss = values.get(id(node.args[0]))
            if loss is not None and loss.kind == "loss" and (
                    loss.by == receiver):
                self._event(node, "scaled-twice", loss)
            return Value("loss", TF2 if method == "get_scaled_loss"
                         else KERAS3, by=receiver)
        if method == "gradient":  # tape.gradient(target), tf.gradients(ys)
            target = (self._value_of(node, values, 0, "target")
                      or self._value_of(node, values, 0, "ys"))
            if target is not None and target.kind == "loss":
                return target.becomes("grads")
            return None
        if method == "get_unscaled_gradients":
            grads = self._value_of(node, values, 0, "grads")
            if grads is None or not grads.gradients:
                return None
            if grads.unscaled:
                self._event(node, "twice", grads)
            return dataclasses.replace(grads, kind="grads",
                                       unscaled=grads.unscaled + 1,
                                       by=receiver)
        if method == "apply_gradients":
            pairs = self._value_of(node, values, 0, "grads_and_vars")
            if pairs is None or pairs.kind != "pairs":
                return None
            if pairs.protocol == TF2 and pairs.scaled:
                self._event(node, "never", pairs)
            elif (pairs.protocol == KERAS3 and pairs.unscaled
                  and pairs.by == receiver):  # It unscales after scale_loss.
                self._event(node, "twice", pairs)
        elif method == "apply":
            grads = self._value_of(node, values, 0, "grads")
            if (grads is not None and grads.kind == "grads" and grads.unscaled
                    and grads.by == receiver):
                self._event(node, "twice", grads)
        elif method == "minimize":
            loss = self._callable_loss(self._argument(node, 0, "loss"), env)
            if loss is not None and loss.kind == "loss" and (
                    loss.by == receiver):
                self._event(node, "scaled-twice", loss)
        else:  # assign_add, assign, assign_sub
            self._accumulate(node, method,
                             self._value_of(node, values, 0, "value"))
        return None

    def _library(self, node: ast.Call, name: str | None,
                 values: dict[int, Value | None], env: _Env) -> Value | None:
        """A call of TensorFlow, a logger, another module or a builtin."""
        func = node.func
        method = func.attr if isinstance(func, ast.Attribute) else None
        if name is not None and name.startswith(("tf.", "tf.compat.v1.")):
            last = name.rpartition(".")[2]
            if last in _CLIPS and name in (f"tf.{last}",
                                           f"tf.compat.v1.{last}"):
                return self._clip(node, values, last, env)
            if name in _NORMS:
                grads = self._value_of(node, values, 0, "t_list"
                                       if "global" in name else "tensor")
                if grads is not None and grads.scaled and grads.gradients:
                    return grads.becomes("norm")
                return None
        if name in _ELEMENTWISE:
            return self._elementwise(node, name, values)
        if name in _OPERATORS and len(node.args) == 2:
            left, right = node.args
            return self._arithmetic(node, _OPERATORS[name],
                                    (left, values.get(id(left))),
                                    (right, values.get(id(right))), env)
        if isinstance(func, ast.Attribute) and method in (
                "value", "read_value") and not node.args:
            return self._eval_quietly(func.value, env)
        if self._logs(func, name):
            if not _says_scaled(node):
                for argument in self._logged(node):
                    logged = self._eval_quietly(argument, env)
                    if logged is not None and logged.scaled:
                        self._event(node, "log", logged)
                        break
            return None
        called = (method or (func.id if isinstance(func, ast.Name)
                             else "")).lower()
        if "clip" in called and "scale" not in called:
            self._named_clip(node, values, env)
            return None
        if isinstance(func, ast.Name) and func.id not in self._context.names:
            if func.id in ("list", "tuple") and len(node.args) == 1:
                return values.get(id(node.args[0]))
            if func.id == "zip" and node.args:
                first = values.get(id(node.args[0]))
                if first is not None and first.kind == "grads":
                    return first.becomes("pairs")
        return None

    def _elementwise(self, node: ast.Call, name: str,
                     values: dict[int, Value | None]) -> Value | None:
        """`tf.where(c, g, 0)`, `tf.cast(g, ...)`: what the tensor was."""
        if name.endswith(".where"):  # Any argument but the condition.
            tensors = [*node.args[1:], *(k.value for k in node.keywords
                                         if k.arg != "condition")]
        else:  # The first: `tf.cast(x=g, ...)`, `tf.identity(input=g)`.
            tensors = [*node.args[:1], *(k.value for k in node.keywords if
                                         k.arg in _TENSOR_KEYWORDS)]
        found = {values.get(id(a)) for a in tensors} - {None}
        return found.pop() if len(found) == 1 else None

    def _callable_loss(self, node: ast.AST | None, env: _Env) -> Value | None:
        """What a loss callable returns: a lambda's body, or a function of
        this file's returns."""
        if isinstance(node, ast.Lambda):
            return self._eval_quietly(node.body, env)
        if not isinstance(node, ast.expr):
            return None
        call = ast.copy_location(ast.Call(node, [], []), node)
        followed = self._follow(call, {}, env)
        return followed[0] if followed else None

    def _accumulate(self, node: ast.Call, method: str,
                    value: Value | None) -> None:
        """`self.acc[i].assign_add(g)`: gradients accumulated on `self`."""
        base = node.func
        while isinstance(base, (ast.Subscript, ast.Attribute)) and (
                base is node.func or isinstance(base, ast.Subscript)):
            base = base.value
        where = self._held(base)
        if not where[1].startswith("self."):
            return
        argument = self._argument(node, 0, "value")
        if method == "assign" and _is_zero(argument):
            return  # A reset.
        if method == "assign_add" and value is None:
            return  # Not gradients (a step counter).
        held: Value | None = None  # Changed otherwise: not sure.
        if method == "assign_add" and value is not None and value.gradients:
            held = value.becomes("grads").under(self._path)
        if self.accumulated.get(where, held) != held:
            held = None
        self.accumulated[where] = held

    def _clip(self, node: ast.Call, values: dict[int, Value | None],
              last: str, env: _Env) -> Value | None:
        argument = self._argument(node, 0, "t_list" if "global" in last
                                  else "t")
        grads = None if argument is None else values.get(id(argument))
        if grads is None or not grads.scaled or not grads.gradients:
            return None
        others = [a for a in node.args if a is not argument] + [
            k.value for k in node.keywords if k.value is not argument]
        if _scaled_too(others, env):
            return None  # A clip norm scaled as the gradients are.
        if last == "clip_by_value":
            low = self._argument(node, 1, "clip_value_min")
            high = self._argument(node, 2, "clip_value_max")
            clip = "" if low is None or high is None else (
                f"to {self._text(low, high)}")
        else:
            norm = self._argument(node, 1, "clip_norm")
            clip = "" if norm is None else f"at {self._text(norm)}"
        self._event(node, "clip", grads, clip=clip)
        return grads.becomes("clip" if last == "clip_by_global_norm"
                             else grads.kind)

    def _named_clip(self, node: ast.Call, values: dict[int, Value | None],
                    env: _Env) -> None:
        """A call whose name says it clips, given scaled gradients: a clip,
        unless it is also given the scale, or given or called on the
        optimizer that scaled the loss or what holds it (`self._clip(g)`
        with `self.optimizer`): then it may unscale first. What it returns
        is not known."""
        arguments = [*node.args, *(k.value for k in node.keywords)]
        func = node.func
        for argument in arguments:
            grads = values.get(id(argument))
            if grads is not None and grads.scaled and grads.gradients:
                others = [a for a in arguments if a is not argument]
                if isinstance(func, ast.Attribute):
                    others.append(func.value)
                if not _scaled_too(others, env) and not any(
                        grads.by == key or grads.by.startswith(key + ".")
                        for key in (self._key(a, env) for a in others)):
                    self._event(node, "clip", grads)
                return

    def _text(self, *nodes: ast.AST) -> str:
        """How a message shows arguments (a parameter of a followed call as
        the caller wrote it): numbers as they are, code in backticks."""
        texts, numbers = [], True
        for node in nodes:
            sign = ""
            if isinstance(node, ast.UnaryOp) and isinstance(
                    node.op, ast.USub) and isinstance(node.operand, ast.Name):
                sign, node = "-", node.operand
            if isinstance(node, ast.Name):
                node = self._arguments.get(node.id, node)
            numbers = numbers and all(
                isinstance(n, (ast.Constant, ast.UnaryOp, ast.unaryop))
                for n in ast.walk(node))
            texts.append(sign + _written(node))
        text = f"[{', '.join(texts)}]" if len(texts) > 1 else texts[0]
        return text if numbers else f"`{text}`"

    # Calls of the file's own functions.

    def _callee(self, func: ast.AST) -> tuple[_Function, bool] | None:
        """The function of this file a call calls, and whether it is bound
        (a method called on `self`)."""
        if isinstance(func, ast.Attribute) and mp.dotted(func) == (
                f"self.{func.attr}"):
            method = self._defs.get(id(self._class()), {}).get(func.attr)
            if method is None:
                return None
            static = any(mp.dotted(d) == "staticmethod"
                         for d in method.decorator_list)
            return method, not static
        if isinstance(func, ast.Name):
            scope: ast.AST | None = self._function
            while scope is not None:
                if not isinstance(scope, ast.ClassDef):
                    found = self._defs.get(id(scope), {}).get(func.id)
                    if found is not None:
                        return found, False
                    if func.id in self._local_names(scope):
                        return None  # A parameter or a local, not a def.
                scope = self._parent.get(id(scope))
        return None

    def _follow(self, node: ast.Call, values: dict[int, Value | None],
                env: _Env) -> tuple[Value | None] | None:
        """A call of a function of this file, followed one level down with
        the caller's values: (what it returns,), or None for a call of
        another function. Two levels down, what it returns is not known.

        What it does to those values is reported at the call; what it does
        on its own is reported where it does it.
        """
        found = self._callee(node.func)
        if found is None:
            return None
        if self._depth:
            return (None,)
        function, bound = found
        arguments = self._parameters(function, bound, node)
        if arguments is None:
            return (None,)
        own = {(id(e.node), e.what) for e in self.analyze(function)}
        bindings = {}
        for parameter, argument in arguments.items():
            value = values.get(id(argument)) or self._plain(argument, env)
            if value is not None:
                bindings[parameter] = value
        saved = (self._function, self._depth, self._returns,
                 self._arguments, self._path, self.events)
        self._function, self._depth, self._returns = function, 1, []
        self._arguments = {**mp.defaults(function), **arguments}
        self._path, self.events = frozenset(), []
        try:
            if self._block(function.body, bindings) is not None:
                self._returns.append((None, frozenset()))
            returned, found_events = _returned(self._returns), self.events
        finally:
            (self._function, self._depth, self._returns, self._arguments,
             self._path, self.events) = saved
        for event in found_events:
            if (id(event.node), event.what) not in own:
                self.events.append(dataclasses.replace(
                    event, node=node, call=_written(node.func),
                    inside=event.inside or event.call))
        return (returned,)

    @staticmethod
    def _parameters(function: _Function, bound: bool,
                    node: ast.Call) -> dict[str, ast.AST] | None:
        """The arguments of a call by parameter; None if not sure."""
        arguments = function.args
        positional = [a.arg for a in arguments.posonlyargs + arguments.args]
        if bound:
            positional = positional[1:]
        names = set(positional) | {a.arg for a in arguments.kwonlyargs}
        if any(isinstance(a, ast.Starred) for a in node.args) or any(
                k.arg is None for k in node.keywords) or len(
                node.args) > len(positional):
            return None
        given = dict(zip(positional, node.args))
        for keyword in node.keywords:
            if keyword.arg is None or keyword.arg not in names:
                return None
            given[keyword.arg] = keyword.value
        return given

    # Logging.

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

    def _event(self, node: ast.AST, what: str, value: Value,
               clip: str = "") -> None:
        call = node.func if isinstance(node, ast.Call) else node
        self.events.append(Event(node, what, _written(call), value.protocol,
                                 _phrase(value.when), clip, via=value.via))


def _tapes(tree: ast.AST) -> set[str]:
    """The names the file binds to a tape (`with tf.GradientTape() as
    tape:`, `tape = tf.GradientTape()`)."""
    tapes: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.With, ast.AsyncWith)):
            pairs = [(item.optional_vars, item.context_expr)
                     for item in node.items]
        elif isinstance(node, ast.Assign):
            pairs = [(target, node.value) for target in node.targets]
        else:
            continue
        tapes.update(target.id for target, value in pairs
                     if isinstance(target, ast.Name)
                     and isinstance(value, ast.Call)
                     and (mp.dotted(value.func) or "").endswith("GradientTape"))
    return tapes


def _returned(returns: list[tuple[Value | None, When]]) -> Value | None:
    """What a function returns, from its `return`s (value, path): one
    value on every path, or one value on its path where the others return
    what is not followed."""
    returns = [(None if value is None or value.kind in ("alias", "scale")
                else value, path) for value, path in returns]
    values = {value for value, _ in returns}
    if len(values) == 1:
        return values.pop()
    known = values - {None}
    if len(known) != 1:
        return None
    [value] = known
    paths = {path for returned, path in returns if returned == value}
    if value is None or len(paths) != 1 or not next(iter(paths)):
        return None
    return value.under(paths.pop())


def on_path(event: Event, message: str) -> str:
    """`message`, said of the path `event` is on."""
    if not event.when:
        return message
    return f"When {event.when}, {message[0].lower()}{message[1:]}"


def inside(event: Event) -> str:
    """For a call followed into, the call inside it, in a few words."""
    return f" (it calls `{event.inside}`)" if event.inside else ""


def gradient_events(context: rule.Context) -> list[Event]:
    """The gradient flow's findings in the file, computed once per file."""
    notes = context.notes["_gradient_flow"]
    if "events" not in notes:
        flow = _Flow(context)
        flow.analyze(context.tree)
        accumulated = {where: dataclasses.replace(value, via=where[1])
                       for where, value in flow.accumulated.items() if value}
        if accumulated:  # Again, reading what was accumulated.
            flow = _Flow(context, accumulated)
            flow.analyze(context.tree)
        notes["events"] = flow.all_events()
    return notes["events"]
