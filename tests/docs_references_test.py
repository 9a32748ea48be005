"""Every file, heading and name that README.md and docs/ cite exists.

Checked in each document (CHANGELOG.md is not one: it records history, and
names that are gone belong there):

* links: a relative link's file exists, and its `#anchor` is a heading of
  the file it points to (GitHub's rule for a heading's anchor);
* inline code outside fenced blocks (a fenced block is code or a command:
  tests/docs_commands_test.py runs the commands):
  - a path: `tests/x_test.py` (with `::Name`, a name the file defines), a
    folder `examples/legacy/`, a path inside tf_lso such as
    `inner/kinds/tf_keras.py` or `_src/compat.py`, a file name `compat.py`
    (some file of the repository has it);
  - a dotted name of tf_lso (`tf_lso.experimental.LossScaleOptimizer`, also
    called, `tf_lso.install()`, or with choices,
    `tf_lso.experimental.{get,serialize}`): it imports and resolves;
  - `module.name`, where `module` is the name of a module file of
    `tf_lso/_src` or of the migration tool (`loss_scale.advance`,
    `rule.Rule`): a module of that name has the attribute.

A template (`tests/<name>_test.py`, `tf_lso.optimizers.*`) is not checked.
`test_a_planted_error_is_found` shows each check failing on a bad
reference; `test_many_references_are_checked` that the documents were read.
"""

import ast
import functools
import importlib
import inspect
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Where the repository's own files are (not virtualenvs or build output).
SOURCE_FOLDERS = ("tf_lso", "tf_lso_migration", "tests", "benchmarks",
                  "examples", "docs", ".ci")
PACKAGES = ("tf_lso", "tf_lso_migration")
# Module file names that stand for something else in the documents.
SHADOWED = {"tf_keras": "the tf_keras package (kinds/tf_keras.py is cited "
                        "by its path)"}

_FENCE = re.compile(r"^ *```.*?^ *```", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)
_TEMPLATE = re.compile(r"[<>*…]|\.\.\.")
_FILE = re.compile(r"^(?:[\w.-]+/)*[\w.-]+\.(?:py|toml|md|ini|cfg|txt|ya?ml"
                   r"|ipynb|json)$")
_FOLDER = re.compile(r"^(?:[\w.-]+/)+$")
_DOTTED = re.compile(r"^([A-Za-z_]\w*)((?:\.\w+)+)(?:\(.*\))?$", re.DOTALL)


def prose(text):
    """`text` without its fenced code blocks."""
    return _FENCE.sub("", text)


def github_anchors(text):
    """The anchors GitHub gives the headings of a Markdown `text`."""
    anchors, seen = set(), {}
    for _, heading in _HEADING.findall(prose(text)):
        # What the heading renders as: link texts, code without backticks.
        heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
        heading = heading.replace("`", "").replace("*", "")
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(
            " ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    anchors.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))
    return anchors


@functools.cache
def repository_files():
    """Every file of the repository, as a path relative to ROOT (posix)."""
    files = {path.name for path in ROOT.iterdir() if path.is_file()}
    for folder in SOURCE_FOLDERS:
        files.update(path.relative_to(ROOT).as_posix()
                     for path in (ROOT / folder).rglob("*")
                     if path.is_file() and "__pycache__" not in path.parts)
    return frozenset(files)


@functools.cache
def source_folders():
    """The names of the folders a cited folder may start with: the
    repository's source folders and the packages' folders."""
    names = set(SOURCE_FOLDERS)
    for package in PACKAGES:
        names.update(path.name for path in (ROOT / package).rglob("*")
                     if path.is_dir() and path.name != "__pycache__")
    return frozenset(names)


@functools.cache
def module_stems():
    """{module file name: the dotted names of the modules so named}."""
    stems = {}
    for package in PACKAGES:
        root = ROOT / package / "_src" if package == "tf_lso" else (
            ROOT / package)
        for path in root.rglob("*.py"):
            if path.name != "__init__.py":
                dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                stems.setdefault(path.stem, []).append(dotted)
    return stems


def _check_link(document, text, target):
    """Why a link of `document` (whose text is `text`) to `target` is
    broken, or None."""
    file_part, _, anchor = target.partition("#")
    if file_part:
        linked = (document.parent / file_part).resolve()
        if not linked.exists():
            return "no such file"
        if anchor and linked.suffix != ".md":
            return "an anchor in a file that is not Markdown"
        if anchor:
            text = linked.read_text(encoding="utf-8")
    if anchor and anchor not in github_anchors(text):
        return f"no heading there has the anchor #{anchor}"
    return None


def _check_path(span):
    """Why a cited path does not exist, or None."""
    path, _, name = span.partition("::")
    files = repository_files()
    if path.endswith("/"):
        folder = path.rstrip("/")
        found = any(f.startswith(path) or f"/{folder}/" in f"/{f}"
                    for f in files)
    elif "/" in path:
        found = path in files or any(
            f.startswith("tf_lso") and f.endswith(f"/{path}") for f in files)
    else:  # A file name: some file of the repository has it.
        found = any(f.rpartition("/")[2] == path for f in files)
    if not found:
        return "no such file or folder"
    if name:
        tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
        defined = {node.name for node in ast.walk(tree) if isinstance(
            node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}
        if name.split("::")[0] not in defined:
            return f"{path} defines no {name}"
    return None


def _resolve(module_name, attributes):
    """Whether `module_name` imports and has the chain of `attributes`."""
    try:
        found = importlib.import_module(module_name)
    except ImportError:
        return False
    for attribute in attributes:
        if hasattr(found, attribute):
            found = getattr(found, attribute)
        elif inspect.ismodule(found):  # A submodule its package leaves out.
            try:
                found = importlib.import_module(
                    f"{found.__name__}.{attribute}")
            except ImportError:
                return False
        else:
            return False
    return True


def _expanded(span):
    """A span with `{a,b}` choices, as one name per choice."""
    match = re.search(r"\{([\w,\s]+)\}", span)
    if not match:
        return [span]
    return [span[:match.start()] + choice.strip() + span[match.end():]
            for choice in match.group(1).split(",")]


def _check_name(span):
    """Why a cited `tf_lso.x` or `module.name` does not exist, or None;
    `False` when the span is neither (not checked)."""
    names = []
    for name in _expanded(span):
        match = _DOTTED.match(name)
        if not match:
            return False
        names.append((match.group(1), match.group(2).split(".")[1:]))
    first = names[0][0]
    if first in PACKAGES:
        missing = [f"{first}.{'.'.join(rest)}" for first, rest in names
                   if not _resolve(first, rest)]
        return f"{', '.join(missing)} does not resolve" if missing else None
    if first in module_stems() and first not in SHADOWED:
        missing = [f"{first}.{'.'.join(rest)}" for first, rest in names
                   if not any(_resolve(module, rest)
                              for module in module_stems()[first])]
        return (f"no module named {first} "
                f"({', '.join(module_stems()[first])}) has "
                f"{', '.join(missing)}") if missing else None
    return False


def references(document, text=None):
    """`(checked, problems)` of a document: how many links, paths and names
    it cites that are checked, and `(reference, why)` for each that does not
    exist. `text` stands for the document's own, to test the checker."""
    if text is None:
        text = document.read_text(encoding="utf-8")
    checked, problems = 0, []
    for target in _LINK.findall(prose(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        checked += 1
        why = _check_link(document, text, target)
        if why:
            problems.append((f"({target})", why))
    for _, span in _CODE_SPAN.findall(prose(text)):
        span = " ".join(span.split())
        if _TEMPLATE.search(span.split("(")[0]) or " " in span.split("(")[0]:
            continue
        path = span.split("::")[0]
        if _FILE.match(path) or (_FOLDER.match(path) and path.split("/")[0]
                                 in source_folders()):
            why = _check_path(span)
        else:
            why = _check_name(span)
            if why is False:
                continue
        checked += 1
        if why:
            problems.append((f"`{span}`", why))
    return checked, problems


@pytest.mark.parametrize("document", DOCUMENTS,
                         ids=lambda path: str(path.relative_to(ROOT)))
def test_every_cited_link_path_and_name_exists(document):
    _, problems = references(document)
    assert not problems, "\n".join(f"{reference}: {why}"
                                   for reference, why in problems)


def test_many_references_are_checked():
    counts = {document.relative_to(ROOT).as_posix(): references(document)[0]
              for document in DOCUMENTS}
    assert sum(counts.values()) >= 250, counts
    assert counts["docs/architecture.md"] >= 80, counts
    assert set(SHADOWED) <= set(module_stems()), "SHADOWED names no module"


PLANTED = """\
# A page

## Its `heading`, twice

## Its `heading`, twice

See [the guide](migration.md#checking-a-code-base), [this page](#a-page),
[the second heading](#its-heading-twice-1) and [GitHub](https://github.com).
`tests/layering_test.py`, `tests/layering_test.py::graph`, `examples/legacy/`,
`kinds/tf_keras.py`, `_src/compat.py`, `noxfile.py`, `tf_lso.install()`,
`tf_lso.experimental.{get,serialize}`, `tf_lso.callbacks.LossScaleMonitor`,
`replicas.all_finite`, `rule.Rule`, `tf_keras.optimizers.Optimizer`,
`tests/<name>_test.py`, `opt.loss_scale`.

Planted: [a](nowhere.md), [b](migration.md#nowhere), [c](#its-heading),
`tests/nowhere_test.py`, `tests/layering_test.py::nowhere`,
`kinds/nowhere.py`, `nowhere.py`, `examples/nowhere/`, `tf_lso.Nowhere`,
`tf_lso.experimental.{get,nowhere}`, `tf_lso.nowhere.Name()`,
`replicas.nowhere`, `rule.Nowhere`.

```
`tf_lso.InAFencedBlock` [d](in_a_fenced_block.md)
```
"""


def test_a_planted_error_is_found():
    checked, problems = references(ROOT / "docs" / "planted.md", PLANTED)
    assert [reference for reference, _ in problems] == [
        "(nowhere.md)", "(migration.md#nowhere)", "(#its-heading)",
        "`tests/nowhere_test.py`", "`tests/layering_test.py::nowhere`",
        "`kinds/nowhere.py`", "`nowhere.py`", "`examples/nowhere/`",
        "`tf_lso.Nowhere`", "`tf_lso.experimental.{get,nowhere}`",
        "`tf_lso.nowhere.Name()`",
        "`replicas.nowhere`", "`rule.Nowhere`"]
    assert checked == 3 + 11 + 13, problems
