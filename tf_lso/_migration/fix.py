"""`python -m tf_lso check --fix`: rewrite legacy names to tf_lso's, losslessly.

Needs LibCST (`pip install 'tf_lso[migrate]'`), a concrete syntax tree that
keeps comments and formatting: only the legacy names (and the imports that
bring them in) change, and the file stays byte for byte the same elsewhere
(its encoding, byte order mark and line ends included). Nothing else is
rewritten; what `check` reports beyond `legacy-name` stays for a person to
decide, and so does a legacy name that tf_lso does not provide (with the
imports it is used through).

The rule the tests hold it to: a fixed file imports and runs wherever the
original did under `python -m tf_lso run`.
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


def _transformer(cst, names, unprovided):
    class Transformer(cst.CSTTransformer):
        def __init__(self):
            super().__init__()
            self.replace = {}
            self.needs_tf_lso = False
            self.has_tf_lso = False
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
            if base is None or rules.is_legacy(base):
                return True
            full = f"{base}.{rest}"
            new = rules.replacement(full)
            if new is None:
                # Inside a legacy module but not provided: left whole (its
                # module prefix is not rewritten either).
                return not rules.is_legacy(full)
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
                local = None if alias.asname is None else (
                    alias.asname.name.value)
                if new is not None and local in unprovided:
                    new = None
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
            kept, moved = [], {}
            for alias in statement.names:
                name = _dotted(alias.name, cst)
                local = (alias.asname.name.value if alias.asname is not None
                         else name)
                new = rules.replacement(f"{module}.{name}")
                if new is None or local in unprovided:
                    kept.append(alias)
                else:
                    moved.setdefault(new.rpartition(".")[0], []).append(
                        (alias, new))
            if not moved:
                return line
            if not kept and len(moved) == 1:
                # One new module for every name: only the names change, so
                # parentheses, commas and comments stay as they were.
                [(parent, pairs)] = moved.items()
                return line.with_changes(body=[statement.with_changes(
                    module=cst.parse_expression(parent),
                    names=[_moved_alias(alias, new, cst, keep_comma=True)[1]
                           for alias, new in pairs])])
            new_lines = [
                cst.SimpleStatementLine(body=[cst.ImportFrom(
                    module=cst.parse_expression(parent),
                    names=[_moved_alias(alias, new, cst, keep_comma=False)[1]
                           for alias, new in pairs])])
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


def _add_import(module, heads, cst):
    """`module` with `import tf_lso` where the rewritten names can see it.

    Right after the first top-level statement that imports one of `heads`
    (the names the rewritten references start with): every use of those
    comes after it. If they are imported only inside functions, after the
    last top-level import (or the docstring).
    """
    body = list(module.body)
    position = next((index + 1 for index, statement in enumerate(body)
                     if _binds(statement, heads, cst)), None)
    if position is None:
        position = 0
        for index, statement in enumerate(body):
            if _is_import(statement, cst):
                position = index + 1
            elif position == 0 and index == 0 and isinstance(
                    statement, cst.SimpleStatementLine) and isinstance(
                    statement.body[0], cst.Expr) and isinstance(
                    statement.body[0].value, cst.SimpleString):
                position = 1  # After the module docstring.
    body.insert(position, cst.parse_statement("import tf_lso\n"))
    return module.with_changes(body=body)


def _fix_module(module, tree, cst):
    names = check.imported_names(tree)
    transformer = _transformer(cst, names,
                               check.unprovided_aliases(tree, names))
    module = module.visit(transformer)
    if transformer.needs_tf_lso and not transformer.has_tf_lso:
        module = _add_import(module, transformer.heads, cst)
    return module


def fix_source(source):
    """`source` with every legacy mixed-precision name rewritten to tf_lso.

    Args:
        source: Python code, as text.

    Returns:
        The rewritten code (equal to `source` when there is nothing to fix).

    Raises:
        ImportError: LibCST is not installed.
        SyntaxError: `source` cannot be parsed.
    """
    return _fix(source).code


def fix_bytes(data):
    """`fix_source` of a file's bytes; encoding, BOM and line ends are kept.

    Args:
        data: The bytes of a Python file (a PEP 263 coding line or a UTF-8
            byte order mark is honoured).

    Returns:
        The rewritten file's bytes.
    """
    return _fix(data).bytes


def _fix(source):
    cst = _libcst()
    try:
        module = cst.parse_module(source)
        tree = ast.parse(source)
    except (cst.ParserSyntaxError, SyntaxError, ValueError) as e:
        raise SyntaxError(str(e)) from e
    return _fix_module(module, tree, cst)


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
            old = pathlib.Path(path).read_bytes()
            new = fix_bytes(old)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as e:
            skipped.append((str(path), str(e).splitlines()[0]))
            continue
        if new == old:
            continue
        changed.append(str(path))
        diffs.extend(difflib.unified_diff(
            check.decode(old).splitlines(keepends=True),
            check.decode(new).splitlines(keepends=True),
            fromfile=str(path), tofile=str(path),
        ))
        if write:
            pathlib.Path(path).write_bytes(new)
    return "".join(diffs), changed, skipped

