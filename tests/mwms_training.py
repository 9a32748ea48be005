"""Training runs shared by the multi-worker workers and their reference.

Each scenario takes a strategy with two replicas (MultiWorkerMirroredStrategy
with one CPU per worker, or MirroredStrategy over two logical CPUs in the test
process) and returns a JSON-able record of the state after every step.
"""

import contextlib
import os
import shutil
import signal

import keras
import tensorflow as tf

import tf_lso

import test_util

NO_OVERFLOW = -1
# What the workers give `CommunicationOptions(timeout_seconds=...)`.
COLLECTIVE_TIMEOUT_SECONDS = 30


def _build(strategy, optimizer_in_scope=True, **adam_arguments):
    with strategy.scope():
        var = tf.Variable([1.0, -1.0])
    with strategy.scope() if optimizer_in_scope else contextlib.nullcontext():
        opt = tf_lso.LossScaleOptimizer(
            keras.optimizers.Adam(0.1, **adam_arguments), initial_scale=64,
            dynamic_growth_steps=2,
        )
    return var, opt


def _step_fn(strategy, var, opt):
    """A TF 2.x custom-loop step; `bad_replica`'s loss overflows to inf."""

    def replica_fn(bad_replica):
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        replica = tf.cast(replica, tf.int32)
        weight = tf.cast(replica + 1, tf.float32) * tf.constant([0.5, 0.25])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(var * weight)
            loss = tf.where(tf.equal(replica, bad_replica), loss * 3e38, loss)
            scaled_loss = opt.get_scaled_loss(loss)
        grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, [var]))
        opt.apply_gradients(zip(grads, [var]))

    @tf.function
    def step(bad_replica):
        strategy.run(replica_fn, args=(tf.constant(bad_replica),))

    return step


def _local(strategy, value):
    copies = [v.tolist() for v in test_util.local_values(strategy, value)]
    if any(c != copies[0] for c in copies):
        raise AssertionError(f"local copies differ: {copies}")
    return copies[0]


def state(strategy, var, opt):
    """The variable, every optimizer variable and the loss scale state."""
    return {
        "var": _local(strategy, var),
        # Keyed without the optimizer's name, which Keras makes unique.
        "optimizer": {v.path.split("/", 1)[1]: _local(strategy, v)
                      for v in opt.variables},
        "loss_scale": float(_local(strategy, opt.loss_scale)),
        "counter": _local(strategy, opt.dynamic_counter),
        "skipped_steps": _local(strategy, opt.skipped_steps),
    }


def _train(strategy, var, opt, schedule, overflow=False):
    step = _step_fn(strategy, var, opt)
    history = []
    for bad_replica in schedule:
        step(bad_replica)
        history.append(state(strategy, var, opt))
        if overflow:  # What `last_overflow` says (not checkpointed).
            record = opt.last_overflow
            history[-1]["overflow"] = None if record is None else list(record)
    return history


def overflow_on_worker_1(strategy, workdir):
    del workdir
    return _train(strategy, *_build(strategy), [NO_OVERFLOW, 1, NO_OVERFLOW],
                  overflow=True)


def optimizer_made_outside_the_scope(strategy, workdir):
    """`overflow_on_worker_1` with the optimizer made outside the scope."""
    del workdir
    return _train(strategy, *_build(strategy, optimizer_in_scope=False),
                  [NO_OVERFLOW, 1, NO_OVERFLOW], overflow=True)


def overflow_on_worker_0(strategy, workdir):
    del workdir
    return _train(strategy, *_build(strategy), [NO_OVERFLOW, 0, NO_OVERFLOW],
                  overflow=True)


def moving_averages(strategy, workdir):
    """Keras 3's `use_ema`, copied into the variable every 3 steps; the
    second step overflows on worker 1 (issue 49)."""
    del workdir
    var, opt = _build(strategy, use_ema=True, ema_momentum=0.5,
                      ema_overwrite_frequency=3)
    return _train(strategy, var, opt,
                  [NO_OVERFLOW, 1, NO_OVERFLOW, NO_OVERFLOW])


def _task_id(strategy):
    resolver = strategy.cluster_resolver
    return resolver.task_id if resolver is not None else 0


def _barrier(strategy):
    """Returns once every worker has called it (a collective sum)."""
    strategy.reduce(
        tf.distribute.ReduceOp.SUM,
        strategy.run(lambda: tf.constant(1.0)),
        axis=None,
    )


def checkpoint(strategy, workdir):
    """The chief saves mid-training; both workers restore and continue."""
    var, opt = _build(strategy)
    _train(strategy, var, opt, [NO_OVERFLOW, 1, NO_OVERFLOW])
    chief = _task_id(strategy) == 0
    # Every worker saves (TF's multi-worker rule); only the chief's is kept.
    target = os.path.join(
        workdir, "chief" if chief else f"scratch-{_task_id(strategy)}")
    path = tf.train.Checkpoint(var=var, optimizer=opt).write(
        os.path.join(target, "ckpt")
    )
    _barrier(strategy)
    if not chief:
        shutil.rmtree(target)
        path = os.path.join(workdir, "chief", "ckpt")
    restored_var, restored_opt = _build(strategy)
    tf.train.Checkpoint(var=restored_var, optimizer=restored_opt).read(
        path
    ).assert_existing_objects_matched()
    return {
        "continued": _train(strategy, var, opt, [NO_OVERFLOW, 0]),
        "restored": _train(strategy, restored_var, restored_opt,
                           [NO_OVERFLOW, 0]),
    }


# One training run, preempted: steps 2 and 8 overflow on worker 1, step 5 on
# worker 0; the chief checkpoints every 2 steps.
PREEMPTED_SCHEDULE = [NO_OVERFLOW, 1, NO_OVERFLOW, NO_OVERFLOW, 0,
                      NO_OVERFLOW, NO_OVERFLOW, 1]
KILLED_BEFORE_STEP = 5


def preempted(strategy, workdir, kill=False):
    """A custom loop with a `tf.train.CheckpointManager`, resumed from the
    chief's latest checkpoint if there is one.

    With `kill`, worker 1 sends itself SIGKILL before step
    `KILLED_BEFORE_STEP` (after the chief's checkpoint of step 4), and
    worker 0 fails in that step's collectives.
    """
    var, opt = _build(strategy)
    task = _task_id(strategy)
    # `skipped_steps` as a checkpoint entry of its own (docs/distributed.md):
    # the optimizer's node keeps TF 2.4's layout, which has no room for it.
    checkpoint = tf.train.Checkpoint(var=var, optimizer=opt,
                                     skipped_steps=opt.skipped_steps)
    # Every worker saves (TF's multi-worker rule); only the chief's count.
    chief_directory = os.path.join(workdir, "chief")
    manager = tf.train.CheckpointManager(
        checkpoint, chief_directory if task == 0 else
        os.path.join(workdir, f"scratch-{task}"), max_to_keep=2)
    latest = tf.train.latest_checkpoint(chief_directory)
    if latest:
        with strategy.scope():
            opt.build([var])  # So that every slot restores now.
        checkpoint.restore(latest).assert_consumed()
    step = _step_fn(strategy, var, opt)
    begin = int(_local(strategy, opt.iterations))
    for number, bad_replica in enumerate(PREEMPTED_SCHEDULE[begin:], begin + 1):
        if kill and task == 1 and number == KILLED_BEFORE_STEP:
            os.kill(os.getpid(), signal.SIGKILL)
        step(bad_replica)
        if number % 2 == 0:
            manager.save(checkpoint_number=number)
    return {"began_at": begin, "state": state(strategy, var, opt)}


def preempted_kill(strategy, workdir):
    return preempted(strategy, workdir, kill=True)


def clipped_sum(strategy, workdir):
    """Each worker's gradient is 2.0; clipnorm=2.0 clips their sum, 4.0."""
    del workdir
    with strategy.scope():
        var = tf.Variable(5.0)
        opt = tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(1.0, clipnorm=2.0), initial_scale=4
        )

    @tf.function
    def step():
        strategy.run(lambda: opt.apply_gradients([(tf.constant(2.0), var)]))

    step()
    return {"var": _local(strategy, var)}


SCENARIOS = {
    "clipped_sum": clipped_sum,
    "overflow_on_worker_1": overflow_on_worker_1,
    "overflow_on_worker_0": overflow_on_worker_0,
    "optimizer_made_outside_the_scope": optimizer_made_outside_the_scope,
    "checkpoint": checkpoint,
    "moving_averages": moving_averages,
    "preempted": preempted,
    "preempted_kill": preempted_kill,
}
