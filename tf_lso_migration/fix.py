"""`python -m tf_lso check --fix`: rewrite legacy names to tf_lso's, losslessly.

Needs LibCST (`pip install 'libcst>=1.1'`, tf_lso's `migrate` extra), a
concrete syntax tree that
keeps comments and formatting: only the legacy names (and the imports that
bring them in) change, and a float16 last layer gets `dtype="float32"`;
the file stays byte for byte the same elsewhere (its encoding, byte order
mark and line ends included). Nothing else is rewritten; what else `check`
reports stays for a person to decide, and so does a legacy name that
tf_lso does not provide (with the imports it is used through).

The rules the tests hold it to: a fixed file imports and runs wherever the
original did under `python -m tf_lso run`; and `--fix` rewrites only what
`check` reports as fixable with the same options (`check.Options`) and
suppression comments. The rewrites are the rules' (`Rule.fix`: today
`legacy-name`'s and `float16-output`'s), each given the lines of its
findings; this reads, writes and diffs files.
"""

from __future__ import annotations

import ast
import difflib
import pathlib
import types
from collections.abc import Iterable
from typing import TYPE_CHECKING
from typing import NamedTuple

from tf_lso_migration import check
from tf_lso_migration import rules

if TYPE_CHECKING:
    import libcst

# What pip can install wherever tf_lso came from (it is not on the index).
_LIBCST_ADVICE = ("Install it with `pip install 'libcst>=1.1'` (tf_lso's "
                  "`migrate` extra).")


#: Why `--fix` leaves a notebook: by design, not for an error.
NOTEBOOKS_NOT_REWRITTEN = "notebooks are checked, not rewritten"


class Skipped(NamedTuple):
    """A file `--fix` left as it was, and why.

    Attributes:
        path: The file.
        reason: Why, in a few words (the first line of the error).
        failed: Whether it was left for an error (it could not be read or
            parsed), which fails the run; a notebook is not.
        finding: For a file Python cannot read or parse, the `unparsable`
            finding `check` reports for it (the same message and position).
    """

    path: str
    reason: str
    failed: bool = True
    finding: check.Finding | None = None


def _libcst() -> types.ModuleType:
    try:
        import libcst
        import libcst.metadata  # noqa: F401 (the rules' rewrites use it)
    except ImportError as e:
        raise ImportError(
            "`--fix` needs LibCST, which could not be imported "
            f"({e}). {_LIBCST_ADVICE}"
        ) from e
    return libcst


def _fix_module(module, cst, options):
    """`module` after the fix of every reported rule that has one, in turn.

    Each fix gets the tree of the code it rewrites and the lines where
    `check` reports its fixable findings in that code: after a fix that
    changed the code, it is checked again before the next fix (never after
    the last).
    """
    findings = None
    for rule in rules.RULES.values():
        if not (rule.fixes and options.reports(rule.id)):
            continue
        if findings is None:
            tree = ast.parse(module.code)
            findings = check.check_source(module.code, collapse=False,
                                          options=options)
        lines = {f.line for f in findings if f.rule == rule.id and f.fixable}
        if not lines:
            continue
        fixed = rule.fix(module, tree, cst, lines=lines, route=options.route)
        if fixed is not module:
            module, findings = fixed, None
    return module


def fix_source(source: str, options: check.Options | None = None) -> str:
    """`source` with the legacy mixed-precision names rewritten to tf_lso.

    Only those `check` reports as fixable with `options` (and the
    suppression comments in `source`).

    Args:
        source: Python code, as text.
        options: `check.Options` (default: every rule, default route).

    Returns:
        The rewritten code (equal to `source` when there is nothing to fix).

    Raises:
        ImportError: LibCST is not installed.
        SyntaxError: `source` cannot be parsed.
    """
    return _fix(source, options).code


def fix_bytes(data: bytes, options: check.Options | None = None) -> bytes:
    """`fix_source` of a file's bytes; encoding, BOM and line ends are kept.

    Args:
        data: The bytes of a Python file (a PEP 263 coding line or a UTF-8
            byte order mark is honoured).
        options: `check.Options`, as for `fix_source`.

    Returns:
        The rewritten file's bytes.
    """
    return _fix(data, options).bytes


def _fix(source: str | bytes,
         options: check.Options | None) -> libcst.Module:
    cst = _libcst()
    try:
        module = cst.parse_module(source)
        ast.parse(source)  # LibCST accepts some code Python does not.
    except (cst.ParserSyntaxError, SyntaxError, ValueError) as e:
        raise SyntaxError(str(e)) from e
    return _fix_module(module, cst, options or check.Options())


def fix_files(
        paths: Iterable[check.Path], write: bool = False,
        options: check.Options | None = None,
) -> tuple[str, list[str], list[Skipped]]:
    """Rewrites (or previews) the .py files under `paths`.

    Args:
        paths: Files and directories, as for `check`.
        write: Write the changed files; otherwise only return the diff.
        options: `check.Options`, as for `fix_source`.

    Returns:
        (unified diff of all changes, changed paths, a `Skipped` for each
        file that was left as it was).
    """
    diffs: list[str] = []
    changed: list[str] = []
    skipped: list[Skipped] = []
    for path in check.python_files(paths):
        if path.suffix == ".ipynb":
            skipped.append(Skipped(str(path), NOTEBOOKS_NOT_REWRITTEN,
                                   failed=False))
            continue
        try:
            old = pathlib.Path(path).read_bytes()
            new = fix_bytes(old, options)
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as e:
            # What `check` says of the file, when Python cannot read it
            # either (not for code only LibCST refuses).
            unread = [f for f in check.check_file(path)
                      if f.rule == "unparsable"]
            skipped.append(Skipped(
                str(path), unread[0].message if unread
                else str(e).splitlines()[0],
                finding=unread[0] if unread else None))
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

