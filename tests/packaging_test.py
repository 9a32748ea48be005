"""What setup.py declares is what noxfile.py tests and what the docs show."""

import ast
import pathlib
import re

import pytest

from tf_lso._src import compat

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _matrix():
    """noxfile.MATRIX as (tf, keras, tf_keras, tags), read without nox."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if (isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", None) == "MATRIX"):
            return ast.literal_eval(node.value)
    raise AssertionError("noxfile.py has no MATRIX")


def _minor(version):
    return tuple(int(p) for p in version.split(".")[:2])


def _declared(package):
    """setup.py's (lower, upper) bounds of `package`, the same in every extra."""
    text = (ROOT / "setup.py").read_text()
    found = set(re.findall(rf'"{package}>=([\d.]+),<([\d.]+)"', text))
    assert len(found) == 1, (package, found)
    lower, upper = found.pop()
    return _minor(lower), _minor(upper)


def test_matrix_covers_every_declared_tensorflow_and_keras():
    matrix = _matrix()
    tf_lower, tf_upper = _declared("tensorflow")
    keras_lower, keras_upper = _declared("keras")
    assert _declared("tensorflow-cpu") == (tf_lower, tf_upper)
    assert _declared("tf-keras") == (tf_lower, tf_upper)
    tested_tf = {_minor(row[0]) for row in matrix}
    # Every TensorFlow minor version in the declared range, no other.
    assert tested_tf == {(2, m) for m in range(tf_lower[1], tf_upper[1])}
    tested_keras = {_minor(row[1]) for row in matrix}
    assert min(tested_keras) == keras_lower
    assert max(tested_keras) == (keras_upper[0], keras_upper[1] - 1)
    # The oldest TensorFlow with the newest Keras and the lowest, too.
    oldest = [row for row in matrix if _minor(row[0]) == tf_lower]
    assert {_minor(row[1]) for row in oldest} == {keras_lower,
                                                 max(tested_keras)}
    for tf_version, _, tf_keras_version, _ in matrix:
        assert _minor(tf_keras_version) == _minor(tf_version)
    assert (compat.MIN_TENSORFLOW, compat.MIN_KERAS) == (tf_lower, keras_lower)


def test_ci_runs_the_oldest_and_the_newest_pair():
    matrix = _matrix()
    ci = [row[:3] for row in matrix if "ci" in row[3]]
    key = lambda row: (_minor(row[0]), _minor(row[1]))  # noqa: E731
    assert ci == [min(matrix, key=key)[:3], max(matrix, key=key)[:3]]


@pytest.mark.parametrize("doc", ["README.md", "docs/index.md"])
def test_docs_show_the_tested_matrix(doc):
    rows = re.findall(
        r"^\| *([\d.]+) *\| *([\d.]+) *\| *([\d.]+) *\|", (ROOT / doc).read_text(),
        re.M,
    )
    assert rows == [row[:3] for row in _matrix()]


def test_ci_script_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"Full test suite.*?```\n(.+?)\n```", readme, re.S)
    script = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert script[-1] == command.group(1)
    assert "nox" in command.group(1) and "-t ci" in command.group(1)


def test_ci_lints_first_with_a_pinned_ruff():
    text = (ROOT / "noxfile.py").read_text()
    lint = text.index("def lint(")
    assert '@nox.session(python="3.11", tags=["ci"])\ndef lint(' in text
    assert lint < text.index("def tests(")  # nox runs sessions in file order
    assert re.search(r'RUFF = "ruff==\d+\.\d+\.\d+"', text)
    assert (ROOT / "ruff.toml").exists()


def test_ci_type_checks_both_packages_with_a_pinned_mypy():
    text = (ROOT / "noxfile.py").read_text()
    assert '@nox.session(python="3.11", tags=["ci"])\ndef typecheck(' in text
    assert re.search(r'MYPY = "mypy==\d+\.\d+\.\d+"', text)
    config = (ROOT / "pyproject.toml").read_text()
    files = re.search(r"^\[tool\.mypy\]\n(?:.*\n)*?files = (\[.*\])$", config,
                      re.M)
    assert ast.literal_eval(files.group(1)) == ["tf_lso", "tf_lso_migration"]


def _python_floor():
    text = (ROOT / "setup.py").read_text()
    return _minor(re.search(r'python_requires=">=([\d.]+)"', text).group(1))


def test_ruff_targets_the_declared_python_floor():
    # ruff then never suggests syntax newer than the oldest Python we accept.
    floor = _python_floor()
    text = (ROOT / "ruff.toml").read_text()
    assert f'target-version = "py{floor[0]}{floor[1]}"' in text


_TYPE_NAMES = {"bool", "int", "float", "str", "bytes", "dict", "list",
               "tuple", "set", "frozenset", "object", "type", "Any"}


def _runtime_unions(path):
    """`A | B` evaluated at import: where an operand is a type-like name,
    outside annotations (strings under `from __future__ import annotations`)."""
    tree = ast.parse(path.read_text())
    in_annotation = set()
    postponed = any(
        isinstance(node, ast.ImportFrom) and node.module == "__future__"
        and any(alias.name == "annotations" for alias in node.names)
        for node in tree.body
    )
    for node in ast.walk(tree) if postponed else ():
        for field in ("annotation", "returns"):
            value = getattr(node, field, None)
            if value is not None:
                in_annotation.update(id(n) for n in ast.walk(value))
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr)
                and id(node) not in in_annotation):
            operands = (node.left, node.right)
            if any(isinstance(o, ast.Attribute) and o.attr[:1].isupper()
                   or isinstance(o, ast.Name) and o.id in _TYPE_NAMES
                   or isinstance(o, ast.Constant) and o.value is None
                   for o in operands):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_runtime_type_unions_below_python_3_10():
    # `tf.Tensor | None` evaluated at import time is a TypeError on Python
    # 3.9, which setup.py accepts; so is `bool | None` in the annotations of
    # a module without `from __future__ import annotations`.
    if _python_floor() >= (3, 10):
        pytest.skip("setup.py requires Python 3.10+")
    found = [u for package in ("tf_lso", "tf_lso_migration")
             for p in sorted((ROOT / package).rglob("*.py"))
             for u in _runtime_unions(p)]
    assert not found, found


def test_both_packages_ship_and_the_command_starts_without_tf_lso():
    # The migration tool is a package beside tf_lso (it imports nothing of
    # it), so the `tf-lso` script starts there: `check` imports no
    # TensorFlow whatever is installed.
    text = (ROOT / "setup.py").read_text()
    assert '"tf_lso_migration", "tf_lso_migration.*"' in text
    assert '"tf-lso = tf_lso_migration.cli:console_main"' in text
    for package in ("tf_lso", "tf_lso_migration"):
        assert (ROOT / package / "py.typed").is_file(), package
        assert f'"{package}": ["py.typed"]' in text, package


def test_changelog_uses_only_keep_a_changelog_sections():
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (.+)$", text, re.M)
    assert versions[0] == "Unreleased"
    sections = re.findall(r"^### (.+)$", text, re.M)
    assert sections
    assert set(sections) <= {"Added", "Changed", "Deprecated", "Removed",
                             "Fixed", "Security"}, sections
