"""MultiWorkerMirroredStrategy: two worker processes on 127.0.0.1.

Each scenario of mwms_training.py runs in two `mwms_worker.py` processes and,
as the reference, in this process under MirroredStrategy over two logical
CPUs. Both workers must end in the same state as each other and as the
reference: one skip decision for every worker, and no hang. One run loses a
worker to SIGKILL and is started again from the chief's checkpoint.

Every worker has three timeouts (collectives time out after 30 s, an
in-worker faulthandler watchdog, and the deadline here, after which its
process group is killed) and is reaped whatever happens.
"""

import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest
import session_once

import mwms_training
import test_util

_WORKER = pathlib.Path(__file__).with_name("mwms_worker.py")
_DEADLINE_SECONDS = 180


def _free_ports(count):
    # Bound on all interfaces, like the gRPC server; held until all are
    # picked so that no two are the same.
    with contextlib.ExitStack() as stack:
        sockets = [
            stack.enter_context(socket.socket(socket.AF_INET,
                                              socket.SOCK_STREAM))
            for _ in range(count)
        ]
        for s in sockets:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in sockets]


def _launch(scenario, workdir, attempt):
    ports = ",".join(map(str, _free_ports(2)))
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(_WORKER.parent)] + [p for p in [env.get("PYTHONPATH")] if p]
    )
    workers = []
    for index in range(2):
        log = open(workdir / f"worker{index}-try{attempt}.log", "w+")
        process = subprocess.Popen(
            [sys.executable, str(_WORKER), str(index), ports, scenario,
             str(workdir)],
            start_new_session=True, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, env=env,
        )
        workers.append((process, log))
    return workers


def _kill(process):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _wait(workers):
    """Waits for both workers; if one fails, the other gets 15 s to finish."""
    deadline = time.monotonic() + _DEADLINE_SECONDS
    while time.monotonic() < deadline:
        codes = [p.poll() for p, _ in workers]
        if all(c is not None for c in codes):
            return codes
        if any(c not in (None, 0) for c in codes):
            deadline = min(deadline, time.monotonic() + 15)
        time.sleep(0.1)
    return [p.poll() for p, _ in workers]


def _logs(workers):
    """Each worker's RESULT line whole, after the last 4000 characters of
    the rest of its output."""
    text = []
    for index, (_, log) in enumerate(workers):
        log.seek(0)
        lines = log.read().splitlines()
        results = [line for line in lines if line.startswith("RESULT ")]
        rest = "\n".join(line for line in lines
                         if not line.startswith("RESULT "))
        text.append("\n".join([f"--- worker {index} ---", rest[-4000:],
                               *results]))
    return "\n".join(text)


def run_workers(scenario, workdir):
    """Runs `scenario` on two workers; returns their results (in order)."""
    for attempt in range(2):
        workers = _launch(scenario, workdir, attempt)
        try:
            codes = _wait(workers)
            logs = _logs(workers)
        finally:
            for process, log in workers:
                _kill(process)
                log.close()
        if codes == [0, 0]:
            return [_result(logs, index) for index in range(2)]
        if "Could not start gRPC server" not in logs:
            break  # A port was taken between picking and binding: retry.
    pytest.fail(f"workers exited with {codes}:\n{logs}")


def _result(logs, index):
    section = logs.split(f"--- worker {index} ---")[1]
    for line in section.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    pytest.fail(f"worker {index} printed no result:\n{logs}")


def _reference(scenario, tmp_path):
    workdir = tmp_path / "reference"
    workdir.mkdir()
    result = mwms_training.SCENARIOS[scenario](
        test_util.mirrored_strategy(), str(workdir)
    )
    return json.loads(json.dumps(result))


# Scenarios that run one after another in one pair of workers (starting a
# pair takes about 5 s). The last, `preempted`, resumes from the checkpoint
# of a pair killed before it (test_lost_worker_fails_the_other_then_both_resume).
_SHARED_RUN = ("overflow_on_worker_1", "overflow_on_worker_0", "clipped_sum",
               "checkpoint", "moving_averages",
               "optimizer_made_outside_the_scope", "preempted")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"killed": `_killed`'s report of a `preempted_kill` pair, "shared":
    both workers' results of every `_SHARED_RUN` scenario, by name}, run
    once per session, whichever pytest-xdist process runs these tests."""
    def run():
        workdir = tmp_path_factory.mktemp("shared_run")
        # Where the shared run's `preempted` finds the chief's checkpoint.
        (workdir / "preempted").mkdir()
        killed = _killed(workdir / "preempted")
        return {"killed": killed,
                "shared": run_workers("+".join(_SHARED_RUN), workdir)}

    return session_once.result("multi_worker_runs", run, tmp_path_factory)


@pytest.fixture
def shared_run(runs):
    return runs["shared"]


def _results(shared_run, scenario):
    return [results[scenario] for results in shared_run]


@pytest.mark.parametrize("bad_worker", [1, 0])
def test_overflow_on_one_worker_skips_on_both(bad_worker, shared_run,
                                             tmp_path):
    scenario = f"overflow_on_worker_{bad_worker}"
    worker0, worker1 = _results(shared_run, scenario)
    assert worker0 == worker1
    assert worker0 == _reference(scenario, tmp_path)
    first, skipped, after = worker0
    assert skipped["var"] == first["var"]
    assert skipped["loss_scale"] == first["loss_scale"] / 2 == 32.0
    assert (skipped["counter"], skipped["skipped_steps"]) == (0, 1)
    assert skipped["optimizer"]["iteration"] == 2
    for path, value in first["optimizer"].items():
        if path != "iteration":
            assert skipped["optimizer"][path] == value, path
    assert after["var"] != skipped["var"]
    assert after["counter"] == 1
    # Both workers name the variable that overflowed on one of them.
    assert first["overflow"] is None
    # (The gradients overflowed, not the loss: issue 43's `cause`.)
    assert skipped["overflow"] == after["overflow"] == [
        1, 1, ["Variable:0"], 1, "gradients"]


def test_an_optimizer_made_outside_the_scope(shared_run, tmp_path):
    # Issue 59: the same state on each worker, step by step, as one made in
    # the scope (the wrapper's state is a plain variable on each worker).
    scenario = "optimizer_made_outside_the_scope"
    worker0, worker1 = _results(shared_run, scenario)
    assert worker0 == worker1 == _reference(scenario, tmp_path)
    assert worker0 == _results(shared_run, "overflow_on_worker_1")[0]


def test_clipping_sees_the_sum_over_workers(shared_run, tmp_path):
    # TF 2.4 (and tf_keras) clip the aggregated gradient: 5 - clip(4) = 3.
    worker0, worker1 = _results(shared_run, "clipped_sum")
    assert worker0 == worker1 == _reference("clipped_sum", tmp_path)
    assert worker0["var"] == 3.0


def test_moving_averages_are_the_same_on_both_workers(shared_run, tmp_path):
    # Each worker's (and, in the reference, each replica's) copy of the
    # averages is read separately: `_local` fails if they differ.
    worker0, worker1 = _results(shared_run, "moving_averages")
    assert worker0 == worker1 == _reference("moving_averages", tmp_path)
    assert [state["skipped_steps"] for state in worker0] == [0, 1, 1, 1]
    averages = [path for path in worker0[-1]["optimizer"]
                if "average" in path]
    assert averages
    # Step 3 (iterations 2) copied the averages into the variable.
    assert worker0[2]["var"] == [worker0[2]["optimizer"][path]
                                 for path in averages][0]


def test_checkpoint_from_chief_restores_on_both(shared_run, tmp_path):
    worker0, worker1 = _results(shared_run, "checkpoint")
    assert worker0 == worker1
    assert worker0 == _reference("checkpoint", tmp_path)
    # Everything but skipped_steps (not in checkpoints) continues as if the
    # run had never stopped, including the skip on the last step.
    continued, restored = worker0["continued"], worker0["restored"]
    assert [s.pop("skipped_steps") for s in continued] == [1, 2]
    assert [s.pop("skipped_steps") for s in restored] == [0, 1]
    assert restored == continued
    assert [s["loss_scale"] for s in restored] == [64.0, 32.0]


def _until_both_exit(workers):
    """Waits for both workers; returns when each exited (monotonic)."""
    ended = [None, None]
    deadline = time.monotonic() + _DEADLINE_SECONDS
    while None in ended and time.monotonic() < deadline:
        for index, (process, _) in enumerate(workers):
            if ended[index] is None and process.poll() is not None:
                ended[index] = time.monotonic()
        time.sleep(0.1)
    return ended


def _killed(workdir):
    """Runs `preempted_kill` in `workdir`; reports how both workers ended."""
    for attempt in range(2):
        workers = _launch("preempted_kill", workdir, attempt)
        try:
            ended = _until_both_exit(workers)
            logs = _logs(workers)
        finally:
            for process, log in workers:
                _kill(process)
                log.close()
        if "Could not start gRPC server" not in logs:
            break
    chief = workdir / "chief"
    return {
        "ended": ended, "logs": logs,
        "codes": [process.returncode for process, _ in workers],
        # The whole log: TensorFlow's traceback can be longer than `logs`
        # shows.
        "worker0_log": (workdir / f"worker0-try{attempt}.log").read_text(),
        # Before the shared run's `preempted` adds its own.
        "checkpoints": _checkpoint_numbers(chief) if chief.exists() else [],
    }


def test_lost_worker_fails_the_other_then_both_resume(runs, shared_run,
                                                      tmp_path):
    # Worker 1 is SIGKILLed after the chief's checkpoint of step 4, before
    # step 5 (see mwms_training.preempted).
    killed = runs["killed"]
    ended, logs, codes = killed["ended"], killed["logs"], killed["codes"]
    assert None not in ended, f"a worker hung:\n{logs}"
    assert codes[1] == -signal.SIGKILL, logs
    # Worker 0 fails with an error naming the lost task, well within the
    # collective timeout: no hang.
    assert codes[0] not in (0, None), logs
    worker0_log = killed["worker0_log"]
    assert "UnavailableError" in worker0_log, logs
    assert "/job:worker/replica:0/task:1" in worker0_log, logs
    assert ended[0] - ended[1] < mwms_training.COLLECTIVE_TIMEOUT_SECONDS
    assert killed["checkpoints"] == [2, 4]

    # Both start again from the chief's checkpoint of step 4 (in the shared
    # run) and finish as the uninterrupted run does, bit for bit
    # (skipped_steps included: the checkpoint holds it as an entry of its
    # own).
    worker0, worker1 = _results(shared_run, "preempted")
    assert worker0 == worker1
    assert worker0["began_at"] == 4
    reference = _reference("preempted", tmp_path)
    assert reference["began_at"] == 0
    assert worker0["state"] == reference["state"]
    assert reference["state"]["skipped_steps"] == 3  # Steps 2, 5 and 8.


def _checkpoint_numbers(directory):
    return sorted(int(name[len("ckpt-"):-len(".index")])
                  for name in os.listdir(directory) if name.endswith(".index"))
