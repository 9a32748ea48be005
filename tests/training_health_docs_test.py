"""docs/training_health.md's self-contained Python examples run and print
what their comments say (issue 43).

A fenced `python` block that starts with an import is a whole program: it
runs in a fresh interpreter, and each `print(...)` whose last line ends with
a `# comment` must print that comment.
"""

import pathlib
import re
import subprocess
import sys

import pytest

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "training_health.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _programs():
    return [block for block in _BLOCK.findall(DOC.read_text())
            if block.startswith("import ")]


def _expected(program):
    """The comments that end each print call, in order."""
    expected, depth, in_print = [], 0, False
    for line in program.splitlines():
        code, _, comment = line.partition("  # ")
        if code.startswith("print("):
            in_print = True
        if in_print:
            depth += code.count("(") - code.count(")")
            if depth == 0:
                in_print = False
                expected.append(comment.strip())
    return expected


def test_there_are_examples():
    assert len(_programs()) >= 2


@pytest.mark.parametrize("index", range(len(_programs())))
def test_example_prints_what_it_says(index):
    program = _programs()[index]
    done = subprocess.run([sys.executable, "-c", program], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == _expected(program), program
