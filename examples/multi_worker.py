"""Two-worker MultiWorkerMirroredStrategy training on localhost, one command.

    python examples/multi_worker.py [--steps N]

Starts two worker processes on 127.0.0.1 (free ports, `TF_CONFIG` per
worker), each with one CPU replica. They train one mixed_float16 model with a
TF 2.x custom loop and `tf_lso.LossScaleOptimizer`. At every 10th step only
worker 1 gets a batch that overflows float16: both workers skip that step
together and the loss scale halves once. The launcher prints both workers'
logs and checks that they ended with identical weights.

A worker is this same file run with `--worker INDEX --ports P0,P1`.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time


def run_worker(index, ports, steps):
    import faulthandler

    faulthandler.dump_traceback_later(300, exit=True)  # never hang forever
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports.split(",")]},
        "task": {"type": "worker", "index": index},
    })
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np
    import tensorflow as tf

    import tf_lso

    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=60
        )
    )
    keras.utils.set_random_seed(0)  # same initial weights on every worker
    keras.mixed_precision.set_global_policy("mixed_float16")
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((16,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(1, dtype="float32"),
        ])
        opt = tf_lso.LossScaleOptimizer(
            keras.optimizers.Adam(1e-2), initial_scale=2**12,
            dynamic_growth_steps=4,
        )

    global_batch = 64
    rng = np.random.default_rng(index)  # each worker has its own data
    true_w = np.linspace(-1, 1, 16, dtype="float32")[:, None]

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_example = tf.square(model(x) - y)
            loss = tf.reduce_sum(per_example) / global_batch
            scaled_loss = opt.get_scaled_loss(loss)
        grads = opt.get_unscaled_gradients(
            tape.gradient(scaled_loss, model.trainable_variables)
        )
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(x, y):
        losses = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    print(f"worker {index}: {'step':>4} {'loss scale':>10} {'skipped':>7} "
          f"{'loss':>9}", flush=True)
    for step in range(1, steps + 1):
        x = rng.normal(size=(global_batch // 2, 16)).astype("float32")
        y = x @ true_w
        if index == 1 and step % 10 == 0:
            y = y * 1e6  # float16 overflows on this worker only
        loss = train_step(x, y)
        print(f"worker {index}: {step:>4} {float(opt.loss_scale):>10.0f} "
              f"{int(opt.skipped_steps.numpy()):>7} {float(loss):>9.4g}",
              flush=True)
    digest = float(sum(np.abs(w.numpy()).sum() for w in model.weights))
    print(f"RESULT {json.dumps({'weights': digest})}", flush=True)


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def launch(steps, timeout):
    ports = ",".join(map(str, free_ports(2)))
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    logs, workers = [], []
    try:
        for index in range(2):
            log = open(_log_path(index), "w+")
            logs.append(log)
            workers.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", str(index),
                 "--ports", ports, "--steps", str(steps)],
                start_new_session=True, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, env=env,
            ))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(
            w.poll() is None for w in workers
        ):
            if any(w.poll() not in (None, 0) for w in workers):
                deadline = min(deadline, time.monotonic() + 15)
            time.sleep(0.2)
    finally:
        for worker in workers:  # reap both, whatever happened
            try:
                os.killpg(worker.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            worker.wait()
    results = []
    for index, log in enumerate(logs):
        log.seek(0)
        text = log.read()
        log.close()
        os.remove(log.name)
        print(f"----- worker {index} (exit code {workers[index].returncode})")
        print("\n".join(line for line in text.splitlines()
                        if line.startswith(("worker", "RESULT"))))
        results += [json.loads(line[7:]) for line in text.splitlines()
                    if line.startswith("RESULT ")]
    if len(results) != 2 or results[0] != results[1]:
        print("FAILED: the workers did not finish with identical weights")
        return 1
    print("OK: both workers skipped the same steps and hold identical weights")
    return 0


def _log_path(index):
    import tempfile

    return os.path.join(tempfile.gettempdir(),
                        f"tf_lso_multi_worker_{os.getpid()}_{index}.log")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        run_worker(args.worker, args.ports, args.steps)
        return 0
    return launch(args.steps, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
