"""`float16-output`: a model ending in a float16 layer under `mixed_float16`."""

import ast

from tf_lso_migration import rule
from tf_lso_migration.rules import _policies as mp

_SEQUENTIAL = frozenset({"tf.keras.Sequential", "tf.keras.models.Sequential"})
_MODEL = frozenset({"tf.keras.Model", "tf.keras.models.Model"})
# Layers whose output dtype is not simply the policy's: what they return
# is up to the code they run.
_NOT_SURE = frozenset({"Lambda", "TFOpLambda"})
_FLOAT32 = frozenset({"tf.float32", "tf.dtypes.float32", "np.float32",
                      "numpy.float32"})


@rule.register
class Float16Output(rule.Rule):
    """a `Sequential` or functional model whose last layer has no
    `dtype='float32'`, in a file that sets the `mixed_float16` policy, so
    that the model's output is float16

    TensorFlow's mixed precision guide: under `mixed_float16` keep the
    model's output, and its last activation (softmax, sigmoid), in float32,
    or the loss loses precision and can overflow. Give the last layer
    `dtype='float32'`, or end the model with one more layer that does:

        tf.keras.layers.Dense(10),
        tf.keras.layers.Activation('softmax', dtype='float32'),

    Reported only where every global policy the file sets is
    `'mixed_float16'`, written out; for a `Sequential` given its layers as
    a list (and not `add`ed to), and a `Model(inputs, outputs)` whose
    outputs come from a layer call in the same function. A layer with a
    `dtype` argument anywhere in its call, `Lambda` layers, and files that
    cast something to float32 (`tf.cast(outputs, 'float32')` does what a
    float32 last layer would) are not reported.
    """

    id, severity = "float16-output", "warning"
    section = "Mixed-precision bugs"

    def finish(self, context):
        policy = mp.file_policy(context, "mixed_float16")
        if policy is None or _casts_to_float32(context):
            return
        for scope in [context.tree, *(
                n for n in ast.walk(context.tree)
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
            for layer in _last_layers(context, scope):
                if mp.runs_under(context, layer, policy):
                    context.report(layer, self.id, (
                        "This model's last layer computes in float16 under "
                        "the 'mixed_float16' policy set at "
                        f"{context.line(policy.node.lineno)}, so the model's "
                        "output is "
                        "float16: the loss (softmax, cross-entropy) loses "
                        "precision and can overflow. Give it "
                        "`dtype='float32'`, or end the model with "
                        "`tf.keras.layers.Activation('linear', "
                        "dtype='float32')`."))


def _casts_to_float32(context):
    """Whether the file casts something to float32 (`tf.cast(x, 'float32')`,
    `keras.ops.cast`): a model's float16 output may be cast by hand."""
    for node in ast.walk(context.tree):
        if not isinstance(node, ast.Call):
            continue
        name = mp.behaviour(context, node.func)
        if name is None or name.rpartition(".")[2] != "cast":
            continue
        for argument in node.args[1:] + [k.value for k in node.keywords]:
            if mp.string_argument(argument) == "float32" or (
                    mp.behaviour(context, argument) in _FLOAT32):
                return True
    return False


def _own_nodes(scope):
    """The nodes of `scope`'s own code (not of functions inside it)."""
    pending = list(ast.iter_child_nodes(scope))
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.Lambda, ast.ClassDef)):
            continue
        yield node
        pending.extend(ast.iter_child_nodes(node))


def _last_layers(context, scope):
    """The last layer calls of the models `scope` builds."""
    nodes = list(_own_nodes(scope))
    added = {n.func.value.id for n in nodes
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr in ("add", "pop")
             and isinstance(n.func.value, ast.Name)}
    for node in nodes:
        if not isinstance(node, ast.Call):
            continue
        name = mp.behaviour(context, node.func)
        if name in _SEQUENTIAL:
            if _assigned_to(nodes, node) & added:
                continue  # Layers are added later: the last is elsewhere.
            layers = node.args[0] if node.args else next(
                (k.value for k in node.keywords if k.arg == "layers"), None)
            if isinstance(layers, (ast.List, ast.Tuple)) and layers.elts:
                last = layers.elts[-1]
                if _float16_layer(context, last):
                    yield last
        elif name in _MODEL:
            outputs = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "outputs"), None)
            call = _layer_output(nodes, outputs, node)
            if call is not None and _float16_layer(context, call.func):
                yield call.func


def _assigned_to(nodes, call):
    """The names the value of `call` is assigned to."""
    return {t.id for n in nodes if isinstance(n, ast.Assign)
            and n.value is call for t in n.targets if isinstance(t, ast.Name)}


def _layer_output(nodes, outputs, model_call):
    """The `layer(...)(x)` call that `outputs` is, or was last assigned
    (once, before the model) in the same function; else None."""
    if isinstance(outputs, ast.Name):
        stores = [n for n in nodes if isinstance(n, ast.Name)
                  and n.id == outputs.id
                  and isinstance(n.ctx, (ast.Store, ast.Del))]
        assigns = [n for n in nodes if isinstance(n, ast.Assign)
                   and len(n.targets) == 1 and isinstance(n.targets[0],
                                                          ast.Name)
                   and n.targets[0].id == outputs.id]
        if len(stores) != 1 or len(assigns) != 1 or (
                assigns[0].lineno > model_call.lineno):
            return None
        outputs = assigns[0].value
    if isinstance(outputs, ast.Call) and isinstance(outputs.func, ast.Call):
        return outputs
    return None


def _float16_layer(context, node):
    """Whether `node` builds a Keras layer that computes in the policy's
    dtype: a known layer class, and no `dtype` anywhere in the call."""
    if not isinstance(node, ast.Call):
        return False
    name = mp.behaviour(context, node.func)
    if name is None or not name.startswith("tf.keras.layers."):
        return False
    if name.rpartition(".")[2] in _NOT_SURE:
        return False
    for child in ast.walk(node):
        if isinstance(child, ast.Call) and any(
                k.arg in (None, "dtype") for k in child.keywords):
            return False
    return True
