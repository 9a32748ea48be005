"""`legacy-name`: TF 2.1-2.4 mixed-precision names, and their rewrite.

Reported wherever a legacy name is imported or spelled out (not at each
use of a name imported from a legacy module: at its import). `--fix`
rewrites each one that tf_lso provides (`legacy_names`) with LibCST,
losslessly: only the legacy names, and the imports that bring them in,
change. A name tf_lso does not provide is left, with the imports it is
used through (`rule.unprovided_aliases`).
"""

import ast
import itertools

from tf_lso_migration import legacy_names
from tf_lso_migration import rule

EXPERIMENTAL_LSO = "tf_lso.experimental.LossScaleOptimizer"
# TF 2.4's class, whose name is Keras 3's class on TensorFlow 2.16+: legacy
# only where the file uses what Keras 3's class lacks.
KERAS3_LSO = "tf.keras.mixed_precision.LossScaleOptimizer"
# (Not `loss_scale`: configs and policies have one too.)
_TF24_ATTRIBUTES = ("get_scaled_loss", "get_unscaled_gradients",
                    "dynamic_counter")
_TF24_KEYWORDS = ("dynamic", "loss_scale")


@rule.register
class LegacyName(rule.Rule):
    """a TF 2.1-2.4 mixed-precision name that TensorFlow 2.16+ no longer
    has (or, for `tf.keras.mixed_precision.LossScaleOptimizer` whose object
    the file uses with TF 2.4's API, has with Keras 3's different one);
    `--fix` rewrites it to tf_lso's where tf_lso provides it

    TF 2.1-2.3's `tf.keras.mixed_precision.experimental` module and the
    loss scale classes `tf.mixed_precision.experimental.*` and
    `tf.train.experimental.*` (`LossScale`, `FixedLossScale`,
    `DynamicLossScale`) are gone from TensorFlow 2.16+; TF 2.x's private
    `tensorflow.python.keras` modules are a frozen copy whose optimizers
    neither Keras 3 nor tf_keras accept. tf_lso has each of them under
    `tf_lso.experimental` (TF 2.1-2.3's API), and TF 2.4's
    `LossScaleOptimizer(opt, dynamic, initial_scale, dynamic_growth_steps)`
    as `tf_lso.LossScaleOptimizer`. `--fix` rewrites the names and the
    imports that bring them in, and nothing else; `python -m tf_lso run
    script.py` runs the script unchanged with the names provided.

    A name tf_lso does not provide (`LossScaleGradientTape`) is not fixable:
    replace it by hand. `tf.keras.mixed_precision.LossScaleOptimizer` (also
    spelled `keras.mixed_precision.LossScaleOptimizer`) is Keras 3's class
    on TensorFlow 2.16+, and `LossScaleOptimizer(opt, initial_scale=1024)`
    is valid Keras 3 code: it is reported only where the file gives the
    call, or the object it builds, what Keras 3's class lacks (`dynamic=`,
    `loss_scale=`, a bool or a string as its second positional argument;
    `get_scaled_loss`, `get_unscaled_gradients`, `dynamic_counter`), and on
    the tf_keras route never (there it is tf_keras's own, TF 2.4's class).
    A number there is Keras 3's `initial_scale`: not reported, and where
    the file is reported otherwise, `--fix` leaves the name. A method
    counts only on a name or attribute that the file binds to that object
    (`opt = LossScaleOptimizer(opt)`, `self.opt = ...`: a name in its
    function, else in the module), on a model's `optimizer` where
    `compile` is given it, or on `x` under `if isinstance(x, <Keras 3's
    class>):`; not on one that the file also binds to tf_lso's
    or tf_keras's class, nor on a parameter, an alias (`optimizer =
    self.optimizer`) or an object of the file's own class. Nor in code
    written for both classes: on an object the file also calls Keras 3's
    `scale_loss` on, under an `if` that asks which class or version it has
    (`hasattr`, `getattr`, `isinstance` of another class, the method's
    name as a string,
    `tf.__version__`, or a name set from one of those: `if KERAS3:`), after
    such an `if` that returns or raises, or in a `try` that catches
    AttributeError (or every error). Where it is not sure, it is silent.

    In a file that calls `tf_lso.install()`, the names it provides work as
    written after that call (after it in the same function, also in a
    function defined there after it, or in any function where the call is
    in the module's code): each is a note
    (`info`) that says what it runs as. A name used before the call, or in
    another function than the one that calls it, and TF's private modules
    (which `install()` does not provide), stay errors.
    """

    id, severity = "legacy-name", "error"
    section = "Old call → new call"
    visits = (ast.Import, ast.ImportFrom, ast.Attribute, ast.Name)
    # Every legacy name and module is in one of these modules.
    mentions = ("experimental", "mixed_precision")
    fixes = True

    def visit(self, node, context):
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                self._import(node, legacy_names.canonical(alias.name),
                             context, local if alias.asname else None,
                             alias.name)
        elif isinstance(node, ast.ImportFrom):
            self._import_from(node, context)
        elif isinstance(node, ast.Attribute) or isinstance(node.ctx,
                                                           ast.Load):
            if self._spelled_out(node, context):
                return rule.SkipChildren
        return None

    def _spelled_out(self, node, context):
        """Reports `node` if it spells a legacy name; True if it did."""
        found = context.resolve(node)
        if found is None:
            return False
        name, base = found
        if not legacy_names.is_legacy_on(name, context.route):
            return False
        new = legacy_names.replacement(name)
        if new is None:  # Inside a legacy module, not provided.
            self._not_provided(node, name, context)
            return True
        if legacy_names.is_legacy(base):
            return False  # Reported where the legacy base was imported.
        return self._legacy(node, name, new, ast.unparse(node), context)

    def _legacy(self, node, name, new, written, context, fixable=True,
                note=""):
        """Reports the legacy name `name` (spelled `written`) at `node`, as
        the file uses it; True if it did."""
        evidence = _tf24_evidence(context) if name == KERAS3_LSO else None
        keras3_call = evidence and context.notes["legacy-name"]["keras3_call"]
        if keras3_call:
            fixable = False
            note += (" `--fix` leaves it: the call at "
                     f"{context.line(keras3_call[0].lineno)} passes Keras 3's "
                     "`initial_scale` as its second positional argument, "
                     "which would be TF 2.4's `dynamic`.")
        install = _install(context)
        installed = install is not None and legacy_names.installed(name)
        after = installed and _runs_after(install, node, context)
        if name == KERAS3_LSO and not evidence and not after:
            return False  # Keras 3's class, as Keras 3 code uses it.
        if after:
            line = context.line(install.lineno)
            if name == KERAS3_LSO and not evidence:
                context.report(node, self.id, _under_install(written, line),
                               fixable=False, severity="info")
            else:
                rewrite = ("`--fix` writes that name, so that the file runs"
                           if context.fixes and fixable
                           else "Written so, the file runs")
                context.report(node, self.id, (
                    f"`{name}` runs as `{new}` under `tf_lso.install()` "
                    f"({line}). {rewrite} without `install()` too.{note}"),
                    fixable=fixable, severity="info")
            return True
        message = _message(name, new, context.route)
        if evidence:
            message = (f"On TensorFlow 2.16+ `{written}` is Keras 3's class, "
                       f"which {evidence}: TF 2.4's class is "
                       "`tf_lso.LossScaleOptimizer`.")
        if installed:
            message += _before_install(install, node, context)
        elif install is not None:
            message += (f" `tf_lso.install()` ({context.line(install.lineno)})"
                        " does not provide TF's private modules.")
        context.report(node, self.id, message + note, fixable=fixable)
        return True

    def _not_provided(self, node, name, context):
        context.report(node, self.id, f"`{name}` no longer exists on "
                       "TensorFlow 2.16+, and tf_lso does not provide it: "
                       "replace it by hand (`--fix` leaves it).",
                       fixable=False)

    def _import_from(self, node, context):
        if not node.module or node.level:
            return
        module = legacy_names.canonical(node.module)
        if module in legacy_names.LEGACY_MODULES:
            provided = [a for a in node.names
                        if legacy_names.replacement(f"{module}.{a.name}")]
            for alias in node.names:
                if alias not in provided and alias.name != "*":
                    self._not_provided(node, f"{module}.{alias.name}",
                                       context)
            if len(provided) == 1:
                self._import(node, f"{module}.{provided[0].name}", context,
                             written=f"{node.module}.{provided[0].name}")
            elif provided:
                self._import(node, module, context, written=node.module)
            return
        for alias in node.names:
            self._import(node, f"{module}.{alias.name}", context,
                         alias.asname or alias.name,
                         written=f"{node.module}.{alias.name}")

    def _import(self, node, name, context, local=None, written=None):
        new = legacy_names.replacement(name)
        if new is None or not legacy_names.is_legacy_on(name, context.route):
            return
        fixable, note = local not in context.unprovided, ""
        if not fixable:
            note = (f" `--fix` leaves this import: names that tf_lso does "
                    f"not provide are used through `{local}`.")
        self._legacy(node, name, new, written or name, context, fixable, note)

    def fix(self, module, tree, cst, lines, route):
        """Rewrites the provided legacy names on `lines` (and their imports)."""
        return _fix_module(module, tree, cst, lines, route)


def _tf24_evidence(context):
    """Where the file uses what Keras 3's LossScaleOptimizer lacks and TF
    2.4's has, as the end of a sentence about Keras 3's class ("has no
    `get_scaled_loss` (line 30)"), or None; found once per file.

    A TF 2.4 method counts on the object built from Keras 3's class only
    (`_holds_keras3`), or on what `if isinstance(x, <that class>):` says is
    one (`_narrowed`); not in code that asks which class it has
    (`_unguarded`), and not on an object that the file also calls Keras 3's
    `scale_loss` on (code for both). A second positional argument other
    than a bool or a string is no evidence (Keras 3's `initial_scale`, or
    not sure). `notes["keras3_call"]`: the first call that passes one.
    """
    notes = context.notes["legacy-name"]
    if "evidence" in notes:
        return notes["evidence"]
    both = {ast.unparse(node.value) for node in ast.walk(context.tree)
            if isinstance(node, ast.Attribute) and node.attr == "scale_loss"}
    narrowed = _narrowed(context)
    found, keras3 = [], []
    for node in _unguarded(context):
        if isinstance(node, ast.Attribute) and isinstance(
                node.ctx, ast.Load) and node.attr in _TF24_ATTRIBUTES and (
                ast.unparse(node.value) not in both) and (
                ast.unparse(node.value) in narrowed.get(id(node), ())
                or _holds_keras3(node.value, context)):
            found.append((node, f"has no `{node.attr}`"))
        elif isinstance(node, ast.Call) and _built(node, context) == [
                KERAS3_LSO]:
            for keyword in node.keywords:
                if keyword.arg in _TF24_KEYWORDS:
                    found.append((node, f"takes no `{keyword.arg}=`"))
            if len(node.args) < 2:
                continue
            if isinstance(node.args[1], ast.Constant) and isinstance(
                    node.args[1].value, (bool, str)):
                found.append((node, "takes `initial_scale` as its second "
                                    "positional argument, not TF 2.4's "
                                    "`dynamic`"))
            else:
                keras3.append(node)
    first = _first(found)
    notes["evidence"] = None if first is None else (
        f"{first[1]} ({context.line(first[0].lineno)})")
    notes["keras3_call"] = _first((node, "") for node in keras3)
    return notes["evidence"]


def _first(found):
    return min(found, key=lambda f: (f[0].lineno, f[0].col_offset),
               default=None)


def _holds_keras3(receiver, context):
    """Whether `receiver` (`opt`, `self._opt`, `model.optimizer`) holds the
    object built from Keras 3's class, by what the file binds to it: some
    assignment builds one, and none builds tf_lso's or tf_keras's class. A
    name is looked up in its function, then the enclosing ones, then the
    module (a parameter of that name is another object); an attribute in
    the whole file. A model's `optimizer` that the file never assigns
    holds it where `compile` is given it."""
    values = _bound(receiver, context)
    if values is not None:
        return _keras3(values, context)
    return (isinstance(receiver, ast.Attribute)
            and receiver.attr == "optimizer" and _compiled_keras3(context))


def _keras3(values, context):
    built = [name for value in values for name in _built(value, context)]
    return KERAS3_LSO in built and not any(
        name.startswith(("tf_lso.", "tf_keras.")) for name in built)


def _built(value, context):
    """The dotted names of what `value` may build (both sides of an `if`
    expression; "" for what is not a call)."""
    if isinstance(value, ast.IfExp):
        return _built(value.body, context) + _built(value.orelse, context)
    if isinstance(value, ast.Call):
        return [(context.resolve(value.func) or ("",))[0]]
    return [""]


def _compiled_keras3(context):
    """Whether a `compile` call of the file is given the object built from
    Keras 3's class (as its first argument or `optimizer=`); found once."""
    notes = context.notes["legacy-name"]
    if "compiled" not in notes:
        notes["compiled"] = any(
            _keras3(_bound(given, context) or [given], context)
            for node in ast.walk(context.tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "compile"
            for given in [*node.args[:1], *(keyword.value
                                            for keyword in node.keywords
                                            if keyword.arg == "optimizer")])
    return notes["compiled"]


def _bound(receiver, context):
    """The values bound to `receiver` (None in a value: not an assignment's,
    a parameter say), or None if the file binds nothing to it."""
    bindings = _bindings(context)
    if isinstance(receiver, ast.Attribute):
        return bindings.get((None, ast.unparse(receiver)))
    if not isinstance(receiver, ast.Name):
        return None
    scopes, scope = _scopes(context), _scopes(context)[id(receiver)]
    while (scope, receiver.id) not in bindings and scope is not context.tree:
        scope = scopes[id(scope)]
    return bindings.get((scope, receiver.id))


def _bindings(context):
    """(scope, name) -> the values bound to the name in that function (or
    the module); (None, `self.opt`) -> those bound to an attribute, in the
    whole file. Found once per file."""
    notes = context.notes["legacy-name"]
    if "bindings" not in notes:
        values = {id(target): node.value for node in ast.walk(context.tree)
                  if isinstance(node, (ast.Assign, ast.AnnAssign))
                  for target in (node.targets if isinstance(node, ast.Assign)
                                 else [node.target])}
        scopes, bindings = _scopes(context), {}
        for node in ast.walk(context.tree):
            if isinstance(node, ast.arg):
                key = (scopes[id(node)], node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                key = (scopes[id(node)], node.id)
            elif isinstance(node, ast.Attribute) and isinstance(
                    node.ctx, ast.Store):
                key = (None, ast.unparse(node))
            else:
                continue
            bindings.setdefault(key, []).append(values.get(id(node)))
        notes["bindings"] = bindings
    return notes["bindings"]


def _narrowed(context):
    """id(node) -> what an `if isinstance(x, <Keras 3's class>):` (or an
    `and` of tests with one) around it says is Keras 3's object (`x`, as
    written)."""
    narrowed = {}
    for node in ast.walk(context.tree):
        if not isinstance(node, (ast.If, ast.IfExp)):
            continue
        tests = node.test.values if isinstance(node.test, ast.BoolOp) and (
            isinstance(node.test.op, ast.And)) else [node.test]
        texts = {ast.unparse(test.args[0]) for test in tests
                 if _isinstance_keras3(test, context)}
        if not texts:
            continue
        for statement in node.body if isinstance(node, ast.If) else [
                node.body]:
            for child in ast.walk(statement):
                narrowed.setdefault(id(child), set()).update(texts)
    return narrowed


def _isinstance_keras3(test, context):
    """Whether `test` is `isinstance(x, <Keras 3's class>)`."""
    return isinstance(test, ast.Call) and isinstance(
        test.func, ast.Name) and test.func.id == "isinstance" and len(
        test.args) == 2 and (context.resolve(test.args[1]) or ("",))[
        0] == KERAS3_LSO


def _unguarded(context):
    """The nodes of the file, less the code that asks which class it has:
    an `if` whose test does (`_asks`), the rest of a block after such an
    `if` that returns or raises, and a `try` that catches AttributeError
    (or any error)."""
    tree = context.tree
    flags = {target.id for node in ast.walk(tree)
             if isinstance(node, ast.Assign) and _asks(node.value, (), context)
             for target in node.targets if isinstance(target, ast.Name)}
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.If, ast.IfExp)) and _asks(node.test, flags,
                                                           context):
            continue
        if isinstance(node, ast.Try) and any(
                handler.type is None or any(
                    isinstance(name, ast.Name) and name.id in (
                        "AttributeError", "Exception", "BaseException")
                    for name in ast.walk(handler.type))
                for handler in node.handlers):
            continue
        yield node
        for _, value in ast.iter_fields(node):
            if isinstance(value, ast.AST):
                pending.append(value)
            elif isinstance(value, list):
                for child in value:
                    if isinstance(child, ast.AST):
                        pending.append(child)
                    if isinstance(child, ast.If) and _asks(
                            child.test, flags, context) and isinstance(
                            child.body[-1], (ast.Return, ast.Raise)):
                        break  # The rest runs only on one class.


def _asks(test, flags, context):
    """Whether `test` asks which class an object is, or which version runs:
    `hasattr`, `getattr`, `isinstance` (but of Keras 3's class, which says
    which it is), a TF 2.4 method's name, a version (`tf.__version__`,
    `version.parse`), or a name in `flags` (set from one of those: `KERAS3
    = tf.__version__ >= "2.16"`)."""
    for node in ast.walk(test):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
                node.func.id in ("hasattr", "getattr", "isinstance")) and (
                not _isinstance_keras3(node, context)):
            return True
        if isinstance(node, ast.Constant) and node.value in _TF24_ATTRIBUTES:
            return True
        name = (node.id if isinstance(node, ast.Name) else
                node.attr if isinstance(node, ast.Attribute) else "")
        if "version" in name.lower() or name in flags:
            return True
    return False


def _install(context):
    """The first `tf_lso.install()` call of the file, or None; found once."""
    notes = context.notes["legacy-name"]
    if "install" not in notes:
        notes["install"] = min(
            (node for node in ast.walk(context.tree)
             if isinstance(node, ast.Call)
             and (context.resolve(node.func) or ("",))[0] == "tf_lso.install"),
            key=lambda node: (node.lineno, node.col_offset), default=None)
    return notes["install"]


def _runs_after(install, node, context):
    """Whether `node` runs after the `install` call: after it in the same
    function (or the module's code), also in a function defined there
    after it, or in any function where the call is in the module's code
    (functions run later)."""
    where = _scopes(context)[id(install)]
    inner = _within(node, where, context)
    if where is context.tree and inner is not node:
        return True
    return inner is not None and (
        (install.lineno, install.col_offset) < (inner.lineno, inner.col_offset))


def _within(node, where, context):
    """What of the code of `where` (a function, or the module) holds
    `node`: `node` itself, or the function defined there that it is in;
    None if `node` is not in `where`."""
    scopes = _scopes(context)
    while scopes[id(node)] is not where:
        if scopes[id(node)] is context.tree:
            return None
        node = scopes[id(node)]
    return node


def _before_install(install, node, context):
    """Why `node`, which `install` provides, is not known to run after it."""
    line = context.line(install.lineno)
    inner = _within(node, _scopes(context)[id(install)], context)
    if inner is node:
        return f" It runs before `tf_lso.install()` ({line}), which provides it."
    where = ("in a function defined before" if inner is not None
             else "not in the function that calls")
    return (f" It is {where} `tf_lso.install()` ({line}), which provides it, "
            "so it is not known to run after that call.")


def _scopes(context):
    """id(node) -> the function (or lambda) it is in, or the module; found
    once per file."""
    notes = context.notes["legacy-name"]
    if "scopes" not in notes:
        scopes, pending = {}, [(context.tree, context.tree)]
        while pending:
            node, scope = pending.pop()
            scopes[id(node)] = scope
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                 ast.Lambda)):
                scope = node
            pending.extend((child, scope)
                           for child in ast.iter_child_nodes(node))
        notes["scopes"] = scopes
    return notes["scopes"]


def _under_install(written, line):
    return (f"Under `tf_lso.install()` ({line}) `{written}` is "
            "`tf_lso.LossScaleOptimizer`, TF 2.4's class, not Keras 3's: its "
            "second positional argument is `dynamic`, and `iterations` counts "
            "the steps it skips. `keras.optimizers.LossScaleOptimizer` stays "
            "Keras 3's.")


def _message(name, new, route):
    if name == "tf.keras.mixed_precision.LossScaleOptimizer":
        return ("On TensorFlow 2.16+ `tf.keras.mixed_precision."
                "LossScaleOptimizer` is Keras 3's class (no `dynamic`, no "
                "`get_scaled_loss`); TF 2.4's is `tf_lso.LossScaleOptimizer`.")
    message = f"`{name}` no longer exists on TensorFlow 2.16+; use `{new}`."
    if route == "tf-keras" and new == EXPERIMENTAL_LSO:
        message += (" On tf_keras it also trains tf_keras models in "
                    "`compile`/`fit` (docs/routes.md); tf_keras's own "
                    "`tf.keras.mixed_precision.LossScaleOptimizer` is TF "
                    "2.4's API.")
    return message


# -- The rewrite (LibCST) -----------------------------------------------------


def _dotted(node, cst):
    parts = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


def _moved_alias(alias, new, cst, keep_comma):
    """`alias` importing `new`'s last part, bound to the same local name."""
    parent, _, last = new.rpartition(".")
    name = _dotted(alias.name, cst)
    changes = {"name": cst.Name(last)}
    if alias.asname is None and name != last:
        changes["asname"] = cst.AsName(name=cst.Name(name))
    if not keep_comma:
        changes["comma"] = cst.MaybeSentinel.DEFAULT
    return parent, alias.with_changes(**changes)


def _import_line(parent, aliases, cst):
    """`from parent import aliases`; `import aliases` for a top-level
    module (`parent` empty: TF 2.4's private module is `tf_lso`)."""
    if not parent:
        return cst.SimpleStatementLine(body=[cst.Import(names=aliases)])
    return cst.SimpleStatementLine(body=[cst.ImportFrom(
        module=cst.parse_expression(parent), names=aliases)])


def _transformer(cst, names, unprovided, lines, route):
    """The rewrite of the legacy names (on `route`) that start on `lines`."""
    position = cst.metadata.PositionProvider

    class Transformer(cst.CSTTransformer):
        METADATA_DEPENDENCIES = (position,)

        def _new(self, node, dotted):
            """`dotted`'s tf_lso name if it is rewritten at `node`, or None."""
            if not (legacy_names.is_legacy_on(dotted, route)
                    and self.get_metadata(position, node).start.line in lines):
                return None
            return legacy_names.replacement(dotted)

        def __init__(self):
            super().__init__()
            self.replace = {}
            self.needs_tf_lso = False
            # Local names whose rewritten uses need `import tf_lso`.
            self.heads = set()

        def visit_Import(self, node):
            return False

        def visit_ImportFrom(self, node):
            return False

        def visit_Attribute(self, node):
            text = _dotted(node, cst)
            if text is None:
                return True
            head, _, rest = text.partition(".")
            base = names.get(head)
            if base is None or legacy_names.is_legacy(base):
                return True
            full = f"{base}.{rest}"
            new = self._new(node, full)
            if new is None:
                # Inside a legacy module but not provided: left whole (its
                # module prefix is not rewritten either).
                return not legacy_names.is_legacy(full)
            self.replace[node] = new
            self.needs_tf_lso = True
            self.heads.add(head)
            return False

        def leave_Attribute(self, original_node, updated_node):
            if original_node in self.replace:
                return cst.parse_expression(
                    self.replace[original_node]
                ).with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
            return updated_node

        def leave_SimpleStatementLine(self, original_node, updated_node):
            if len(updated_node.body) != 1:
                return updated_node
            statement = updated_node.body[0]
            original = original_node.body[0]
            if isinstance(statement, cst.Import):
                return self._import(updated_node, statement, original)
            if (isinstance(statement, cst.ImportFrom)
                    and not statement.relative and statement.module is not None
                    and not isinstance(statement.names, cst.ImportStar)):
                return self._import_from(updated_node, statement, original)
            return updated_node

        def _import(self, line, statement, original):
            aliases = []
            for alias in statement.names:
                name = _dotted(alias.name, cst)
                new = self._new(original, legacy_names.canonical(name))
                local = None if alias.asname is None else (
                    alias.asname.name.value)
                if new is not None and local in unprovided:
                    new = None
                if new is not None and alias.asname is None:
                    # `import tensorflow.keras...experimental` binds
                    # `tensorflow`; keep that, and bind `tf_lso` for the
                    # rewritten uses.
                    aliases.append(alias.with_changes(
                        name=cst.Name(name.split(".")[0]),
                        comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(
                            " "))))
                    alias = alias.with_changes(name=cst.parse_expression(new))
                elif new is not None:
                    alias = alias.with_changes(name=cst.parse_expression(new))
                aliases.append(alias)
            return line.with_changes(
                body=[statement.with_changes(names=aliases)])

        def _import_from(self, line, statement, original):
            module = legacy_names.canonical(_dotted(statement.module, cst))
            kept, moved = [], {}
            for alias in statement.names:
                name = _dotted(alias.name, cst)
                local = (alias.asname.name.value if alias.asname is not None
                         else name)
                new = self._new(original, f"{module}.{name}")
                if new is None or local in unprovided:
                    kept.append(alias)
                else:
                    moved.setdefault(new.rpartition(".")[0], []).append(
                        (alias, new))
            if not moved:
                return line
            if not kept and len(moved) == 1 and "" not in moved:
                # One new module for every name: only the names change, so
                # parentheses, commas and comments stay as they were.
                [(parent, pairs)] = moved.items()
                return line.with_changes(body=[statement.with_changes(
                    module=cst.parse_expression(parent),
                    names=[_moved_alias(alias, new, cst, keep_comma=True)[1]
                           for alias, new in pairs])])
            new_lines = [
                _import_line(parent, [
                    _moved_alias(alias, new, cst, keep_comma=False)[1]
                    for alias, new in pairs], cst)
                for parent, pairs in moved.items()
            ]
            if kept:
                kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                first = line.with_changes(body=[statement.with_changes(
                    names=kept)])
            else:
                first = new_lines.pop(0).with_changes(
                    leading_lines=line.leading_lines,
                    trailing_whitespace=line.trailing_whitespace)
            return cst.FlattenSentinel([first] + new_lines)

    return Transformer()


def _binds(statement, heads, cst):
    """Whether `statement` (or a statement inside it) imports any of `heads`."""
    found = []

    class Imports(cst.CSTVisitor):
        def visit_Import(self, node):
            for alias in node.names:
                local = (alias.asname.name.value if alias.asname is not None
                         else _dotted(alias.name, cst).split(".")[0])
                found.append(local)

        def visit_ImportFrom(self, node):
            if not isinstance(node.names, cst.ImportStar):
                for alias in node.names:
                    found.append(alias.asname.name.value if alias.asname
                                 is not None else _dotted(alias.name, cst))

    statement.visit(Imports())
    return bool(heads.intersection(found))


def _is_import(statement, cst):
    return isinstance(statement, cst.SimpleStatementLine) and isinstance(
        statement.body[0], (cst.Import, cst.ImportFrom))


def _reads_module_tf_lso(module, cst):
    """For each function of `module`, in order: whether it reads `tf_lso`
    without importing it (the module's name)."""
    flags = []

    class Functions(cst.CSTVisitor):
        def visit_FunctionDef(self, node):
            flags.append(_reads(node, "tf_lso", cst)
                         and not _binds(node, {"tf_lso"}, cst))

    module.visit(Functions())
    return flags


def _reads(node, name, cst):
    """Whether `node` has the name `name` outside its imports."""
    found = []

    class Names(cst.CSTVisitor):
        def visit_Import(self, node):
            return False

        def visit_ImportFrom(self, node):
            return False

        def visit_Name(self, node):
            found.append(node.value)

    node.visit(Names())
    return name in found


def _add_import(module, heads, cst, reads_module_tf_lso):
    """`module` with `import tf_lso` right after each import of one of
    `heads` (the names the rewritten references start with), in its block:
    whatever binds those names binds `tf_lso` too, before the uses (at the
    module's level, in an `if`, `try` or `with`, or in a function).

    Not where the block imports `tf_lso` before it, or right after it (only
    imports between); nor in a function that reads the module's `tf_lso`
    (`reads_module_tf_lso`, one flag per function): an import there would
    make `tf_lso` the function's own name, unbound before that import.
    """
    line = cst.parse_statement("import tf_lso\n")

    def after_imports(statements):
        """Small statements with `import tf_lso` after each that binds one
        of `heads` (`import tensorflow as tf; opt = tf...`)."""
        added = []
        for statement in statements:
            added.append(statement)
            if _binds(statement, heads, cst):
                added.append(line.body[0])
        return added

    def bound(before, after):
        """Whether `before` (up to the import, with what was added), or the
        imports that start `after`, bind `tf_lso`."""
        around = [*before, *itertools.takewhile(
            lambda statement: _is_import(statement, cst), after)]
        return any(_is_import(statement, cst)
                   and _binds(statement, {"tf_lso"}, cst)
                   for statement in around)

    class Add(cst.CSTTransformer):
        def __init__(self):
            super().__init__()
            self.functions = iter(reads_module_tf_lso)
            self.skip = [False]  # For each function entered: leave it.

        def visit_FunctionDef(self, node):
            self.skip.append(next(self.functions))

        def leave_FunctionDef(self, original_node, updated_node):
            self.skip.pop()
            return updated_node

        def leave_Module(self, original_node, updated_node):
            return updated_node.with_changes(body=self.body(updated_node.body))

        def leave_IndentedBlock(self, original_node, updated_node):
            return updated_node.with_changes(body=self.body(updated_node.body))

        def leave_SimpleStatementSuite(self, original_node, updated_node):
            if self.skip[-1]:
                return updated_node
            return updated_node.with_changes(
                body=after_imports(updated_node.body))

        def body(self, body):
            if self.skip[-1]:
                return body
            added = []
            for index, statement in enumerate(body):
                if not (isinstance(statement, cst.SimpleStatementLine)
                        and _binds(statement, heads, cst)
                        and not bound([*added, statement], body[index + 1:])):
                    added.append(statement)
                elif len(statement.body) == 1:
                    added.extend((statement, line))
                else:
                    added.append(statement.with_changes(
                        body=after_imports(statement.body)))
            return added

    return module.visit(Add())


def _fix_module(module, tree, cst, lines, route):
    names = rule.imported_names(tree)
    transformer = _transformer(cst, names,
                               rule.unprovided_aliases(tree, names),
                               lines, route)
    reads_module_tf_lso = _reads_module_tf_lso(module, cst)
    module = cst.metadata.MetadataWrapper(
        module, unsafe_skip_copy=True).visit(transformer)
    if transformer.needs_tf_lso:
        module = _add_import(module, transformer.heads, cst,
                             reads_module_tf_lso)
    return module
