"""A `fit` run with `BackupAndRestore` that preemption_test.py kills and starts
again, as a process of its own or in the test process.

Usage: python fit_restart.py STRATEGY SAVE_FREQ WORKDIR [KILL_AT]

STRATEGY is `single` or `mirrored` (two logical CPUs), SAVE_FREQ `epoch` or a
number of batches. With KILL_AT the process sends itself SIGKILL at the end
of that training step (counted from 1 over the whole run, after any backup
made there). Run again with the same WORKDIR, it resumes from the backup.

It writes, each with `save_state`:
* `WORKDIR/saved.npz` after every backup: the state just backed up;
* `WORKDIR/begin.npz` when training begins: the state the backup restored;
* `WORKDIR/final.npz` when training ends.
"""

import os
import signal
import sys

EPOCHS = 3
STEPS_PER_EPOCH = 6
BATCH_SIZE = 4


class Interrupted(Exception):
    """What `fit(stop_at=...)` raises."""


def configure(strategy_name):
    """Before TensorFlow initialises: two logical CPUs for `mirrored`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    if strategy_name == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2
        )


def data(overflow=True):
    """Batches 1 and 4 of every epoch overflow (with `overflow`)."""
    import numpy as np

    count = STEPS_PER_EPOCH * BATCH_SIZE
    x = np.linspace(-1.0, 1.0, count * 3, dtype="float32").reshape(count, 3)
    y = np.linspace(0.5, -0.5, count, dtype="float32").reshape(count, 1)
    if overflow:
        y[1 * BATCH_SIZE] = y[4 * BATCH_SIZE] = 3e38
    return x, y


def build(strategy, optimizer="tf_lso"):
    """The model, compiled with Adam inside a loss scale optimizer."""
    import keras

    import tf_lso

    keras.utils.set_random_seed(0)
    with strategy.scope():
        # Named: the state's keys must not depend on what else the process
        # built.
        model = keras.Sequential(
            [keras.Input((3,)),
             keras.layers.Dense(2, activation="tanh", name="hidden"),
             keras.layers.Dense(1, name="out")],
            name="net",
        )
        opt = keras.optimizers.Adam(0.01)
        if optimizer == "tf_lso":
            opt = tf_lso.LossScaleOptimizer(opt, initial_scale=2.0**10,
                                            dynamic_growth_steps=2)
        model.compile(opt, "mse")
    return model


def state(model):
    """Weights and every optimizer variable, by name, as NumPy arrays."""
    import numpy as np

    opt = model.optimizer
    result = {f"weight{i}": w for i, w in enumerate(model.get_weights())}
    result.update({f"opt/{v.path.split('/', 1)[1]}": np.asarray(v)
                   for v in opt.variables})
    if hasattr(opt, "skipped_steps"):
        for name in ("loss_scale", "dynamic_counter", "skipped_steps"):
            result[name] = np.asarray(getattr(opt, name))
    return result


def save_state(path, values):
    """Writes `values` to `path` atomically (a kill leaves the old file)."""
    import numpy as np

    with open(path + ".tmp", "wb") as f:
        np.savez(f, **values)
    os.replace(path + ".tmp", path)


def load_state(path):
    import numpy as np

    with np.load(path) as f:
        return dict(f)


def fit(strategy, save_freq, workdir, optimizer="tf_lso", overflow=True,
        stop_at=None, kill_at=None):
    """Trains with `BackupAndRestore(workdir/backup, save_freq)`.

    Args:
        strategy: A tf.distribute strategy.
        save_freq: `"epoch"` or an int, as `BackupAndRestore` takes it.
        workdir: A directory; the backup and the state files go there.
        optimizer: `"tf_lso"`, or `"keras"` for the bare Adam.
        overflow: Whether batches 1 and 4 overflow.
        stop_at: Raise `Interrupted` at the end of this step: the
            interruption Keras's own `BackupAndRestore` example uses.
        kill_at: SIGKILL this process at the end of this step.

    Returns:
        The final `state`.
    """
    import keras

    backup = os.path.join(workdir, "backup")
    model = build(strategy, optimizer)
    model.build((None, 3))

    class Watch(keras.callbacks.Callback):
        """Records each backup and the restored state; kills or stops.

        Follows BackupAndRestore (listed before it): with an int `save_freq`
        it backs up every `save_freq` batches counted from when `fit`
        began, and with `"epoch"` at the end of every epoch.
        """

        def __init__(self):
            super().__init__()
            self._step = 0

        def on_train_begin(self, logs=None):
            save_state(os.path.join(workdir, "begin.npz"), state(model))

        def on_train_batch_end(self, batch, logs=None):
            self._step += 1
            if save_freq != "epoch" and self._step % save_freq == 0:
                self._backed_up()
            if self._step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if self._step == stop_at:
                raise Interrupted(self._step)

        def on_epoch_end(self, epoch, logs=None):
            if save_freq == "epoch":
                self._backed_up()

        def _backed_up(self):
            save_state(os.path.join(workdir, "saved.npz"), state(model))

    x, y = data(overflow)
    callbacks = [keras.callbacks.BackupAndRestore(backup, save_freq=save_freq),
                 Watch()]
    model.fit(x, y, batch_size=BATCH_SIZE, epochs=EPOCHS, shuffle=False,
              callbacks=callbacks, verbose=0)
    final = state(model)
    save_state(os.path.join(workdir, "final.npz"), final)
    return final


def main(argv):
    strategy_name, save_freq, workdir = argv[1:4]
    kill_at = int(argv[4]) if len(argv) > 4 else None
    configure(strategy_name)
    import tensorflow as tf

    strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
                if strategy_name == "mirrored" else tf.distribute.get_strategy())
    save_freq = save_freq if save_freq == "epoch" else int(save_freq)
    fit(strategy, save_freq, workdir, kill_at=kill_at)


if __name__ == "__main__":
    main(sys.argv)
