"""docs/training_health.md's self-contained Python examples run and print
what their comments say (issue 43).

A fenced `python` block that starts with an import is a whole program: it
runs in globals of its own (the programs run one after another in one
interpreter, started for them), and each `print(...)` whose last line ends
with a `# comment` must print that comment.
"""

import json
import math
import pathlib
import re
import subprocess
import sys

import docs_commands_test
import pytest
import session_once

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


# Runs each program given on stdin (a JSON list) in globals of its own, one
# after another; prints a JSON list of their [status, stdout, stderr].
_RUN_EACH = """
import contextlib, io, json, sys, traceback

runs = []
for program in json.loads(sys.stdin.read()):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            exec(compile(program, "<program>", "exec"),
                 {"__name__": "__main__"})
            status = 0
        except BaseException:
            traceback.print_exc()
            status = 1
    runs.append([status, out.getvalue(), err.getvalue()])
print(json.dumps(runs))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each program's run as a `CompletedProcess`: all of them in one
    interpreter, started once per session."""
    def run():
        done = subprocess.run(
            [sys.executable, "-c", _RUN_EACH], input=json.dumps(_programs()),
            capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout)

    return [subprocess.CompletedProcess(program, *run_)
            for program, run_ in zip(_programs(), session_once.result(
                "training_health_programs", run, tmp_path_factory))]


@pytest.mark.parametrize("index", range(len(_programs())))
def test_example_prints_what_it_says(index, runs):
    program = _programs()[index]
    done = runs[index]
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == _expected(program), program


# -- The demo's gradient report (issue 51) ------------------------------------
# docs/training_health.md shows one example run's table, labelled so; what
# its prose says holds on any machine is checked here on a fresh run and on
# that example: not the digits, which depend on the CPU.

_HEADER = (" step  loss scale    zero   below  room | scale 1:    zero   below"
           "  room")
_NUMBER = re.compile(r"\d+(\.\d+)?%?")


def _doc_table():
    """The example table the doc shows, and the paragraph before it."""
    text = DOC.read_text()
    at = text.index("```\ngradients in float16's range")
    paragraph = text[:at].rstrip().split("\n\n")[-1]
    return text[at + 4:text.index("```", at + 4)], paragraph


@pytest.fixture(scope="module")
def fresh_table(tmp_path_factory):
    # The run docs_commands_test checks as a command of the docs (the same
    # command: it runs once).
    done = docs_commands_test.shared_run(
        "python examples/demo.py --gradient-report", tmp_path_factory)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout[done.stdout.index("gradients in float16's range"):]


def _rows(table):
    """{label: (scale or None, zero, below, room, zero_1, below_1, room_1)}
    of the totals (by step) and of step 300's variables (by name)."""
    rows = {}
    for line in table.splitlines():
        words = line.replace("|", " ").split()
        if "|" not in line or line == _HEADER:
            continue
        values = [float(word.rstrip("%")) for word in words[-6:]]
        scale = float(words[1]) if len(words) == 8 else None
        rows[words[0]] = (scale, *values)
    return rows


def _check_invariants(table):
    rows = _rows(table)
    assert [label for label in rows if label.isdigit()] == ["1", "150", "300"]
    assert len(rows) == 3 + 6, table  # Step 300's six variables.
    for label, (scale, zero, below, room, zero_1, below_1, room_1) in (
            rows.items()):
        # The elements below 2**-14 include the zeros.
        assert zero <= below and zero_1 <= below_1, label
        # A larger scale lifts elements out of underflow, never into it.
        assert zero_1 >= zero, label
        assert below_1 >= below, label
        # The scale's doublings, give or take one (a power of two
        # multiplies the largest element exactly; rounding can move it).
        doublings = math.log2(scale if scale else rows["300"][0])
        assert abs(room_1 - room - doublings) <= 1, label
        if scale:  # The totals: at scale 1 more are below, at each step.
            assert below_1 > below, label


def test_the_doc_labels_its_table_as_one_example_run():
    _, paragraph = _doc_table()
    assert "**one\nexample run** (TensorFlow 2.21, Keras 3.15.1" in paragraph
    assert "digits depend on the CPU" in paragraph


def test_the_docs_example_holds_what_the_prose_says():
    _check_invariants(_doc_table()[0])


def test_a_fresh_run_holds_what_the_prose_says(fresh_table):
    _check_invariants(fresh_table)


def test_a_fresh_run_prints_the_docs_table_but_the_digits(fresh_table):
    shown, _ = _doc_table()
    assert (_NUMBER.sub("N", fresh_table).rstrip()
            == _NUMBER.sub("N", shown).rstrip())
