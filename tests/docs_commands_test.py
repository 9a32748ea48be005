"""Every command README.md, docs/ and the examples' docstrings show works.

The commands are found, not listed: shell lines of the fenced code blocks
that are not Python, command lines of the examples' module docstrings, and
inline code spans that are a whole command (`pip install ...`, a command
that names a file or a path, `.venv/bin/...`, `nox ...`). Each runs in this
suite's environment, in a scratch directory where `examples/` is the
repository's: `python` and `.venv/bin/python` are this interpreter, `tf-lso`
its console script. It must end with status 0 (1 for `check`, which found
something) and no traceback. `pip install` commands are checked, not run:
the extras they name exist in setup.py and what they install is installed
here. `NOT_RUN` holds the few that cannot run, each with its reason; a
command it lists that no document shows any more fails the test, so the list
stays true.
"""

import ast
import importlib.metadata
import math
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import legacy_examples_test
import pytest
import session_once

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
EXAMPLES = sorted((ROOT / "examples").rglob("*.py"))

_LEGACY = ("run as shown by tests/legacy_examples_test.py, which compares "
           "its results with two other ways to run the script")
_SUITE = "the test command itself (.ci/run runs it)"
_BENCHMARK = ("a benchmark: its numbers are docs/performance.md's, measured "
              "over an hour; `nox -s benchmarks` runs them")
NOT_RUN = {
    'python3.11 -m venv .venv && .venv/bin/pip install -q "nox==2026.10.20" '
    "&& .venv/bin/nox -t ci": _SUITE,
    ".venv/bin/nox -s tests": "every pair of the matrix: about an hour",
    '.venv/bin/nox -s "tests(tf2.18.1-keras3.8.0)"':
        "one pair of the matrix: the suite again, in its own virtualenv",
    '.venv/bin/pip install -q -e ".[tensorflow,test]" && .venv/bin/python '
    "-m pytest -q tests": _SUITE,
    "nox -s older_pythons": "needs python3.9 and python3.10 on PATH",
    "nox -s tests": "every pair of the matrix: about an hour",
    "nox -s legacy_keras": "the legacy-Keras route's sessions, one per "
                           "pair: the test command runs two of them",
    'python3.11 -m venv .venv && .venv/bin/pip install -q "nox==2026.10.20" '
    "&& .venv/bin/nox -s benchmarks": _BENCHMARK,
    ".venv/bin/nox -s benchmarks -- ablation.py --mirrored": _BENCHMARK,
    ".venv/bin/python benchmarks/compare_revisions.py f5f75ad~1 --rounds 40 "
    "--round-seconds 0.3": _BENCHMARK,
    ".venv/bin/python benchmarks/compare_revisions.py 67736e2 --rounds 30":
        _BENCHMARK,
    ".venv/bin/python benchmarks/compare_revisions.py cec6ba3 --rounds 25":
        _BENCHMARK,
    ".venv/bin/python benchmarks/compare_revisions.py 6ed5b01 --rounds 25":
        _BENCHMARK,
    ".venv/bin/python benchmarks/gradient_report.py --rounds 15": _BENCHMARK,
    ".venv/bin/python benchmarks/ablation.py --marker candidates --shapes "
    '"10 independent vars" "MLP 100 layers x 32 (200 vars)" "Keras Dense '
    '100 layers x 32 (200 vars)" --variants tf_lso_keras tf_lso_legacy '
    "cond_check --output docs/performance.md": _BENCHMARK,
    ".venv/bin/python benchmarks/hlo_summary.py":
        "compiles 15 steps with XLA (minutes) and prints a table of "
        "docs/performance.md; it checks nothing",
    "python -m tf_lso run OLD_SCRIPT.py [args…]":
        "a template: OLD_SCRIPT.py is the reader's script",
    "python -m tf_lso run old_script.py [args…]":
        "a template: old_script.py is the reader's script",
    "python examples/multi_worker.py [--steps N]":
        "a template of the two commands below it",
    **{f"python -m tf_lso run examples/legacy/{script}": _LEGACY
       for script in legacy_examples_test.SCRIPTS},
}
# Files a command names that the reader brings: made in the scratch
# directory.
READER_FILES = {
    "train.py": "import tensorflow as tf\n"
                "opt = tf.keras.mixed_precision.experimental."
                "LossScaleOptimizer(tf.keras.optimizers.SGD(), 'dynamic')\n",
}
# A command may start with environment assignments (`TF_USE_LEGACY_KERAS=1
# .venv/bin/python ...`); they are set for it when it runs.
_ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")
_COMMAND = re.compile(
    r"^(?:[A-Z_][A-Z0-9_]*=\S* )*"
    r"(?:python(?:3(?:\.\d+)?)?|\.venv/bin/\S+|tf-lso|pip|nox) \S")


def _split_env(words):
    """`(the environment assignments, the rest)` of a command's words."""
    count = 0
    while count < len(words) and _ASSIGNMENT.match(words[count]):
        count += 1
    return dict(word.split("=", 1) for word in words[:count]), words[count:]


def _is_whole_command(span):
    """Whether an inline code span is a command one can run as it is."""
    if not _COMMAND.match(span):
        return False
    words = _split_env(span.split())[1]
    return words[0] in ("pip", "nox") or words[0].startswith(".venv/") or any(
        "/" in word or word.endswith(".py") for word in words[1:])


def _docstring_commands(path):
    """Command lines and inline commands of an example's module docstring."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    found = [line.split("  #")[0].strip() for line in doc.splitlines()
             if _COMMAND.match(line.strip())]
    found += [span for span in map(_collapse, re.findall(r"`([^`]+)`", doc))
              if _is_whole_command(span)]
    return found


def _collapse(text):
    return " ".join(text.split())


def shown_commands():
    """{command: the file that shows it}, for every document and example."""
    shown = {}
    for path in DOCUMENTS:
        text = path.read_text()
        for language, body in re.findall(r"^```(\w*)\n(.*?)^```", text,
                                         re.M | re.S):
            if language not in ("", "sh", "bash", "shell", "console"):
                continue
            for line in body.splitlines():
                line = line.strip().removeprefix("$ ")
                if _COMMAND.match(line):
                    shown.setdefault(line, path.name)
        prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
        for span in map(_collapse, re.findall(r"`([^`]+)`", prose)):
            if _is_whole_command(span):
                shown.setdefault(span, path.name)
    for path in EXAMPLES:
        for command in _docstring_commands(path):
            shown.setdefault(command, str(path.relative_to(ROOT)))
    return shown


SHOWN = shown_commands()


def _extras():
    """setup.py's extras_require, read without running setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "extras_require":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no extras_require")


def _check_install(words):
    """A `pip install` command: what it names exists and is installed."""
    extras = _extras()
    for word in words[2:]:
        if word.startswith("-"):
            continue
        match = re.fullmatch(r"(?:tf_lso|\.)\[([\w,]+)\]", word)
        if match:
            for extra in match.group(1).split(","):
                assert extra in extras, f"setup.py has no extra {extra!r}"
                if extra == "cpu":  # The alternative to `tensorflow`.
                    continue
                for requirement in extras[extra]:
                    name = re.split(r"[<>=!\[ ]", requirement)[0]
                    importlib.metadata.version(name)  # Installed here.
        else:
            importlib.metadata.version(re.split(r"[<>=!\[ ]", word)[0])


def _argv(words):
    program = words[0]
    if program in ("python", "python3", "python3.11", ".venv/bin/python"):
        return [sys.executable] + words[1:]
    if program in ("tf-lso", ".venv/bin/tf-lso"):
        script = shutil.which("tf-lso", path=os.path.dirname(sys.executable))
        assert script, "no tf-lso script: pip install -e ."
        return [script] + words[1:]
    raise AssertionError(f"cannot run {program!r}: add it to NOT_RUN")


def test_every_shown_command_is_found_and_not_run_is_true():
    assert len(SHOWN) >= 10, SHOWN
    stale = sorted(set(NOT_RUN) - set(SHOWN))
    assert not stale, f"NOT_RUN lists commands no document shows: {stale}"
    # legacy_examples_test runs the scripts with no arguments, as shown.
    legacy = {c for c in SHOWN if c.startswith("python -m tf_lso run "
                                                "examples/legacy/")}
    assert legacy == {f"python -m tf_lso run examples/legacy/{script}"
                      for script in legacy_examples_test.SCRIPTS}


# absl/TF C++ log lines ("I0000 00:00:..."), and the notices they carry.
_TF_LOG = re.compile(r"^[IWEF]\d{4} |oneDNN|cuda|cpu_feature_guard",
                     re.MULTILINE)


def _demo(done, tmp_path):
    """The README's demo: the loss scale at work, and quiet."""
    del tmp_path
    assert done.stdout.splitlines()[-1] == (
        "done: 300 iterations, 5 skipped, final loss scale 32768")
    assert done.stdout.count("<- overflow, step skipped") == 5
    assert not _TF_LOG.search(done.stderr), done.stderr


def _demo_gradient_report(done, tmp_path):
    """The demo, then its gradient reports (docs/training_health.md): at
    scale 1 more elements are below float16's normal range than at the
    dynamic scale, where the headroom is smaller by the scale's doublings."""
    del tmp_path
    lines = done.stdout.splitlines()
    assert "done: 300 iterations, 5 skipped, final loss scale 32768" in lines
    rows = lines[lines.index(
        " step  loss scale    zero   below  room | scale 1:    zero   below"
        "  room") + 1:][:3]
    assert [row.split()[0] for row in rows] == ["1", "150", "300"]
    for row in rows:
        _, scale, _, below, room, _, _, below_at_1, room_at_1 = row.split()
        assert float(below_at_1[:-1]) > float(below[:-1]), row
        assert int(room_at_1) - int(room) in range(
            int(math.log2(float(scale))) - 1,
            int(math.log2(float(scale))) + 2), row
    assert not _TF_LOG.search(done.stderr), done.stderr


def _demo_with_notices(done, tmp_path):
    del tmp_path
    assert _TF_LOG.search(done.stderr), done.stderr


def _plot(done, tmp_path):
    del tmp_path
    lines = done.stdout.splitlines()
    # Steps 60-64, 150, 200 and 250 overflow: 2**12 doubles every 20 finite
    # steps (2**15 by step 59), five halvings give 2**10, doublings at 84,
    # 104, 124 and 144 2**14, the halving at 150 2**13, 170 and 190 2**15,
    # 200 2**14, 220 and 240 2**16, 250 2**15, 270 and 290 2**17; at that
    # scale step 291's float16 gradients overflow: 2**16.
    assert lines[0] == "final loss scale 65536, skipped steps 9"
    assert lines[1].startswith("last overflow: Overflow(step=291, count=")
    output = pathlib.Path(tempfile.gettempdir(), "tf_lso_training_health.png")
    assert lines[2] == f"saved the plot to {output}"
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not _TF_LOG.search(done.stderr), done.stderr


def _multi_worker(done, tmp_path):
    """Two workers, one command; steps 10, 20 and 30 overflow on worker 1
    only, and both workers report each skip."""
    del tmp_path
    assert "OK: both workers" in done.stdout
    for index in (0, 1):
        step_10 = [line for line in done.stdout.splitlines()
                   if line.startswith(f"worker {index}:   10")]
        assert step_10, done.stdout
        assert step_10[0].split()[4] == "1", done.stdout


# What some commands must print, beyond their status.
OUTPUT = {
    'python3.11 -m venv .venv && .venv/bin/pip install -e '
    '".[tensorflow,tfkeras,examples,migrate]" && .venv/bin/python '
    'examples/demo.py':
        _demo,
    "python examples/demo.py --tf-logs": _demo_with_notices,
    "python examples/demo.py --gradient-report": _demo_gradient_report,
    "python examples/plot_training_health.py": _plot,
    ".venv/bin/python examples/multi_worker.py --steps 30": _multi_worker,
}


def test_output_checks_are_on_commands_that_run():
    assert set(OUTPUT) <= set(_distinct(set(SHOWN) - set(NOT_RUN)))


def _runs(command):
    """What running `command` executes: its parts, as argv tuples (with
    their environment assignments)."""
    runs = []
    for part in command.split(" && "):
        if _is_set_up(part):
            runs.append(part)
            continue
        env, words = _split_env(shlex.split(part))
        runs.append(tuple(sorted(env.items())) + tuple(_argv(words)))
    return tuple(runs)


def _is_set_up(part):
    words = shlex.split(part)
    return words[:3] == ["python3.11", "-m", "venv"] or (
        words[0].endswith("pip") and words[1] == "install")


def _distinct(commands):
    """One command per distinct run (`python x.py` is `.venv/bin/python
    x.py`), so that nothing runs twice."""
    seen, kept = set(), []
    for command in sorted(commands, key=len, reverse=True):
        runs = [run for run in _runs(command) if isinstance(run, tuple)]
        if runs and all(run in seen for run in runs):
            continue
        seen.update(runs)
        kept.append(command)
    return sorted(kept)


# Commands (one each, with no environment assignments) whose output another
# test module checks too: each runs once in the session, for both
# (training_health_docs_test reads the demo's gradient report).
SHARED = ("python examples/demo.py --gradient-report",)


def _scratch(directory):
    """Makes `directory` the scratch directory a command runs in."""
    (directory / "examples").symlink_to(ROOT / "examples")
    for name, text in READER_FILES.items():
        (directory / name).write_text(text)


def _run(words, assignments, directory):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    return subprocess.run(_argv(words), capture_output=True, text=True,
                          timeout=600, cwd=directory,
                          env={**env, **assignments})


def shared_run(command, tmp_path_factory):
    """The run of `command` (one of `SHARED`) in its scratch directory, made
    once per session."""
    assert command in SHARED, command

    def run():
        directory = tmp_path_factory.mktemp("shared_command")
        _scratch(directory)
        done = _run(shlex.split(command), {}, directory)
        return [done.returncode, done.stdout, done.stderr]

    returncode, stdout, stderr = session_once.result(
        f"command{SHARED.index(command)}", run, tmp_path_factory)
    return subprocess.CompletedProcess(command, returncode, stdout, stderr)


@pytest.mark.parametrize("command", _distinct(set(SHOWN) - set(NOT_RUN)))
def test_shown_command_works(command, tmp_path, tmp_path_factory):
    _scratch(tmp_path)
    for part in command.split(" && "):
        assignments, words = _split_env(shlex.split(part))
        if words[:3] == ["python3.11", "-m", "venv"]:
            continue  # The suite's environment is set up already.
        if words[0].endswith("pip") and words[1] == "install":
            _check_install(words)
            continue
        if command in SHARED:
            done = shared_run(command, tmp_path_factory)
        else:
            done = _run(words, assignments, tmp_path)
        expected = (0, 1) if words[1:4] == ["-m", "tf_lso", "check"] or (
            words[0].endswith("tf-lso") and words[1] == "check") else (0,)
        assert done.returncode in expected, (
            f"{command!r} (shown in {SHOWN[command]}) ended with status "
            f"{done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        assert "Traceback" not in done.stderr, (command, done.stderr[-3000:])
        if command in OUTPUT:
            OUTPUT[command](done, tmp_path)
