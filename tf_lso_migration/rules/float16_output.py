"""`float16-output`: a float16 model output that a loss reads, under
`mixed_float16`.

The models of a file are followed statement by statement in each function
(and the module's own code): what builds them (`Sequential([...])`,
`model.add(layer)`, `Model(inputs, outputs)` with `outputs` from layer
calls, a subclass of `keras.Model` through its `call`, a function of the
file that returns one), and what reads their output: `compile(loss=...)`,
`fit`, or a loss called on `model(x)`. An `if` makes one alternative per
branch, each reported with its condition, less those that the call of a
function of the file rules out (`Net()` of `def Net(include_top=True)`);
after a loop, what the loop changed is not followed.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any
from typing import Union

from tf_lso_migration import rule
from tf_lso_migration.rules import _policies as mp

_SEQUENTIAL = frozenset({"tf.keras.Sequential", "tf.keras.models.Sequential"})
_MODEL = frozenset({"tf.keras.Model", "tf.keras.models.Model"})
# The layers that end a model with a prediction (a loss's input); a model
# that ends in pooling, flattening or dropout outputs features.
_PREDICTING = frozenset({
    "Dense", "EinsumDense", "Conv1D", "Conv2D", "Conv3D", "Convolution1D",
    "Convolution2D", "Convolution3D", "Conv1DTranspose", "Conv2DTranspose",
    "Conv3DTranspose", "Activation", "Softmax",
})
# Activations that compute probabilities, and the ops that do, in their
# input's dtype.
_PROBABILITIES = frozenset({"softmax", "sigmoid", "log_softmax"})
_ACTIVATIONS = frozenset({
    "tf.nn.softmax", "tf.math.softmax", "tf.nn.log_softmax",
    "tf.math.log_softmax", "tf.nn.sigmoid", "tf.math.sigmoid", "tf.sigmoid",
    "tf.keras.activations.softmax", "tf.keras.activations.sigmoid",
    "tf.keras.ops.softmax", "tf.keras.ops.sigmoid",
})
_FLOAT32 = frozenset({"tf.float32", "tf.dtypes.float32", "np.float32",
                      "numpy.float32"})
_TRAINS = frozenset({"fit", "fit_generator", "train_on_batch"})
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


@rule.register
class Float16Output(rule.Rule):
    """a model whose output a loss reads (`compile(loss=...)`, `fit`, a
    loss called on `model(x)`) computed in float16 by its last layer, in a
    file that sets the `mixed_float16` policy; `--fix` gives that layer
    `dtype='float32'`

    TensorFlow's mixed precision guide: under `mixed_float16` keep the
    model's output, and its last activation (softmax, sigmoid), in float32,
    or the loss loses precision and can overflow. Give the last layer
    `dtype='float32'`, or end the model with one more layer that does:

        tf.keras.layers.Dense(10),
        tf.keras.layers.Activation('softmax', dtype='float32'),

    A model is a `Sequential` (its list of layers, or the layers `add`ed),
    a `Model(inputs, outputs)` whose outputs come from layer calls (`x =
    Dense(10)(x)`, also under `if include_top:`, reported with its
    condition, unless the call that builds it rules that path out: `Net()`
    of `def Net(include_top=True)`), a subclass of `keras.Model` (what its
    `call` returns), or what a function of the same file returns; its
    output is read by a loss
    where the file compiles it with a loss, fits it, or calls a loss on
    `model(x)`. A cast of that output to float32 (`tf.cast(x,
    tf.float32)`, a float32 last layer) is what the guide asks for.

    Reported only where every global policy the file sets is
    `'mixed_float16'`, written out (set under an `if`, the finding names
    its test, but `__name__ == "__main__"`). Not reported: a model whose output no
    loss reads (an encoder feeding another model's head, a GAN's
    generator), a model ending in another kind of layer than a dense,
    convolution or activation layer (pooling: features), a layer with a
    `dtype` argument anywhere in its call, `Lambda` layers, multi-output
    models, models built or read in another file, and a last layer with
    another activation than softmax or sigmoid (a generator's bounded
    `tanh`, even where an L1 loss reads it; `relu`; an activation given by
    name), which is not the bug the guide means, or not sure. On the
    keras3 route a last layer without an activation (logits, a regression)
    is not reported either: Keras 3's losses convert what they read to
    float32 first (the guide still advises float32 there); on the tf-keras
    route, where losses compute in the output's dtype, it is. `--fix` adds
    `dtype="float32"` to a last layer built where the model is; where the
    layer is built elsewhere (`self.out = Dense(...)`, `head =
    Dense(...)`, then `head(x)`), is last on some
    paths only (built before an `if include_top:` that adds more), or the
    output is an op (`tf.nn.softmax(x)`), the message shows the corrected
    code.
    """

    id, severity = "float16-output", "warning"
    section = "Mixed-precision bugs"
    mentions = ("mixed_float16",)  # The policy, written out.
    fixes = True

    def finish(self, context):
        policy = mp.file_policy(context, "mixed_float16")
        if policy is None:
            return
        for output in float16_outputs(context, policy):
            context.report(output.node, self.id, _message(context, policy,
                                                          output),
                           fixable=output.inline)

    def fix(self, module, tree, cst, lines, route):
        """Gives the last layers on `lines` `dtype="float32"`."""
        context = rule.Context(tree, lambda *_: None, route,
                               source=module.code)
        policy = mp.file_policy(context, "mixed_float16")
        if policy is None:
            return module
        source = module.code.splitlines()
        where = set()
        for output in float16_outputs(context, policy):
            node = output.node
            if output.inline and node.lineno in lines:
                line = source[node.lineno - 1].encode("utf-8")
                where.add((node.lineno, len(line[:node.col_offset].decode(
                    "utf-8", "replace"))))
        return cst.metadata.MetadataWrapper(module).visit(
            _add_dtype(cst, where))


@dataclasses.dataclass(frozen=True)
class Alternative:
    """Where a tensor's dtype comes from, on one path.

    Attributes:
        node: The last layer's constructor call, or the op's call; None
            for float32 (a cast, a float32 layer).
        when: The path's conditions: ((test as written, holds), ...).
        inline: Whether the layer is built where the model is (so that
            `--fix` can give it a dtype); False for a layer built elsewhere
            and for an op.
        activation: What it computes: `softmax`, `sigmoid`, `log_softmax`,
            or `linear` (no probabilities: logits, a regression; reported
            only where losses compute in the output's dtype).
    """

    node: ast.Call | None
    when: tuple[tuple[str, bool], ...] = ()
    inline: bool = False
    activation: str = ""


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A tensor: its alternatives, and the model it is the output of."""

    alternatives: tuple[Alternative, ...]
    model: Model | None = None


@dataclasses.dataclass(frozen=True)
class Model:
    """A model: the alternatives of its output (empty: not known), and
    where it was built (two models built apart are two)."""

    alternatives: tuple[Alternative, ...]
    node: ast.AST


@dataclasses.dataclass(frozen=True)
class Layer:
    """A layer built here and named (`self.out = Dense(10)`, `head =
    Dense(10)`)."""

    node: ast.Call


_Value = Union[Tensor, Model, Layer]
_Env = dict[str, _Value]


@dataclasses.dataclass(frozen=True)
class Output:
    """A float16 output that a loss reads.

    Attributes:
        node: Its last layer's constructor call, or the op's call.
        when: The path it is on.
        inline: Whether `--fix` gives the layer a dtype.
        reader: What reads it, in words ("the loss given to
            `model.compile` (line 40)").
        activation: What it computes (`Alternative.activation`).
    """

    node: ast.Call
    when: tuple[tuple[str, bool], ...]
    inline: bool
    reader: str
    activation: str


def float16_outputs(context: rule.Context,
                    policy: mp.PolicySet) -> list[Output]:
    """The float16 outputs that a loss reads, in the file (once)."""
    notes = context.notes["float16-output"]
    if "outputs" not in notes:
        models = _Models(context)
        models.run()
        found: dict[int, Output] = {}
        for model, reader, fit in models.reads:
            if fit and id(model.node) in models.lossless:
                continue  # Fit with `add_loss` only: what it reads is not sure.
            for alternative in model.alternatives:
                node = alternative.node
                if alternative.activation == "linear" and (
                        context.route == "keras3"):
                    continue  # Keras 3's losses read it in float32.
                if (node is not None and id(node) not in found
                        and mp.runs_under(context, node, policy)):
                    found[id(node)] = Output(
                        node, mp.policy_path(context, node, policy)
                        + alternative.when, alternative.inline, reader,
                        alternative.activation)
        notes["outputs"] = sorted(found.values(), key=lambda o: (
            o.node.lineno, o.node.col_offset))
    return notes["outputs"]


def _message(context, policy, output):
    node = output.node
    if _layer_class(context, node.func) is None:
        what = (f"`{ast.unparse(node.func)}` computes this model's output "
                "in float16")
        instead = ("Compute it in float32: `" + ast.unparse(ast.Call(
            node.func, [_cast(node.args[0]), *node.args[1:]],
            node.keywords)) + "`.") if node.args else ""
    else:
        what = "This model's last layer computes in float16"
        instead = f"Give it `dtype='float32'`: `{_with_dtype(node)}`"
        fixed = output.inline and context.fixes
        instead += " (`--fix` does)." if fixed else "."
    loses = ("on tf_keras the loss computes in the output's dtype, so it"
             if output.activation == "linear"
             else f"the loss of its {output.activation}")
    text = (f"{what} under the 'mixed_float16' policy set at "
            f"{context.line(policy.node.lineno)}, and {output.reader} reads "
            f"its output: {loses} loses precision and can overflow. "
            f"{instead}").rstrip()
    when = mp.phrase(output.when)
    return when + text[0].lower() + text[1:] if when else text


def _cast(node):
    return ast.Call(ast.Attribute(ast.Name("tf", ast.Load()), "cast",
                                  ast.Load()),
                    [node, ast.Attribute(ast.Name("tf", ast.Load()),
                                         "float32", ast.Load())], [])


def _with_dtype(node):
    return ast.unparse(ast.Call(node.func, node.args, [
        *node.keywords, ast.keyword("dtype", ast.Constant("float32"))]))


def _add_dtype(cst, where):
    """A LibCST transformer: `dtype="float32"` added to the calls that
    start at the (line, column) pairs of `where`."""
    position = cst.metadata.PositionProvider

    class AddDtype(cst.CSTTransformer):
        METADATA_DEPENDENCIES = (position,)

        def leave_Call(self, original_node, updated_node):
            start = self.get_metadata(position, original_node).start
            if (start.line, start.column) not in where or isinstance(
                    original_node.func, cst.Call):  # Not `Dense()(x)`.
                return updated_node
            args = list(updated_node.args)
            new = cst.Arg(value=cst.SimpleString('"float32"'),
                          keyword=cst.Name("dtype"),
                          equal=cst.AssignEqual(
                              whitespace_before=cst.SimpleWhitespace(""),
                              whitespace_after=cst.SimpleWhitespace("")))
            if args and isinstance(args[-1].comma, cst.Comma):
                # A trailing comma: the new argument goes on its own line,
                # as the one before it is.
                before = args[-2].comma if len(args) > 1 else cst.Comma(
                    whitespace_after=cst.SimpleWhitespace(" "))
                new = new.with_changes(comma=args[-1].comma)
                args[-1] = args[-1].with_changes(comma=before)
            elif args:
                args[-1] = args[-1].with_changes(comma=cst.Comma(
                    whitespace_after=cst.SimpleWhitespace(" ")))
            return updated_node.with_changes(args=[*args, new])

    return AddDtype()


def _layer_class(context, node):
    """The Keras layer class `node` names (its last name), or None."""
    found = context.resolve(node)
    name = mp.behaviour(context, node) if found else None
    if name is None or not name.startswith("tf.keras.layers."):
        return None
    return name.rpartition(".")[2]


def _is_float32(context, node):
    if mp.string_argument(node) == "float32":
        return True
    return mp.behaviour(context, node) in _FLOAT32 if node else False


class _Models:
    """Follows the models of one file, and what reads their outputs."""

    def __init__(self, context: rule.Context) -> None:
        self._context = context
        #: (model, what reads it, whether it is `fit`), in source order.
        self.reads: list[tuple[Model, str, bool]] = []
        #: The models compiled without a loss (their `fit` reads nothing
        #: that is sure: `add_loss`).
        self.lossless: set[int] = set()
        self._module: _Env = {}  # The module's names, after its code.
        self._returns: dict[int, _Value | None] = {}
        self._models: dict[int, Model | None] = {}  # class -> its model
        self._self_layers: dict[int, dict[str, Layer | None]] = {}
        self._defs: dict[str, Any] = {}  # Module-level functions, classes.
        self._classes: dict[int, ast.ClassDef] = {}  # method -> its class
        for node in ast.walk(context.tree):
            if isinstance(node, ast.ClassDef):
                for method in node.body:
                    self._classes[id(method)] = node
        for node in context.tree.body:
            if isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
                self._defs[node.name] = node
        # Where the analysis is: the class of its method, and the names
        # local to its function (None for the module).
        self._owner: ast.ClassDef | None = None
        self._locals: set[str] | None = None

    def run(self) -> None:
        """Follows the module's code, then every function's."""
        tree = self._context.tree
        self._module = self._block(tree.body, {}, []) or {}
        for node in ast.walk(tree):
            if isinstance(node, _FUNCTIONS):
                self._function(node)

    def _function(self, node: Any) -> _Value | None:
        """Follows a function once; what it returns."""
        if id(node) in self._returns:
            return self._returns[id(node)]
        self._returns[id(node)] = None
        owner = self._classes.get(id(node))
        env: _Env = {}
        model = self._subclass(owner) if owner is not None else None
        if model is not None and node.args.args:
            env[node.args.args[0].arg] = model  # `self`
        saved = self._owner, self._locals
        self._owner, self._locals = owner, mp.local_names(node)
        try:
            returns: list[_Value | None] = []
            if self._block(node.body, env, returns) is not None:
                returns.append(None)
        finally:
            self._owner, self._locals = saved
        self._returns[id(node)] = (returns[0] if len(set(returns)) == 1
                                   else None)
        return self._returns[id(node)]

    def _subclass(self, node: ast.ClassDef) -> Model | None:
        """The model a subclass of `keras.Model` is (what its `call`
        returns), or None."""
        if id(node) in self._models:
            return self._models[id(node)]
        if not any(mp.behaviour(self._context, base) in _MODEL
                   for base in node.bases):
            self._models[id(node)] = None
            return None
        self._models[id(node)] = Model((), node)  # While `call` is read.
        call = next((f for f in node.body if isinstance(f, _FUNCTIONS)
                     and f.name == "call"), None)
        returned = None if call is None else self._function(call)
        self._models[id(node)] = Model(
            returned.alternatives if isinstance(returned, Tensor) else (),
            node)
        return self._models[id(node)]

    def _self_layer(self, node: ast.Attribute) -> Layer | None:
        """The layer `self.x` is in a method of the class that builds it."""
        if self._owner is None or mp.dotted(node) != f"self.{node.attr}":
            return None
        return self._layers(self._owner).get(node.attr)

    def _layers(self, owner: ast.ClassDef) -> dict[str, Layer | None]:
        """`self.x = Layer(...)` in a class's methods (None: assigned more
        than once, or not a layer)."""
        if id(owner) in self._self_layers:
            return self._self_layers[id(owner)]
        layers: dict[str, Layer | None] = {}
        for child in ast.walk(owner):
            if not isinstance(child, ast.Assign):
                continue
            for target in child.targets:
                if isinstance(target, ast.Attribute) and mp.dotted(
                        target) == f"self.{target.attr}":
                    value = child.value
                    layers[target.attr] = Layer(value) if (
                        target.attr not in layers
                        and isinstance(value, ast.Call)
                        and _layer_class(self._context, value.func)) else None
        self._self_layers[id(owner)] = layers
        return layers

    # Statements.

    def _block(self, body: list[ast.stmt], env: _Env | None,
               returns: list[_Value | None]) -> _Env | None:
        for statement in body:
            if env is None:
                return None
            env = self._statement(statement, dict(env), returns)
        return env

    def _statement(self, node: ast.stmt, env: _Env,
                   returns: list[_Value | None]) -> _Env | None:
        if isinstance(node, (*_FUNCTIONS, ast.ClassDef)):
            env.pop(node.name, None)
            return env
        if isinstance(node, ast.Assign):
            value = self._eval(node.value, env)
            for target in node.targets:
                for name in mp.names_stored(target):
                    env.pop(name, None)
                if isinstance(target, ast.Name) and value is not None:
                    env[target.id] = value
            return env
        if isinstance(node, ast.Return):
            returns.append(self._eval(node.value, env))
            return None
        if isinstance(node, ast.Raise):
            return None
        if isinstance(node, ast.If):
            self._eval(node.test, env)
            known = mp.truth(node.test)
            if known is not None:  # `if False:` never runs; `if True:` does.
                return self._block(node.body if known else node.orelse, env,
                                   returns)
            test, holds = node.test, True
            while isinstance(test, ast.UnaryOp) and isinstance(test.op,
                                                              ast.Not):
                test, holds = test.operand, not holds
            first = self._block(node.body, env, returns)
            second = self._block(node.orelse, env, returns)
            if not holds:
                first, second = second, first
            return _merge(first, second, ast.unparse(test), env)
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            self._eval(node.test if isinstance(node, ast.While)
                       else node.iter, env)
            after = _merge(env, self._block(node.body, env, returns))
            return self._block(node.orelse, after, returns)
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                self._eval(item.context_expr, env)
            return self._block(node.body, env, returns)
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            statement: Any = node
            after = self._block(statement.body + statement.orelse, env,
                                returns)
            for handler in statement.handlers:
                after = _merge(after, self._block(handler.body, env,
                                                  returns))
            return self._block(statement.finalbody, after, returns)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self._eval(child, env)
        for name in mp.names_stored(node):
            env.pop(name, None)
        return env

    # Expressions.

    def _eval(self, node: ast.AST | None, env: _Env) -> _Value | None:
        if node is None:
            return None
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            if self._locals is None or node.id in self._locals:
                return None
            return self._module.get(node.id)  # A global.
        if isinstance(node, ast.Attribute) and self._self_layer(node):
            return self._self_layer(node)
        if not isinstance(node, ast.Call):
            for child in ast.iter_child_nodes(node):
                self._eval(child, env)
            return None
        return self._call(node, env)

    def _call(self, node: ast.Call, env: _Env) -> _Value | None:
        arguments = [self._eval(a, env) for a in node.args]
        keywords = {k.arg: self._eval(k.value, env) for k in node.keywords}
        func = node.func
        receiver: _Value | None
        if isinstance(func, ast.Attribute):
            base = self._eval(func.value, env)
            if isinstance(base, Model) and func.attr in (
                    "add", "pop", "compile", *_TRAINS):
                self._method(node, func, base, env)
                return None
            receiver = self._self_layer(func)
        else:
            receiver = self._eval(func, env)
        self._loss_call(node, func, [*arguments, *keywords.values()])
        if isinstance(receiver, Model):  # model(x)
            return Tensor(receiver.alternatives, receiver)
        if isinstance(func, ast.Call) and _layer_class(self._context,
                                                       func.func):
            return Tensor((_layer(self._context, func, True),))  # Dense()(x)
        if isinstance(receiver, Layer):  # self.out(x), head(x)
            return Tensor((_layer(self._context, receiver.node, False),))
        if _layer_class(self._context, func):  # head = Dense(10)
            return Layer(node)
        name = mp.behaviour(self._context, func)
        if name is not None and name.rpartition(".")[2] == "cast":
            dtype = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "dtype"), None)
            return Tensor((Alternative(None),)) if _is_float32(
                self._context, dtype) else None
        if name in _ACTIVATIONS and arguments and isinstance(arguments[0],
                                                             Tensor):
            if any(a.node is not None for a in arguments[0].alternatives):
                return Tensor((Alternative(
                    node, activation=name.rpartition(".")[2]),))
            return arguments[0]
        if name in _SEQUENTIAL:
            layers = node.args[0] if node.args else next(
                (k.value for k in node.keywords if k.arg == "layers"), None)
            if layers is None:
                return Model((), node)
            if isinstance(layers, (ast.List, ast.Tuple)) and layers.elts:
                return Model(self._last(layers.elts[-1], env), node)
            return None
        if name in _MODEL:
            outputs = arguments[1] if len(arguments) > 1 else keywords.get(
                "outputs")
            if isinstance(outputs, Tensor):
                return Model(outputs.alternatives, node)
            return None
        if isinstance(func, ast.Name) and func.id not in env and (
                func.id in self._defs) and func.id not in (
                self._locals or ()):
            found = self._defs[func.id]
            if isinstance(found, ast.ClassDef):
                return self._subclass(found)
            returned = self._function(found)
            if isinstance(returned, Model):
                return _given(returned, found, node)
        return None

    def _last(self, node: ast.AST, env: _Env) -> tuple[Alternative, ...]:
        """The alternative a model's last layer (given as a layer) makes."""
        if isinstance(node, ast.Call) and _layer_class(self._context,
                                                       node.func):
            return (_layer(self._context, node, True),)
        value = self._eval(node, env)
        if isinstance(value, Layer):
            return (_layer(self._context, value.node, False),)
        return ()

    def _method(self, node: ast.Call, func: ast.Attribute, model: Model,
                env: _Env) -> None:
        """`model.add(layer)`, `pop()`, `compile(...)`, `fit(...)`."""
        if func.attr in ("add", "pop"):
            name = mp.dotted(func.value)
            if name is not None:
                env[name] = Model(
                    self._last(node.args[0], env)
                    if func.attr == "add" and node.args else (), model.node)
            return
        if func.attr == "compile":
            loss = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "loss"), None)
            if loss is None or (isinstance(loss, ast.Constant)
                                and loss.value is None):
                self.lossless.add(id(model.node))
            else:
                self._read(model, f"the loss given to `{ast.unparse(func)}` "
                           "({where})", node)
        else:
            self._read(model, f"the loss that `{ast.unparse(func)}` "
                       "({where}) trains with", node, fit=True)

    def _loss_call(self, node: ast.Call, func: ast.AST,
                   values: list[_Value | None]) -> None:
        """A loss called on a model's output (`loss(y, model(x))`) reads
        it; a cast of it (`loss(y, tf.cast(model(x), 'float32'))`) not."""
        called = (func.attr if isinstance(func, ast.Attribute) else
                  func.id if isinstance(func, ast.Name) else "").lower()
        if "loss" not in called and "entropy" not in called:
            return
        for value in values:
            if isinstance(value, Tensor) and value.model is not None:
                self._read(value.model, f"`{ast.unparse(func)}` ({{where}})",
                           node)

    def _read(self, model: Model, reader: str, node: ast.Call,
              fit: bool = False) -> None:
        """Records that `reader` ("... {where} ...") reads `model`'s
        output at `node`."""
        where = self._context.line(node.lineno)
        self.reads.append((model, reader.replace("{where}", where), fit))


def _layer(context, node, inline):
    """The alternative a layer's constructor call makes: float16 where it
    predicts probabilities or is linear and nothing in its call says a
    dtype (`dtype=`, `**kwargs`); else not reported (node None).

    On Keras 3 a loss converts what it reads to float32 first, so only a
    layer that computes probabilities (softmax, sigmoid) loses what the
    loss cannot get back; on tf_keras a loss computes in the output's
    dtype, so a linear output (logits, a regression) counts there too.
    Another activation (a GAN generator's bounded `tanh`, `relu`, one
    given by name) is not the bug the guide means, or not sure.
    """
    for child in ast.walk(node):
        if isinstance(child, ast.Call) and any(
                k.arg in (None, "dtype") for k in child.keywords):
            return Alternative(None)
    kind = _layer_class(context, node.func)
    if kind not in _PREDICTING:
        return Alternative(None)
    activation = _activation(context, node, kind)
    if activation != "linear" and activation not in _PROBABILITIES:
        return Alternative(None)
    return Alternative(node, (), inline, activation)


def _activation(context, node, kind):
    """The activation a predicting layer's constructor call gives it:
    `softmax` for `Softmax()`, `linear` for none, else its name
    (`'sigmoid'`, `tf.nn.tanh`), or "" where it is not known."""
    if kind == "Softmax":
        return "softmax"
    index = {"Activation": 0, "Dense": 1}.get(kind, len(node.args))
    activation = node.args[index] if len(node.args) > index else next(
        (k.value for k in node.keywords if k.arg == "activation"), None)
    if activation is None or (isinstance(activation, ast.Constant)
                              and activation.value is None):
        return "linear"
    name = mp.string_argument(activation)
    if name is None:
        name = (mp.behaviour(context, activation) or "").rpartition(".")[2]
    return name


def _merge(first, second, test=None, before=None):
    """What holds after either of two paths; with `test`, the first is
    where it holds, and `before` what held before the `if`."""
    if first is None:
        return second
    if second is None:
        return first
    merged = {}
    for name in first.keys() | second.keys():
        one, other = first.get(name), second.get(name)
        if one == other:
            merged[name] = one
        elif test is not None:
            value = _either(one, other, test, (before or {}).get(name))
            if value is not None:
                merged[name] = value
    return merged


def _either(one, other, test, before):
    """One value for `one` where `test` holds and `other` where not. What
    one path keeps from `before` is built on both: its layer is last on
    this path only, so `--fix` does not give it a dtype."""
    kinds = {type(v) for v in (one, other) if v is not None}
    if len(kinds) != 1 or Layer in kinds:
        return None
    alternatives = tuple(  # The outer `if`'s test first.
        dataclasses.replace(a, when=((test, holds), *a.when),
                            inline=a.inline and value != before)
        for value, holds in ((one, True), (other, False)) if value is not None
        for a in value.alternatives)
    if kinds == {Model}:
        node = (one or other).node
        return Model(alternatives, node)
    models = {v.model for v in (one, other) if v is not None}
    return Tensor(alternatives, models.pop() if len(models) == 1 else None)


def _given(model, function, call):
    """`model`, which `function` returns, less what is on a path that
    `call` rules out: `Net()` of `def Net(include_top=True)` has no path
    where `include_top` is false (a parameter the function never stores,
    given or left to a constant)."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
            k.arg is None for k in call.keywords):
        return model
    arguments = function.args
    positional = [a.arg for a in arguments.posonlyargs + arguments.args]
    given = mp.defaults(function)
    given.update(zip(positional, call.args))
    given.update((k.arg, k.value) for k in call.keywords)
    stored = {name for statement in function.body
              for name in mp.names_stored(statement)}
    truth = {name: mp.truth(value) for name, value in given.items()
             if name not in stored}
    return dataclasses.replace(model, alternatives=tuple(
        a for a in model.alternatives
        if all(truth.get(test, holds) in (holds, None)
               for test, holds in a.when)))
