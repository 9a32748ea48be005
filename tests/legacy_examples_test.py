"""The unmodified TF 2.1-2.4 scripts in examples/legacy/ run on tf_lso.

Each script runs three ways, each in its own process: through
`python -m tf_lso run`, after `tf_lso.install()`, and rewritten against
tf_lso's own API by `python -m tf_lso check --fix` (the one-import change of
the migration guide). All three must print the same results.
"""

import os
import pathlib
import re
import subprocess
import sys

import migration_util
import pytest

from tf_lso_migration import fix as migration_fix

pytestmark = migration_util.needs_libcst  # The third way is --fix's.
LEGACY = pathlib.Path(__file__).parents[1] / "examples" / "legacy"

# Run as their docstrings show them (docs_commands_test relies on that):
# with no arguments, a short run.
SCRIPTS = ("checkpoint_loop.py", "compile_fit.py", "custom_loop.py",
           "mirrored_loop.py")


def _start(args, workdir):
    """Starts `python ARGS` in `workdir`, its output going to a file there
    (a full pipe would stall it)."""
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    with open(workdir / "output.txt", "w") as output:
        return subprocess.Popen(
            [sys.executable] + args, stdin=subprocess.DEVNULL, stdout=output,
            stderr=subprocess.STDOUT, text=True, env=env, cwd=workdir,
        ), workdir


def _finish(started):
    process, workdir = started
    process.wait(timeout=240)
    output = (workdir / "output.txt").read_text()
    assert process.returncode == 0, output
    return output


def _results(stdout):
    return [line for line in stdout.splitlines() if line.startswith("result")]


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_runs_unmodified_and_matches_tf_lso_api(script, tmp_path):
    path = LEGACY / script
    # The one-import change, as `python -m tf_lso check --fix` makes it.
    source = migration_fix.fix_source(path.read_text())
    assert not re.search(r"tf\.(keras\.)?(mixed_precision|train)\.experimental",
                         source)
    rewritten = tmp_path / script
    rewritten.write_text(source)
    # The three processes run side by side, each in a directory of its own.
    started = [
        _start(["-m", "tf_lso", "run", str(path)], tmp_path / "run"),
        _start([
            "-c",
            "import runpy, sys, tf_lso; tf_lso.install(); "
            f"sys.argv = [{str(path)!r}]; "
            f"runpy.run_path({str(path)!r}, run_name='__main__')",
        ], tmp_path / "install"),
        _start([str(rewritten)], tmp_path / "api"),
    ]
    try:
        via_run, via_install, via_api = [_finish(s) for s in started]
    finally:
        for process, _ in started:
            process.kill()  # Those still running when one failed.
            process.wait()

    results = _results(via_run)
    assert len(results) >= 2, via_run
    assert _results(via_install) == results
    assert _results(via_api) == results
    values = dict(line.split(" ", 2)[1:] for line in results)
    assert "nan" not in values["weights"]
    if script == "checkpoint_loop.py":
        # Scale 4096, doubling every 10 finite steps; overflows at steps 15,
        # 30 and 45 halve it; checkpoints at 20 and 40, just after a growth.
        assert values["restored_iterations"] == "40"
        assert values["restored_loss_scale"] == "8192.0"
        assert values["loss_scale"] == "4096.0"
    if script == "compile_fit.py":
        assert "Optimizer: LossScaleOptimizerV1" in via_run
