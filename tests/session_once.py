"""A result made once per test session, for every test that reads it.

pytest-xdist runs the tests in two processes (noxfile.py), and a fixture of
scope "module" or "session" is made in each process that runs one of its
tests. What starts TensorFlow processes (a command the docs show, a pair of
multi-worker processes) is made here instead: by the first test to ask for
it, which saves it in the directory both processes share, while the other
waits for it under a lock and then reads it.
"""

import fcntl
import json
import os


def result(name, make, tmp_path_factory):
    """`make()`'s value (JSON: lists, not tuples), made once per session for
    `name`. If `make` raises, nothing is saved: the next test to ask makes it
    again."""
    shared = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        shared = shared.parent  # The workers' directories are in it.
    saved = shared / f"{name}.json"
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # Released when the file closes.
        if not saved.exists():
            saved.write_text(json.dumps(make()))
    return json.loads(saved.read_text())
