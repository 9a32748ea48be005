"""`python -m tf_lso check --fix`: rewrite legacy names to tf_lso's, losslessly.

Needs LibCST (`pip install 'tf_lso[migrate]'`), a concrete syntax tree that
keeps comments and formatting: only the legacy names (and the imports that
bring them in) change, and the file stays byte for byte the same elsewhere
(its encoding, byte order mark and line ends included). Nothing else is
rewritten; what `check` reports beyond `legacy-name` stays for a person to
decide, and so does a legacy name that tf_lso does not provide (with the
imports it is used through).

The rule the tests hold it to: a fixed file imports and runs wherever the
original did under `python -m tf_lso run`. The rewrites are the rules'
(`Rule.fix`; today `legacy-name`'s); this reads, writes and diffs files.
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


def _fix_module(module, tree, cst):
    """`module` after the fix of every rule that has one, in turn.

    Each fix gets the tree of the code it rewrites: after a fix that changed
    the code, it is parsed again before the next fix (never after the last).
    """
    for rule in rules.RULES.values():
        if not rule.fixes:
            continue
        if tree is None:
            tree = ast.parse(module.code)
        fixed = rule.fix(module, tree, cst)
        if fixed is not module:
            module, tree = fixed, None
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

