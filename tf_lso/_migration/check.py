"""`python -m tf_lso check`: find legacy mixed-precision code, file by file.

Standard library only (`ast`, `json`), so it needs no optional extra. Each
finding names a rule of `rules.RULES`, with its severity and the
section of docs/migration.md that explains it.
"""

import ast
import dataclasses
import io
import json
import os
import pathlib
import re
import tokenize

from tf_lso._migration import rules

_OPTIMIZER_V2_HOOKS = frozenset({
    "_resource_apply_dense", "_resource_apply_sparse", "_create_slots",
    "_prepare_local", "_set_hyper", "_get_hyper",
    "_resource_apply_sparse_duplicate_indices",
})
# `kernel:0`, `dense_1/kernel:0`, `w1:0`, `%s:0`, `.*:0`; not `ratio 1:0`.
_VARIABLE_SUFFIX = re.compile(r"(?:[A-Za-z_/*.)\]]|[A-Za-z_]\d+):0(?!\d)")
# Mixins from other packages that bring OptimizerV2 hooks to the optimizer
# they are mixed into.
_HOOK_MIXINS = {
    "tensorflow_addons.optimizers.DecoupledWeightDecayExtension": frozenset({
        "_resource_apply_dense", "_resource_apply_sparse"}),
}
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
_SUPPRESSION = re.compile(r"#\s*tf-lso:\s*ignore(?:\[([^\]]*)\])?")
_GRAPH_REWRITE = "enable_mixed_precision_graph_rewrite"
_EXPERIMENTAL_LSO = "tf_lso.experimental.LossScaleOptimizer"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing `check` reports.

    Attributes:
        path: The file, as given or found under a given directory.
        line: 1-based line (in the cell, for notebooks).
        column: 1-based column.
        rule: The rule id (`rules.RULES`).
        message: What was found and what to do.
        cell: The notebook cell index (0-based), or None for a .py file.
        fixable: Whether `--fix` rewrites it.
    """

    path: str
    line: int
    column: int
    rule: str
    message: str
    cell: int = None
    fixable: bool = False

    @property
    def severity(self):
        return rules.RULES[self.rule].severity

    @property
    def doc(self):
        return rules.doc_link(self.rule)

    def location(self):
        cell = "" if self.cell is None else f"[cell {self.cell}]"
        return f"{self.path}{cell}:{self.line}:{self.column}"

    def to_json(self):
        return {**dataclasses.asdict(self), "severity": self.severity,
                "doc": self.doc}


def imported_names(tree):
    """Local name -> canonical dotted name, for every import in `tree`."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = rules.canonical(alias.name)
                else:
                    top = alias.name.split(".")[0]
                    names[top] = rules.canonical(top)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            module = rules.canonical(node.module)
            for alias in node.names:
                if alias.name != "*":
                    names[alias.asname or alias.name] = f"{module}.{alias.name}"
    return names


def _is_ours(name):
    return name == "tf_lso" or name.startswith("tf_lso.")


def dotted(node, names):
    """The canonical dotted name an expression spells, and its base's, or None.

    `tf.keras.mixed_precision.experimental.Policy` with `tf` imported gives
    `("tf.keras.mixed_precision.experimental.Policy", "tf")`.
    """
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in names:
        return None
    base = names[node.id]
    return ".".join([base] + parts[::-1]), base


def unprovided_aliases(tree, names):
    """Local names of legacy modules that something unprovided is used through.

    `mp.Bogus` with `mp` a legacy module and no tf_lso `Bogus`: rewriting
    the import of `mp` to tf_lso's module would break `mp.Bogus` (or change
    its error), so `--fix` leaves such an import, and `check` says why.

    Args:
        tree: The parsed module.
        names: `imported_names(tree)`.

    Returns:
        A set of local names.
    """
    found = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)):
            continue
        base = names.get(node.value.id)
        if (base in rules.LEGACY_MODULES
                and rules.replacement(f"{base}.{node.attr}") is None):
            found.add(node.value.id)
    return found


class _Visitor(ast.NodeVisitor):
    def __init__(self, names, report, classes, unprovided):
        self.names = dict(names)
        self.report = report
        self.classes = classes
        self.unprovided = unprovided
        self.uses_experimental_lso = False
        self.iterations = []

    def _legacy(self, node):
        """Reports `node` if it spells a legacy name; True if it did."""
        found = dotted(node, self.names)
        if found is None:
            return False
        name, base = found
        if rules.behaviour(name) == _EXPERIMENTAL_LSO:
            self.uses_experimental_lso = True
        if not rules.is_legacy(name):
            return False
        new = rules.replacement(name)
        if new is None:
            if any(name.startswith(m + ".") for m in rules.LEGACY_MODULES):
                self._not_provided(node, name)
                return True
            return False
        if rules.is_legacy(base):
            return False  # Reported where the legacy base was imported.
        self.report(node, "legacy-name", _legacy_message(name, new),
                    fixable=True)
        return True

    def _not_provided(self, node, name):
        self.report(node, "legacy-name", f"`{name}` no longer exists on "
                    "TensorFlow 2.16+, and tf_lso does not provide it: "
                    "replace it by hand (`--fix` leaves it).")

    def visit_Import(self, node):
        for alias in node.names:
            local = alias.asname or alias.name.split(".")[0]
            self._import(node, rules.canonical(alias.name),
                         local if alias.asname else None)

    def visit_ImportFrom(self, node):
        if not node.module or node.level:
            return
        module = rules.canonical(node.module)
        if module in rules.LEGACY_MODULES:
            provided = [a for a in node.names
                        if rules.replacement(f"{module}.{a.name}")]
            for alias in node.names:
                if alias not in provided and alias.name != "*":
                    self._not_provided(node, f"{module}.{alias.name}")
            if len(provided) == 1:
                self._import(node, f"{module}.{provided[0].name}")
            elif provided:
                self._import(node, module)
            return
        for alias in node.names:
            self._import(node, f"{module}.{alias.name}",
                         alias.asname or alias.name)

    def _import(self, node, name, local=None):
        new = rules.replacement(name)
        if new is not None:
            message = _legacy_message(name, new)
            fixable = local not in self.unprovided
            if not fixable:
                message += (f" `--fix` leaves this import: names that tf_lso "
                            f"does not provide are used through `{local}`.")
            self.report(node, "legacy-name", message, fixable=fixable)
        elif name.endswith("." + _GRAPH_REWRITE) and not _is_ours(name):
            self._graph_rewrite(node)

    def visit_Assign(self, node):
        found = dotted(node.value, self.names)
        if found and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name):
            # `mp = tf.keras.mixed_precision.experimental`: later `mp.X`
            # is reported here, not at each use.
            self.names[node.targets[0].id] = found[0]
        self.generic_visit(node)

    def visit_Attribute(self, node):
        if self._legacy(node):
            return
        found = dotted(node, self.names)
        if node.attr == _GRAPH_REWRITE and not (found and _is_ours(found[0])):
            self._graph_rewrite(node)
        elif node.attr == "experimental_run_v2":
            self.report(node, "run-v2", "`experimental_run_v2` was removed; "
                        "call `strategy.run(fn, args=...)`.")
        elif node.attr == "_decayed_lr":
            self.report(node, "decayed-lr", "`_decayed_lr` is gone with "
                        "OptimizerV2; read the current value from "
                        "`opt.learning_rate`.")
        elif node.attr in ("_optimizer", "_loss_scale") and not (
                isinstance(node.value, ast.Name) and node.value.id == "self"):
            public = {"_optimizer": "inner_optimizer",
                      "_loss_scale": "loss_scale"}[node.attr]
            self.report(node, "private-attribute", f"`{node.attr}` is a "
                        "private attribute of TF's LossScaleOptimizer; use "
                        f"the public `{public}`.")
        elif (node.attr == "name" and isinstance(node.value, ast.Attribute)
              and node.value.attr == "dtype" and found is None):
            self.report(node, "dtype-name", "On Keras 3 a Keras tensor's "
                        "`dtype` is a string ('float16'), so `.dtype.name` "
                        "raises AttributeError; use `tf.as_dtype(x.dtype)."
                        "name` (works for both).")
        elif node.attr == "iterations" and isinstance(node.ctx, ast.Load):
            self.iterations.append(node)
        self.generic_visit(node)

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load):
            self._legacy(node)

    def _graph_rewrite(self, node):
        self.report(node, "graph-rewrite", f"TensorFlow's `{_GRAPH_REWRITE}` "
                    "takes TF1 optimizers (`tf.compat.v1.train.Optimizer`) "
                    "only; with a Keras optimizer it raises ValueError. "
                    f"`tf_lso.experimental.{_GRAPH_REWRITE}` takes both (TF1 "
                    "ones go to TensorFlow's).")

    def visit_Call(self, node):
        func = node.func
        if isinstance(func, ast.Attribute):
            self._method_call(node, func.attr)
        found = dotted(func, self.names)
        is_regex = found is not None and found[1] == "re" and (
            found[0].rpartition(".")[2] in _REGEX_FUNCTIONS)
        on_a_name = (isinstance(func, ast.Attribute)
                     and func.attr in _NAME_METHODS
                     and _mentions_name(func.value))
        if is_regex or on_a_name:
            self._variable_names(node.args)
        if found and rules.behaviour(found[0]) == "tf_lso.experimental.Policy":
            if len(node.args) > 1 or any(k.arg == "loss_scale"
                                         for k in node.keywords):
                self.report(node, "policy-loss-scale", "A policy with a loss "
                            "scale: `tf_lso.experimental.Policy` keeps it and "
                            "`model.compile` wraps the optimizer, as in TF "
                            "2.1-2.3; Keras 3's policies have no loss scale.")
        for keyword in node.keywords:
            if keyword.arg == "experimental_aggregate_gradients":
                self.report(keyword.value, "aggregate-gradients",
                            "Keras 3 optimizers raise a TypeError on "
                            "`experimental_aggregate_gradients`; tf_lso's "
                            "LossScaleOptimizer accepts it (a bare inner "
                            "optimizer does not).")
        self.generic_visit(node)

    def _method_call(self, node, method):
        if method == "loss_scale" and not node.args and not node.keywords:
            self.report(node, "loss-scale-call", "`opt.loss_scale()` works "
                        "on `tf_lso.experimental.LossScaleOptimizer` (TF "
                        "2.1-2.3's class: a LossScale object, also usable as "
                        "a tensor); on `tf_lso.LossScaleOptimizer` (TF 2.4's) "
                        "`opt.loss_scale` is a tensor, as in TF 2.4.")
        elif method in ("learning_rate", "lr") and len(node.args) == 1:
            self.report(node, "schedule-call", f"`opt.{method}(step)`: a "
                        "Keras 3 optimizer's learning rate is a value, not "
                        "the schedule (\"object is not callable\"); tf_lso's "
                        "optimizers keep it callable. On a bare optimizer "
                        "call the schedule itself.")
        elif method == "get_gradients":
            self.report(node, "get-gradients", "`get_gradients` works only "
                        "in graph mode (tf.compat.v1), as in TF 2.x; in "
                        "eager code use `tf.GradientTape`. Keras 3 optimizers "
                        "do not have it.")

    def _variable_names(self, nodes):
        """Reports the strings among `nodes` that end a variable name in :0."""
        for node in nodes:
            for string in _strings(node):
                if (_VARIABLE_SUFFIX.search(string.value)
                        and not _DEVICE.search(string.value)):
                    self.report(string, "variable-name-suffix", "Keras 3 "
                                "variable names have no ':0' (`v.name == "
                                "'kernel'`, `v.path == 'dense/kernel'`); a "
                                "pattern with ':0' matches nothing. Match "
                                "`v.path`.")

    def visit_Compare(self, node):
        operands = [node.left] + node.comparators
        if any(_mentions_name(operand) for operand in operands):
            self._variable_names(operands)
        self.generic_visit(node)

    def visit_ClassDef(self, node):
        bases = [dotted(base, self.names) for base in node.bases]
        hooks = _OPTIMIZER_V2_HOOKS & _methods(node, self.classes)
        for base in bases:
            if base and base[0] in _HOOK_MIXINS:
                hooks |= _HOOK_MIXINS[base[0]]
        if hooks and any(b and b[0].startswith("tf.keras.optimizers.")
                         for b in bases):
            self.report(node, "optimizer-v2-subclass", "This optimizer uses "
                        f"OptimizerV2 hooks ({', '.join(sorted(hooks))}) "
                        "that Keras 3 optimizers never call: subclass "
                        "`tf_keras.optimizers.legacy.Optimizer` (custom loops "
                        "with tf_keras or tf.Variables) or port it to Keras "
                        "3's `build`/`update_step`.")
        self.generic_visit(node)


def _called_self_methods(node):
    return {
        sub.func.attr for sub in ast.walk(node)
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)
        and isinstance(sub.func.value, ast.Name) and sub.func.value.id == "self"
    }


def _methods(node, classes, seen=()):
    """The methods a class defines or calls on `self`, its bases' included.

    Bases are followed when they are classes of the same file (`classes`:
    name -> ClassDef), as a mixin that brings OptimizerV2 hooks is
    (tensorflow/addons' `DecoupledWeightDecayExtension`).
    """
    found = _called_self_methods(node) | {
        item.name for item in node.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    for base in node.bases:
        if (isinstance(base, ast.Name) and base.id in classes
                and base.id not in seen):
            found |= _methods(classes[base.id], classes, seen + (node.name,))
    return found


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


def _legacy_message(name, new):
    if name == "tf.keras.mixed_precision.LossScaleOptimizer":
        return ("On TensorFlow 2.16+ `tf.keras.mixed_precision."
                "LossScaleOptimizer` is Keras 3's class (no `dynamic`, no "
                "`get_scaled_loss`); TF 2.4's is `tf_lso.LossScaleOptimizer`.")
    return f"`{name}` no longer exists on TensorFlow 2.16+; use `{new}`."


def check_source(source, path="<string>", cell=None, collapse=True):
    """Findings in Python source text, sorted by position.

    Args:
        source: The code.
        path: Reported as the findings' path.
        cell: The notebook cell index, if any.
        collapse: Report each `info` rule once (`one_note_per_rule`).

    Returns:
        A list of `Finding`s. A syntax error gives one `unparsable` finding.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as e:
        line = getattr(e, "lineno", None) or 1
        return [Finding(path, line, (getattr(e, "offset", None) or 1),
                        "unparsable", f"Not parsed, skipped: {e}.", cell)]
    found = []

    def report(node, rule, message, fixable=False):
        found.append(Finding(path, node.lineno, node.col_offset + 1, rule,
                             message, cell, fixable))

    names = imported_names(tree)
    classes = {node.name: node for node in ast.walk(tree)
               if isinstance(node, ast.ClassDef)}
    visitor = _Visitor(names, report, classes,
                       unprovided_aliases(tree, names))
    visitor.visit(tree)
    if visitor.uses_experimental_lso:
        for node in visitor.iterations:
            report(node, "skipped-step-iterations", "TF 2.2/2.3's experimental "
                   "LossScaleOptimizer did not advance `iterations` on skipped "
                   "steps; TF 2.4 and tf_lso do. Step counts, schedules and "
                   "logs keyed on it include skipped steps now.")
    ignored = suppressions(source)
    found = [f for f in set(found) if not _suppressed(f, ignored)]
    found = sorted(found, key=lambda f: (f.line, f.column, f.rule))
    return one_note_per_rule(found) if collapse else found


def suppressions(source):
    """{line: rule ids ignored there (None: all)}, from `# tf-lso: ignore`.

    `# tf-lso: ignore` on a line ignores every finding that starts there;
    `# tf-lso: ignore[rule-a, rule-b]` only those rules.
    """
    ignored = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return ignored
    for token in tokens:
        if token.type != tokenize.COMMENT:
            continue
        match = _SUPPRESSION.search(token.string)
        if match:
            ids = match.group(1)
            ignored[token.start[0]] = None if ids is None else {
                rule.strip() for rule in ids.split(",")}
    return ignored


def _suppressed(finding, ignored):
    if finding.line not in ignored:
        return False
    rules_ignored = ignored[finding.line]
    return rules_ignored is None or finding.rule in rules_ignored


def one_note_per_rule(findings, where=lambda f: str(f.line)):
    """Keeps the first `info` finding of each rule; it lists the others.

    A note that something works as before is worth reading once per file,
    not at every call site.
    """
    first, kept = {}, []
    for finding in findings:
        if finding.severity != "info":
            kept.append(finding)
        elif finding.rule not in first:
            first[finding.rule] = (len(kept), [])
            kept.append(finding)
        else:
            first[finding.rule][1].append(where(finding))
    for index, others in first.values():
        if others:
            noun = "line" if len(others) == 1 else "lines"
            kept[index] = dataclasses.replace(
                kept[index], message=f"{kept[index].message} (Also at "
                f"{noun} {', '.join(others)}.)")
    return kept


def notebook_cells(text):
    """The code cells of a notebook as sources, magics blanked (same lines)."""
    cells = []
    for index, cell in enumerate(json.loads(text).get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        lines = source.split("\n")
        if lines[0].startswith("%%"):  # A cell magic: not Python.
            lines = [""] * len(lines)
        # Line magics, shell escapes and `name?` help.
        lines = ["" if line.lstrip().startswith(("%", "!", "?"))
                 or line.rstrip().endswith("?") else line for line in lines]
        cells.append((index, "\n".join(lines)))
    return cells


def _check_notebook(cells, path):
    """Checks the cells as one program (a cell sees earlier imports)."""
    starts, lines = [], []
    for index, source in cells:
        starts.append((len(lines), index))
        lines.extend(source.split("\n"))
    findings = []
    for finding in check_source("\n".join(lines), path, collapse=False):
        first, cell = max(s for s in starts if s[0] < finding.line)
        # Checked, not rewritten: `--fix` leaves notebooks alone.
        findings.append(dataclasses.replace(
            finding, line=finding.line - first, cell=cell, fixable=False))
    return one_note_per_rule(
        findings, where=lambda f: f"{f.line} of cell {f.cell}")


def decode(data):
    """A Python file's bytes as text, decoded as Python decodes them.

    A PEP 263 coding line or a UTF-8 byte order mark is honoured; line ends
    are kept as they are.

    Raises:
        SyntaxError, UnicodeDecodeError: If Python could not read it either.
    """
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding)


def check_file(path):
    """Findings in one .py or .ipynb file; unreadable files are a finding."""
    path = pathlib.Path(path)
    try:
        if path.suffix == ".ipynb":
            text = path.read_text(encoding="utf-8")
            return _check_notebook(notebook_cells(text), str(path))
        text = decode(path.read_bytes())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError,
            AttributeError) as e:
        return [Finding(str(path), 1, 1, "unparsable",
                        f"Not read, skipped: {e}.")]
    return check_source(text, str(path))


def python_files(paths):
    """The .py and .ipynb files under `paths` (files given are kept as is).

    Hidden directories, `__pycache__` and virtualenvs are not entered.
    """
    for path in map(pathlib.Path, paths):
        if not path.is_dir():
            yield path
            continue
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(
                d for d in dirs
                if not d.startswith(".") and d != "__pycache__"
                and not (pathlib.Path(root, d, "pyvenv.cfg")).exists()
            )
            for name in sorted(files):
                if name.endswith((".py", ".ipynb")):
                    yield pathlib.Path(root, name)
