"""`python -m tf_lso check --fix`: rewrite legacy names to tf_lso's, losslessly.

Needs LibCST (`pip install 'tf_lso[migrate]'`), a concrete syntax tree that
keeps comments and formatting: only the legacy names (and the imports that
bring them in) change. Nothing else is rewritten; what `check` reports beyond
`legacy-name` stays for a person to decide.
"""

import ast
import difflib
import pathlib

from tf_lso._migration import check
from tf_lso._migration import rules


def _libcst():
    try:
        import libcst
    except ImportError as e:
        raise ImportError(
            "`--fix` needs LibCST, which could not be imported "
            f"({e}). Install it with `pip install 'tf_lso[migrate]'`."
        ) from e
    return libcst


def _dotted(node, cst):
    parts = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


def _new_imports(module, aliases, cst):
    """Splits `from module import aliases` into kept and tf_lso aliases.

    Returns:
        (kept aliases, {new module: [aliases]}).
    """
    kept, moved = [], {}
    for alias in aliases:
        name = _dotted(alias.name, cst)
        full = f"{module}.{name}"
        new = rules.replacement(full)
        if new is None and rules.is_legacy(full):
            legacy = next(m for m in rules.LEGACY_MODULES
                          if full.startswith(m + "."))
            new = rules.LEGACY_MODULES[legacy] + full[len(legacy):]
        if new is None:
            kept.append(alias)
        else:
            parent, _, last = new.rpartition(".")
            moved.setdefault(parent, []).append(alias.with_changes(
                name=cst.Name(last), comma=cst.MaybeSentinel.DEFAULT))
    return kept, moved


def _transformer(cst, names):
    class Transformer(cst.CSTTransformer):
        def __init__(self):
            super().__init__()
            self.replace = {}
            self.needs_tf_lso = False
            self.has_tf_lso = False

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
            if base is None or rules.is_legacy(base):
                return True
            new = rules.replacement(f"{base}.{rest}")
            if new is None:
                return True
            self.replace[node] = new
            self.needs_tf_lso = True
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
            if isinstance(statement, cst.Import):
                return self._import(updated_node, statement)
            if (isinstance(statement, cst.ImportFrom)
                    and not statement.relative and statement.module is not None
                    and not isinstance(statement.names, cst.ImportStar)):
                return self._import_from(updated_node, statement)
            return updated_node

        def _import(self, line, statement):
            aliases = []
            for alias in statement.names:
                name = _dotted(alias.name, cst)
                if name == "tf_lso":
                    self.has_tf_lso = True
                new = rules.replacement(rules.canonical(name))
                if new is not None and alias.asname is None:
                    # `import tensorflow.keras...experimental` binds
                    # `tensorflow`; keep that, and bind `tf_lso` for the
                    # rewritten uses.
                    self.has_tf_lso = True
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

        def _import_from(self, line, statement):
            module = rules.canonical(_dotted(statement.module, cst))
            kept, moved = _new_imports(module, statement.names, cst)
            if not moved:
                return line
            new_lines = [
                cst.SimpleStatementLine(body=[cst.ImportFrom(
                    module=cst.parse_expression(parent), names=aliases)])
                for parent, aliases in moved.items()
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


def _add_import(module, cst):
    """`module` with `import tf_lso` after its last top-level import."""
    body = list(module.body)
    position = 0
    for index, line in enumerate(body):
        if isinstance(line, cst.SimpleStatementLine) and isinstance(
                line.body[0], (cst.Import, cst.ImportFrom)):
            position = index + 1
        elif position == 0 and index == 0 and isinstance(
                line, cst.SimpleStatementLine) and isinstance(
                line.body[0], cst.Expr) and isinstance(
                line.body[0].value, cst.SimpleString):
            position = 1  # After the module docstring.
    body.insert(position, cst.parse_statement("import tf_lso\n"))
    return module.with_changes(body=body)


def fix_source(source):
    """`source` with every legacy mixed-precision name rewritten to tf_lso.

    Args:
        source: Python code.

    Returns:
        The rewritten code (equal to `source` when there is nothing to fix).

    Raises:
        ImportError: LibCST is not installed.
        SyntaxError: `source` cannot be parsed.
    """
    cst = _libcst()
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as e:
        raise SyntaxError(str(e)) from e
    names = check.imported_names(ast.parse(source))
    transformer = _transformer(cst, names)
    module = module.visit(transformer)
    if transformer.needs_tf_lso and not transformer.has_tf_lso:
        module = _add_import(module, cst)
    return module.code


def fix_files(paths, write=False):
    """Rewrites (or previews) the .py files under `paths`.

    Args:
        paths: Files and directories, as for `check`.
        write: Write the changed files; otherwise only return the diff.

    Returns:
        (unified diff of all changes, changed paths, [(path, error message)]
        for files that were skipped).
    """
    diffs, changed, skipped = [], [], []
    for path in check.python_files(paths):
        if path.suffix == ".ipynb":
            skipped.append((str(path), "notebooks are checked, not rewritten"))
            continue
        try:
            old = pathlib.Path(path).read_text(encoding="utf-8")
            new = fix_source(old)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as e:
            skipped.append((str(path), str(e).splitlines()[0]))
            continue
        if new == old:
            continue
        changed.append(str(path))
        diffs.extend(difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True),
            fromfile=str(path), tofile=str(path),
        ))
        if write:
            pathlib.Path(path).write_text(new, encoding="utf-8")
    return "".join(diffs), changed, skipped
