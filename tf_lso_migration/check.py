"""`python -m tf_lso check`: find legacy mixed-precision code, file by file.

Standard library only (`ast`, `json`), so it needs no optional extra. The
rules are `rules.RULES` (one module each in `rules/`): this walks a file's
tree once and hands each node to the rules that visit its type (those
that hold on the route, `Options`). Each finding names its rule, whose
severity and documentation (`tf-lso rule ID`) are the rule's. Also which
files a run reads (`python_files`: exclusions, named files that are not
Python) and where a notebook's code is in its JSON text.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import io
import json
import os
import pathlib
import re
import tokenize
from collections.abc import Collection
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Callable
from typing import Union

from tf_lso_migration import rule as rule_lib
from tf_lso_migration import rules

#: A path as the entry points take it.
Path = Union[str, "os.PathLike[str]"]

_SUPPRESSION = re.compile(r"#\s*tf-lso:\s*ignore(?:\[([^\]]*)\])?")


@dataclasses.dataclass(frozen=True)
class Options:
    """Which findings `check` reports, and so which `--fix` rewrites.

    Attributes:
        select: Rule ids to report (empty: every rule).
        ignore: Rule ids not to report.
        route: The route the code base is on (`rules.ROUTES`): rules that
            do not hold there are not run.
    """

    select: Collection[str] = frozenset()
    ignore: Collection[str] = frozenset()
    route: str = rules.ROUTES[0]

    def __post_init__(self) -> None:
        object.__setattr__(self, "select", frozenset(self.select))
        object.__setattr__(self, "ignore", frozenset(self.ignore))
        if self.route not in rules.ROUTES:
            raise ValueError(f"unknown route {self.route!r}; the routes "
                             f"are: {', '.join(rules.ROUTES)}")

    def runs(self, rule: rule_lib.Rule) -> bool:
        """Whether `rule` is run: it holds on the route."""
        return self.route in rule.routes

    def reports(self, rule_id: str) -> bool:
        """Whether findings of rule `rule_id` are reported."""
        return (self.runs(rules.RULES[rule_id])
                and (not self.select or rule_id in self.select)
                and rule_id not in self.ignore)


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing `check` reports.

    Attributes:
        path: The file, as given or found under a given directory.
        line: 1-based line (in the cell, for notebooks).
        column: 1-based column.
        rule: The rule id (`rules.RULES`).
        message: What was found and what to do.
        cell: The notebook cell: its index in the notebook's `cells`
            (counted from 0, markdown cells included), or None for a .py
            file.
        fixable: Whether `--fix` rewrites it.
        file_line: In a notebook, the line of the .ipynb file (its JSON)
            that holds the code line (None for a .py file).
        file_column: In a notebook, the column there (1-based, in
            characters of the file).
        severity: One of `rules.SEVERITIES`: the rule's, unless the rule
            said otherwise for this finding ("" when made: the rule's).
    """

    path: str
    line: int
    column: int
    rule: str
    message: str
    cell: int | None = None
    fixable: bool = False
    file_line: int | None = None
    file_column: int | None = None
    severity: str = ""

    def __post_init__(self) -> None:
        if not self.severity:
            object.__setattr__(self, "severity",
                               rules.RULES[self.rule].severity)

    def location(self) -> str:
        cell = "" if self.cell is None else f"[cell {self.cell}]"
        return f"{self.path}{cell}:{self.line}:{self.column}"

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def _walk(tree, context, options):
    """Hands every node to the rules that visit its type, in source order.

    Every rule that holds on the route and whose words the file mentions
    runs, selected or not, so that what a rule sees does not depend on
    `--select`. An assignment of a dotted
    name (`mp = tf.keras.mixed_precision.experimental`) is recorded first,
    so that later `mp.X` resolves.
    """
    running = [rule for rule in rules.RULES.values() if options.runs(rule)
               and context.mentions(*rule.mentions)]
    by_type = {}
    for rule in running:
        for node_type in rule.visits:
            by_type.setdefault(node_type, []).append(rule)

    def visit(node):
        node_type = type(node)
        if node_type is ast.Assign:
            found = context.resolve(node.value)
            if found and len(node.targets) == 1 and isinstance(
                    node.targets[0], ast.Name):
                context.names[node.targets[0].id] = found[0]
        skip = False
        for rule in by_type.get(node_type, ()):
            if rule.visit(node, context) is rule_lib.SkipChildren:
                skip = True
        if skip or node_type is ast.Import or node_type is ast.ImportFrom:
            return
        fields = _FIELDS.get(node_type)
        if fields is None:
            fields = _FIELDS[node_type] = tuple(
                f for f in node_type._fields if f not in _LEAF_FIELDS)
        for field in fields:  # ast.iter_child_nodes, less the leaves.
            value = getattr(node, field, None)
            if type(value) is list:
                for child in value:
                    if isinstance(child, ast.AST):
                        visit(child)
            elif isinstance(value, ast.AST):
                visit(value)

    visit(tree)
    for rule in running:
        rule.finish(context)


# The fields of a node that hold only expression contexts and operators
# (`Load`, `Add`, `Eq`): nodes without children, which no rule visits. The
# walk skips them (a third of the nodes). `_FIELDS`: by node type, the
# fields it reads (names and constants hold no node).
_LEAF_FIELDS = frozenset({"ctx", "op", "ops"})
_FIELDS: dict[type, tuple[str, ...]] = {ast.Name: (), ast.Constant: ()}


def check_source(source: str, path: str = "<string>",
                 cell: int | None = None, collapse: bool = True,
                 options: Options | None = None,
                 line_name: Callable[[int], str] | None = None,
                 fixes: bool = True) -> list[Finding]:
    """Findings in Python source text, sorted by position.

    Args:
        source: The code.
        path: Reported as the findings' path.
        cell: The notebook cell index, if any.
        collapse: Report each `info` rule once (`one_note_per_rule`).
        options: `Options` (default: every rule, on the default route).
        line_name: How a message names another line of `source` (default
            "line N"; a notebook's cells joined say which cell).
        fixes: Whether `--fix` rewrites `source` (a notebook's it does
            not): if not, no finding is fixable.

    Returns:
        A list of `Finding`s. A syntax error gives one `unparsable` finding.
    """
    options = options or Options()
    try:
        tree = ast.parse(source, path)
    except (SyntaxError, ValueError) as e:
        if not options.reports("unparsable"):
            return []
        line = getattr(e, "lineno", None) or 1
        return [Finding(path, line, (getattr(e, "offset", None) or 1),
                        "unparsable", f"Not parsed, skipped: {e}.", cell)]
    found: list[Finding] = []

    def report(node, rule_id, message, fixable, severity):  # A Report.
        found.append(Finding(path, node.lineno, node.col_offset + 1, rule_id,
                             message, cell, fixable, severity=severity))

    _walk(tree, rule_lib.Context(tree, report, options.route, line_name,
                                 source, fixes), options)
    ignored = suppressions(source)
    found = [f for f in set(found)
             if options.reports(f.rule) and not _suppressed(f, ignored)]
    found = sorted(found, key=lambda f: (f.line, f.column, f.rule))
    return one_note_per_rule(found) if collapse else found


def suppressions(source: str) -> dict[int, set[str] | None]:
    """{line: rule ids ignored there (None: all)}, from `# tf-lso: ignore`.

    `# tf-lso: ignore` on a line ignores every finding that starts there;
    `# tf-lso: ignore[rule-a, rule-b]` only those rules.
    """
    ignored: dict[int, set[str] | None] = {}
    if "tf-lso" not in source:
        return ignored  # Tokenizing is most of the time a file takes.
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


def one_note_per_rule(
        findings: Iterable[Finding],
        where: Callable[[Finding], str] = lambda f: str(f.line),
) -> list[Finding]:
    """Keeps the first `info` finding of each rule and message; it lists
    the others.

    A note that something works as before is worth reading once per file,
    not at every call site.
    """
    first: dict[tuple[str, str], tuple[int, list[str]]] = {}
    kept: list[Finding] = []
    for finding in findings:
        note = (finding.rule, finding.message)
        if finding.severity != "info":
            kept.append(finding)
        elif note not in first:
            first[note] = (len(kept), [])
            kept.append(finding)
        else:
            first[note][1].append(where(finding))
    for index, others in first.values():
        if others:
            noun = "line" if len(others) == 1 else "lines"
            kept[index] = dataclasses.replace(
                kept[index], message=f"{kept[index].message} (Also at "
                f"{noun} {', '.join(others)}.)")
    return kept


def notebook_cells(text: str) -> list[tuple[int, str]]:
    """The code cells of a notebook as sources, each magic a `pass` (same
    lines); a cell magic's body blank, unless it is Python (`%%time`).

    As IPython reads a cell: blank lines before a cell magic leave it one.
    """
    cells: list[tuple[int, str]] = []
    for index, cell in enumerate(json.loads(text).get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        lines = source.split("\n")
        first = next((at for at, line in enumerate(lines) if line.strip()), 0)
        if lines[first].startswith("%%"):  # A cell magic.
            magic = lines[first][2:].split()
            body = lines[first + 1:]
            if not (magic and magic[0] in _PYTHON_CELL_MAGICS):
                body = [""] * len(body)
            lines = [""] * (first + 1) + body
        cells.append((index, "\n".join(_without_magics(lines))))
    return cells


# The cell magics whose body is Python, run as the cell's code.
_PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun"})
# A magic's output assigned: `gpus = !nvidia-smi -L`, `t = %timeit -o f()`.
_ASSIGNED_MAGIC = re.compile(r"\s*[\w.]+\s*=\s*[!%]")
# Where a string or a comment starts (triple quotes first); where each
# kind of string ends.
_QUOTES = ("'''", '"""', "'", '"')
_OPENS = re.compile("|".join([*_QUOTES, "#"]))
_ENDS = {quote: re.compile(r"(?:\\.|[^\\])*?" + quote) for quote in _QUOTES}


def _without_magics(lines: list[str]) -> Iterator[str]:
    """`lines` with each line magic, shell escape and `name?` help a `pass`
    at its indent, so that a block it is alone in stays a block, and the
    lines that continue it after a `\\` blank (`!pip install -q \\`).

    A comment is Python, and so is a line inside brackets or a string
    (a docstring's `(2 build`), or after a `\\` (`!= b`, `% 3`): they stay
    as they are.
    """
    depth, quote, continued, magic = 0, None, False, False
    for line in lines:
        if magic:  # A line of the magic above.
            magic = line.endswith("\\")
            yield ""
            continue
        top = not (depth or quote or continued)
        code, quote = _code(line, quote)
        code = code.strip()
        if top and (line.lstrip().startswith(("%", "!", "?"))
                    or code.endswith("?") or _ASSIGNED_MAGIC.match(line)):
            yield line[:len(line) - len(line.lstrip())] + "pass"
            quote, magic = None, line.endswith("\\")
            continue
        depth = max(0, depth + sum(map(code.count, "([{"))
                    - sum(map(code.count, ")]}")))
        continued = code.endswith("\\")
        yield line


def _code(line: str, quote: str | None) -> tuple[str, str | None]:
    """The code of `line`, less its strings and comment, and the quote of a
    string it leaves open (a triple quote, or one that a `\\` continues);
    `quote`: the one open before it."""
    code, at = [], 0
    while True:
        if quote:
            end = _ENDS[quote].match(line, at)
            if end is None:
                break
            at, quote = end.end(), None
        found = _OPENS.search(line, at)
        code.append(line[at:found.start() if found else len(line)])
        if found is None or found.group() == "#":
            break
        at, quote = found.end(), found.group()
    if quote and len(quote) == 1 and not line.endswith("\\"):
        quote = None
    return "".join(code), quote


def _check_notebook(text, path, options):
    """Checks the cells as one program (a cell sees earlier imports)."""
    starts, lines = [], []
    for index, source in notebook_cells(text):
        starts.append((len(lines), index))
        lines.extend(source.split("\n"))

    def in_cell(line):
        """(cell, line in it) of a line of the cells joined."""
        first, cell = max(s for s in starts if s[0] < line)
        return cell, line - first

    def line_name(line):
        cell, line = in_cell(line)
        return f"line {line} of cell {cell}"

    findings = []
    # Checked, not rewritten: `--fix` leaves notebooks alone.
    for finding in check_source("\n".join(lines), path, collapse=False,
                                options=options, line_name=line_name,
                                fixes=False):
        cell, line = in_cell(finding.line)
        findings.append(dataclasses.replace(finding, line=line, cell=cell))
    if findings:
        where = _NotebookText(text)
        findings = [dataclasses.replace(f, **where.position(f))
                    for f in findings]
    return one_note_per_rule(
        findings, where=lambda f: f"{f.line} of cell {f.cell}")


_SPACE = re.compile(r"[ \t\n\r]*")


class _NotebookText:
    """Where each code line of a notebook is in the notebook's JSON text.

    JSON strings hold no line break, so a cell's source line is on the
    file line of the JSON string that holds its start; the column is found
    by reading that string's escapes.
    """

    def __init__(self, text):
        self._text = text
        self._sources = {}  # cell index -> [(offset of `"`, decoded text)]
        self._value(_SPACE.match(text).end(), ())

    def position(self, finding):
        """`file_line` and `file_column` of a notebook finding."""
        pieces = self._sources.get(finding.cell)
        if not pieces:
            return {}
        source = "".join(piece for _, piece in pieces)
        at = 0  # Where the finding's line starts in the cell's source.
        for _ in range(finding.line - 1):
            at = source.index("\n", at) + 1
        line = source[at:].split("\n", 1)[0]
        # The column counts UTF-8 bytes (as `ast` does); make it characters.
        at += len(line.encode("utf-8")[:finding.column - 1].decode(
            "utf-8", "ignore"))
        index = 0  # The JSON string that holds the character at `at`.
        while index < len(pieces) - 1 and at >= len(pieces[index][1]):
            at -= len(pieces[index][1])
            index += 1
        offset = self._raw_offset(pieces[index][0] + 1, at)
        file_line = self._text.count("\n", 0, offset) + 1
        return {"file_line": file_line,
                "file_column": offset - self._text.rfind("\n", 0, offset)}

    def _raw_offset(self, offset, characters):
        """The offset in the file `characters` decoded characters after
        `offset`, inside a JSON string."""
        text = self._text
        for _ in range(characters):
            if text[offset] != "\\":
                offset += 1
            elif text[offset + 1] != "u":
                offset += 2
            elif (0xD800 <= int(text[offset + 2:offset + 6], 16) < 0xDC00
                  and text[offset + 6:offset + 8] == "\\u"):
                offset += 12  # A surrogate pair: one character.
            else:
                offset += 6
        return offset

    def _value(self, at, path):
        """Reads the JSON value at `at`, recording cell sources; its end."""
        text = self._text
        if text[at] == "{":
            at = _SPACE.match(text, at + 1).end()
            while text[at] != "}":
                key, at = json.decoder.scanstring(text, at + 1)
                at = _SPACE.match(text, at).end() + 1  # The `:`.
                at = self._value(_SPACE.match(text, at).end(), path + (key,))
                at = _SPACE.match(text, at).end()
                if text[at] == ",":
                    at = _SPACE.match(text, at + 1).end()
            return at + 1
        if text[at] == "[":
            at, index = _SPACE.match(text, at + 1).end(), 0
            while text[at] != "]":
                at = self._value(at, path + (index,))
                at, index = _SPACE.match(text, at).end(), index + 1
                if text[at] == ",":
                    at = _SPACE.match(text, at + 1).end()
            return at + 1
        if text[at] == '"':
            value, end = json.decoder.scanstring(text, at + 1)
            if len(path) >= 3 and path[0] == "cells" and path[2] == "source":
                self._sources.setdefault(path[1], []).append((at, value))
            return end
        return _DECODER.raw_decode(text, at)[1]  # A number, true, ...


_DECODER = json.JSONDecoder()


def decode(data: bytes) -> str:
    """A Python file's bytes as text, decoded as Python decodes them.

    A PEP 263 coding line or a UTF-8 byte order mark is honoured; line ends
    are kept as they are.

    Raises:
        SyntaxError, UnicodeDecodeError: If Python could not read it either.
    """
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding)


def check_file(path: Path, options: Options | None = None) -> list[Finding]:
    """Findings in one .py or .ipynb file; unreadable files are a finding."""
    path = pathlib.Path(path)
    options = options or Options()
    try:
        if path.suffix == ".ipynb":
            text = path.read_text(encoding="utf-8")
            return _check_notebook(text, str(path), options)
        text = decode(path.read_bytes())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError,
            AttributeError) as e:
        if not options.reports("unparsable"):
            return []
        return [Finding(str(path), 1, 1, "unparsable",
                        f"Not read, skipped: {e}.")]
    return check_source(text, str(path), options=options)


def _is_python(path):
    """Whether a file named on the command line is one `check` reads."""
    if path.suffix in (".py", ".ipynb"):
        return True
    try:  # A script without the suffix (pre-commit passes those too).
        with open(path, "rb") as file:
            first = file.readline(256)
    except OSError:
        return path.suffix == ""  # Reported as unreadable when checked.
    return first.startswith(b"#!") and b"python" in first


def _excluded(path, patterns, root):
    """Whether `path` or a directory it is in matches a pattern.

    A pattern is a glob matched against the path relative to `root`
    (`third_party/*`, `build`), or, without a `/`, against each name on
    the path (`gen_*.py`).
    """
    if not patterns:
        return False
    path = os.path.abspath(path)
    relative = os.path.relpath(path, os.path.abspath(root))
    if relative.startswith(os.pardir):
        relative = path.lstrip(os.sep)
    parts = pathlib.PurePath(relative).parts
    for pattern in patterns:
        pattern = pattern.strip("/")
        if pattern.startswith("./"):
            pattern = pattern[2:]
        for index in range(len(parts)):
            if fnmatch.fnmatch("/".join(parts[:index + 1]), pattern) or (
                    "/" not in pattern and fnmatch.fnmatch(parts[index],
                                                           pattern)):
                return True
    return False


def python_files(paths: Iterable[Path], exclude: Sequence[str] = (),
                 root: Path = ".",
                 notices: list[str] | None = None) -> Iterator[pathlib.Path]:
    """The .py and .ipynb files under `paths`, in order.

    Directories are searched; hidden directories, `__pycache__` and
    virtualenvs are not entered. A file named in `paths` is kept if it is
    a .py or .ipynb file or a script whose first line runs Python;
    another is skipped with a notice.

    Args:
        paths: Files and directories.
        exclude: Glob patterns (see `_excluded`); what matches is left out,
            also when named in `paths` (as pre-commit names files).
        root: The directory `exclude` patterns are relative to.
        notices: A list to append a line to for each named file skipped.
    """
    for path in map(pathlib.Path, paths):
        if _excluded(path, exclude, root):
            continue
        if not path.is_dir():
            if _is_python(path):
                yield path
            elif notices is not None:
                notices.append(f"{path}: skipped: not a Python file or "
                               "notebook")
            continue
        for directory, dirs, files in os.walk(path):
            dirs[:] = sorted(
                d for d in dirs
                if not d.startswith(".") and d != "__pycache__"
                and not (pathlib.Path(directory, d, "pyvenv.cfg")).exists()
                and not _excluded(os.path.join(directory, d), exclude, root)
            )
            for name in sorted(files):
                if name.endswith((".py", ".ipynb")) and not _excluded(
                        os.path.join(directory, name), exclude, root):
                    yield pathlib.Path(directory, name)
