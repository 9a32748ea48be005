"""Preemption: `fit` with `BackupAndRestore`, killed with SIGKILL and started
again, in processes of its own (fit_restart.py).

Each run trains 3 epochs of 6 steps with Adam in a loss scale optimizer;
batches 1 and 4 of every epoch overflow, so steps are skipped before and
after the kill. The restarted run is compared bit for bit with a run in this
process: an uninterrupted one when backups are made every epoch, and, with
backups every N batches (Keras restarts the epoch), one interrupted at the
same step the way Keras's own `BackupAndRestore` example does it. The bare
optimizer gives that same result under that interruption.

The multi-worker case is in multi_worker_test.py.
"""

import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

import fit_restart
import test_util

_SCRIPT = os.path.join(os.path.dirname(__file__), "fit_restart.py")
_TIMEOUT_SECONDS = 120
_STRATEGIES = {
    "single": test_util.default_strategy,
    "mirrored": test_util.mirrored_strategy,
}


def _run(workdir, strategy, save_freq, kill_at=None):
    """Runs fit_restart.py; returns its exit status."""
    args = [sys.executable, _SCRIPT, strategy, str(save_freq), str(workdir)]
    if kill_at is not None:
        args.append(str(kill_at))
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    with open(workdir / "log.txt", "a") as log:
        done = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=log,
                              stderr=subprocess.STDOUT, env=env,
                              timeout=_TIMEOUT_SECONDS)
    return done.returncode


def _log(workdir):
    return (workdir / "log.txt").read_text()[-4000:]


def _killed_and_restarted(workdir, strategy, save_freq, kill_at):
    """Kills a run at step `kill_at`, restarts it; returns (the state it
    backed up last before the kill, the state the restart began with, the
    final state)."""
    workdir.mkdir()
    status = _run(workdir, strategy, save_freq, kill_at)
    assert status == -signal.SIGKILL, _log(workdir)
    assert (workdir / "backup" / "latest.weights.h5").exists()
    shutil.copy(workdir / "saved.npz", workdir / "saved_before_kill.npz")
    assert _run(workdir, strategy, save_freq) == 0, _log(workdir)
    # BackupAndRestore removes its backup when training ends.
    assert not (workdir / "backup").exists()
    return [fit_restart.load_state(str(workdir / name)) for name in
            ("saved_before_kill.npz", "begin.npz", "final.npz")]


def _assert_same(got, want, keys=None):
    keys = sorted(want) if keys is None else keys
    assert sorted(got) == sorted(want)
    different = [k for k in keys if not np.array_equal(got[k], want[k])]
    assert not different, {k: (got[k], want[k]) for k in different}


@pytest.mark.parametrize("strategy", ["single", "mirrored"])
def test_epoch_backups_restart_bit_identical(strategy, tmp_path):
    # Killed in the middle of the second epoch: the backup is epoch 1's.
    saved, begin, final = _killed_and_restarted(
        tmp_path / "killed", strategy, "epoch", kill_at=9)
    (tmp_path / "reference").mkdir()
    reference = fit_restart.fit(_STRATEGIES[strategy](), "epoch",
                                str(tmp_path / "reference"))
    # What the backup held is what the restart began with: weights, slots,
    # iterations, loss scale, counter and skipped_steps.
    _assert_same(begin, saved)
    assert (int(saved["opt/iteration"]), int(saved["skipped_steps"])) == (6, 2)
    # Then it finishes as if it had never stopped.
    _assert_same(final, reference)
    assert (int(final["opt/iteration"]), int(final["skipped_steps"])) == (18, 6)


@pytest.mark.parametrize("strategy", ["single", "mirrored"])
def test_batch_backups_restart_the_epoch_as_keras_does(strategy, tmp_path):
    # Backups every 4 steps; killed at step 11, in the second epoch (steps 7
    # to 12): the backup is step 8's, and Keras starts epoch 2 again.
    saved, begin, final = _killed_and_restarted(
        tmp_path / "killed", strategy, 4, kill_at=11)
    _assert_same(begin, saved)
    # The loss scale state is step 8's, with the weights it was saved with.
    assert (int(saved["opt/iteration"]), int(saved["skipped_steps"])) == (8, 3)
    reference = _interrupted_in_process(
        _STRATEGIES[strategy](), tmp_path / "reference", stop_at=11)
    _assert_same(final, reference)
    # Epoch 2's six steps, then epoch 3's: 8 + 6 + 6, with 2 skips each.
    assert (int(final["opt/iteration"]), int(final["skipped_steps"])) == (20, 7)


def _interrupted_in_process(strategy, workdir, stop_at, **kwargs):
    workdir.mkdir()
    with pytest.raises(fit_restart.Interrupted):
        fit_restart.fit(strategy, 4, str(workdir), stop_at=stop_at, **kwargs)
    return fit_restart.fit(strategy, 4, str(workdir), **kwargs)


def test_batch_backups_interrupted_as_the_bare_optimizer_is(tmp_path):
    # Without overflows loss scaling is exact, so tf_lso and the bare Adam
    # it wraps end bit-identical after the same interruption.
    strategy = test_util.default_strategy()
    wrapped = _interrupted_in_process(strategy, tmp_path / "tf_lso",
                                      stop_at=11, overflow=False)
    bare = _interrupted_in_process(strategy, tmp_path / "keras", stop_at=11,
                                   overflow=False, optimizer="keras")
    _assert_same({k: wrapped[k] for k in bare}, bare)
    assert int(bare["opt/iteration"]) == 20
    assert int(wrapped["skipped_steps"]) == 0
