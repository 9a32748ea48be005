"""The demo from the README runs, shows the loss scale at work, and is quiet."""

import pathlib
import re
import subprocess
import sys

_DEMO = pathlib.Path(__file__).parents[1] / "examples" / "demo.py"
# absl/TF C++ log lines ("I0000 00:00:..."), and the notices they carry.
_TF_LOG = re.compile(r"^[IWEF]\d{4} |oneDNN|cuda|cpu_feature_guard",
                     re.MULTILINE)


def test_demo_runs_without_tensorflow_start_up_notices():
    done = subprocess.run(
        [sys.executable, str(_DEMO)], capture_output=True, text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == (
        "done: 300 iterations, 5 skipped, final loss scale 32768")
    assert done.stdout.count("<- overflow, step skipped") == 5
    assert not _TF_LOG.search(done.stderr), done.stderr


def test_demo_shows_the_notices_on_request():
    done = subprocess.run(
        [sys.executable, str(_DEMO), "--tf-logs"], capture_output=True,
        text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert _TF_LOG.search(done.stderr), done.stderr
