"""Step time of this tree's tf_lso against another git revision's, side by side.

    .venv/bin/python benchmarks/compare_revisions.py REV [--rounds N]
        [--inner keras|legacy]

Exports `tf_lso/` of REV (any git revision) into a temporary directory as a
package named `tf_lso_rev` and times, in this one process with interleaved
rounds, the same TF 2.x-protocol training step (get_scaled_loss,
get_unscaled_gradients, apply_gradients of SGD with momentum, in a
tf.function) with both versions. Reports median step times and their ratio
(this tree / REV) per model, and the number of ops in each traced step (its
graph plus every function it calls, both branches of the skip cond). The
loss scale never overflows, so this is the finite path: what almost every
real step runs. `--inner legacy` wraps a tf_keras legacy SGD (OptimizerV2)
instead of Keras 3's.
"""

import argparse
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODELS = {"MLP 8 layers x 512": (8, 512), "MLP 100 layers x 32": (100, 32)}


def export_revision(revision, directory):
    """Writes REV's tf_lso as package `tf_lso_rev` under `directory`."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "tf_lso"],
        check=True, capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", directory], input=archive, check=True)
    package = pathlib.Path(directory, "tf_lso")
    for path in package.rglob("*.py"):
        text = path.read_text()
        text = re.sub(r"\btf_lso\b", "tf_lso_rev", text)
        path.write_text(text)
    package.rename(pathlib.Path(directory, "tf_lso_rev"))


def _mlp(layers, width, batch=64):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    init = []
    for _ in range(layers):
        init += [rng.normal(size=(width, width)) / np.sqrt(width),
                 np.zeros(width)]
    x = tf.constant(rng.normal(size=(batch, width)), tf.float32)

    def loss(variables):
        h = x
        for kernel, bias in zip(variables[::2], variables[1::2]):
            h = tf.tanh(h @ kernel + bias)
        return tf.reduce_mean(tf.square(h))

    return init, loss


def _sgd(inner):
    if inner == "legacy":
        import tf_keras

        return tf_keras.optimizers.legacy.SGD(0.01, momentum=0.9)
    import keras

    return keras.optimizers.SGD(0.01, momentum=0.9)


def _step(module, init, loss, inner):
    import tensorflow as tf

    variables = [tf.Variable(a, dtype=tf.float32) for a in init]
    opt = module.LossScaleOptimizer(_sgd(inner))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            scaled_loss = opt.get_scaled_loss(loss(variables))
        grads = opt.get_unscaled_gradients(
            tape.gradient(scaled_loss, variables))
        opt.apply_gradients(zip(grads, variables))

    for _ in range(5):
        step()
    return step


def op_count(step):
    """Ops in a traced `tf.function`: its graph and every function it calls."""
    graph_def = step.get_concrete_function().graph.as_graph_def()
    return len(graph_def.node) + sum(
        len(f.node_def) for f in graph_def.library.function)


def _median_step(step, seconds):
    start, count = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        step()
        count += 1
    return (time.perf_counter() - start) / count


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--round-seconds", type=float, default=0.4)
    parser.add_argument("--inner", choices=("keras", "legacy"),
                        default="keras")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        export_revision(args.revision, directory)
        sys.path.insert(0, directory)
        import tf_lso_rev

        import tf_lso

        print(f"| model | {args.revision} (ms) | this tree (ms) | ratio | "
              f"{args.revision} ops | this tree ops |")
        print("|---|---|---|---|---|---|")
        for name, (layers, width) in MODELS.items():
            init, loss = _mlp(layers, width)
            steps = {"rev": _step(tf_lso_rev, init, loss, args.inner),
                     "tree": _step(tf_lso, init, loss, args.inner)}
            times = {key: [] for key in steps}
            for _ in range(args.rounds):
                for key, step in steps.items():
                    times[key].append(_median_step(step, args.round_seconds))
            rev, tree = (statistics.median(times[k]) for k in ("rev", "tree"))
            print(f"| {name} | {rev * 1e3:.3f} | {tree * 1e3:.3f} | "
                  f"{tree / rev:.3f} | {op_count(steps['rev'])} | "
                  f"{op_count(steps['tree'])} |")


if __name__ == "__main__":
    main()
