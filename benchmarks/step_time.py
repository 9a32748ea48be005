"""Step time of loss scaling against the bare optimizer, side by side.

    .venv/bin/python benchmarks/step_time.py [--rounds N] [--output PATH]

Measures one training step (forward, gradients, apply) for each variant, in
one process, with interleaved rounds (A B C ... A B C ...), and reports the
median step time as a ratio to the bare optimizer, plus the number of ops in
the traced step (the step's graph and every function it calls). Writes a
Markdown table to docs/performance.md and prints it.

Variants:
  keras            bare Keras 3 optimizer (baseline for the rows below it)
  keras_lso        keras.optimizers.LossScaleOptimizer (scale_loss + apply)
  tf_lso_keras     tf_lso.LossScaleOptimizer, Keras 3 protocol
                   (scale_loss + apply_gradients of scaled gradients)
  tf_lso_legacy    tf_lso.LossScaleOptimizer, TF 2.x protocol
                   (get_scaled_loss + get_unscaled_gradients + apply_gradients)
  tf_keras         bare tf_keras legacy optimizer (baseline for the next row)
  tf_keras_lso     tf_keras.mixed_precision.LossScaleOptimizer, TF 2.x protocol

Every variant trains its own copy of the same variables, with SGD(momentum
0.9), in float32 (this CPU has no fast float16; loss scaling does the same
work in either dtype). The dynamic loss scale never overflows here, so each
step takes the apply branch, as almost every real step does.
"""

import argparse
import datetime
import os
import platform
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

import tf_lso  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- Models: plain TF functions of plain tf.Variables -------------------------


def _mlp(layers, width, batch):
    rng = np.random.default_rng(0)
    shapes = [((width, width), (width,))] * layers
    init = [a for k, b in shapes
            for a in (rng.normal(size=k) / np.sqrt(width), np.zeros(b))]
    x = tf.constant(rng.normal(size=(batch, width)), tf.float32)

    def loss(variables):
        h = x
        for kernel, bias in zip(variables[::2], variables[1::2]):
            h = tf.tanh(h @ kernel + bias)
        return tf.reduce_mean(tf.square(h))

    return init, loss


def _embedding(vocab, dim, batch, seq):
    rng = np.random.default_rng(0)
    init = [rng.normal(size=(vocab, dim)) * 0.05,
            rng.normal(size=(dim, dim)) / np.sqrt(dim), np.zeros(dim),
            rng.normal(size=(dim, 1)) / np.sqrt(dim), np.zeros(1)]
    ids = tf.constant(rng.integers(0, vocab, size=(batch, seq)), tf.int32)

    def loss(variables):
        table, k1, b1, k2, b2 = variables
        h = tf.reduce_mean(tf.gather(table, ids), axis=1)  # IndexedSlices
        h = tf.tanh(h @ k1 + b1) @ k2 + b2
        return tf.reduce_mean(tf.square(h - 1.0))

    return init, loss


def _independent(count, batch=8, width=16):
    """`count` small variables in parallel: per-variable cost, isolated."""
    rng = np.random.default_rng(0)
    init = [rng.normal(size=(width, width)) / width for _ in range(count)]
    x = tf.constant(rng.normal(size=(batch, width)), tf.float32)

    def loss(variables):
        return tf.add_n([tf.reduce_mean(tf.tanh(x @ v)) for v in variables])

    return init, loss


SHAPES = {
    "MLP 100 layers x 32 (200 vars)": lambda: _mlp(100, 32, 32),
    "MLP 8 layers x 512 (16 vars)": lambda: _mlp(8, 512, 64),
    "Embedding 20000x64 + 2 dense (5 vars)": lambda: _embedding(20000, 64,
                                                                64, 8),
    "10 independent vars": lambda: _independent(10),
    "100 independent vars": lambda: _independent(100),
    "1000 independent vars": lambda: _independent(1000),
}


# -- Variants -----------------------------------------------------------------


def _sgd():
    return keras.optimizers.SGD(0.01, momentum=0.9)


def _legacy_sgd():
    return tf_keras.optimizers.legacy.SGD(0.01, momentum=0.9)


def _plain_step(opt, variables, loss_fn):
    with tf.GradientTape() as tape:
        loss = loss_fn(variables)
    grads = tape.gradient(loss, variables)
    opt.apply_gradients(zip(grads, variables))
    return loss


def _keras_protocol_step(opt, variables, loss_fn):
    with tf.GradientTape() as tape:
        loss = loss_fn(variables)
        scaled_loss = opt.scale_loss(loss)
    grads = tape.gradient(scaled_loss, variables)
    opt.apply_gradients(zip(grads, variables))
    return loss


def _legacy_protocol_step(opt, variables, loss_fn):
    with tf.GradientTape() as tape:
        loss = loss_fn(variables)
        scaled_loss = opt.get_scaled_loss(loss)
    grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, variables))
    opt.apply_gradients(zip(grads, variables))
    return loss


# name: (make optimizer, step, baseline name)
VARIANTS = {
    "keras": (_sgd, _plain_step, "keras"),
    "keras_lso": (lambda: keras.optimizers.LossScaleOptimizer(_sgd()),
                  _keras_protocol_step, "keras"),
    "tf_lso_keras": (lambda: tf_lso.LossScaleOptimizer(_sgd()),
                     _keras_protocol_step, "keras"),
    "tf_lso_legacy": (lambda: tf_lso.LossScaleOptimizer(_sgd()),
                      _legacy_protocol_step, "keras"),
    "tf_keras": (_legacy_sgd, _plain_step, "tf_keras"),
    "tf_keras_lso": (
        lambda: tf_keras.mixed_precision.LossScaleOptimizer(_legacy_sgd()),
        _legacy_protocol_step, "tf_keras",
    ),
}


def _op_count(concrete):
    graph_def = concrete.graph.as_graph_def()
    return len(graph_def.node) + sum(
        len(f.node_def) for f in graph_def.library.function
    )


def _make(variant, init, loss_fn, jit_compile):
    make_opt, step, _ = VARIANTS[variant]
    variables = [tf.Variable(tf.constant(v, tf.float32)) for v in init]
    opt = make_opt()
    fn = tf.function(lambda: step(opt, variables, loss_fn),
                     jit_compile=jit_compile)
    ops = _op_count(fn.get_concrete_function())
    for _ in range(3):  # trace, compile, create slots, warm caches
        fn().numpy()
    return fn, ops


def _time(fn, steps):
    start = time.perf_counter()
    for _ in range(steps):
        out = fn()
    tf.nest.map_structure(lambda t: t.numpy(), out)
    return (time.perf_counter() - start) / steps


def interleaved_medians(fns, rounds, round_seconds):
    """Median step time of each of `fns`, timed in interleaved rounds."""
    # Steps per round: about `round_seconds` for the slowest function.
    slowest = max(_time(fn, 3) for fn in fns.values())
    steps = max(5, int(round_seconds / slowest))
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():  # interleaved: A B C ... A B C ...
            samples[name].append(_time(fn, steps))
    return {name: statistics.median(s) for name, s in samples.items()}


def measure(shape, jit_compile, rounds, round_seconds):
    init, loss_fn = SHAPES[shape]()
    fns, ops, failed = {}, {}, {}
    for variant in VARIANTS:
        try:
            fns[variant], ops[variant] = _make(variant, init, loss_fn,
                                               jit_compile)
        except Exception as e:  # e.g. an op XLA cannot compile
            failed[variant] = f"{type(e).__name__}"
    medians = interleaved_medians(fns, rounds, round_seconds)

    def cell(variant, base):
        if variant in failed:
            return failed[variant]
        if base in failed:
            return f"its baseline: {failed[base]}"
        return medians[variant], medians[variant] / medians[base], ops[variant]

    return {variant: cell(variant, base)
            for variant, (_, _, base) in VARIANTS.items()}


def _table(results, rounds):
    variants = list(VARIANTS)
    lines = [
        "| shape | mode | " + " | ".join(variants) + " |",
        "|---|---|" + "---|" * len(variants),
    ]
    for (shape, mode), row in results.items():
        cells = [f"fails: {row[v]}" if isinstance(row[v], str) else
                 f"{row[v][1]:.2f}× ({row[v][0] * 1e3:.2f} ms, "
                 f"{row[v][2]} ops)" for v in variants]
        lines.append(f"| {shape} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--round-seconds", type=float, default=0.1)
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES))
    parser.add_argument(
        "--output", default=os.path.join(ROOT, "docs", "performance.md")
    )
    args = parser.parse_args()
    results = {}
    for shape in args.shapes:
        for jit_compile in (False, True):
            mode = "jit_compile" if jit_compile else "tf.function"
            results[(shape, mode)] = measure(shape, jit_compile, args.rounds,
                                             args.round_seconds)
            print(f"measured {shape}, {mode}", flush=True)
    table = _table(results, args.rounds)
    print(table)
    if args.output:
        _write(args.output, table, args)


def _write(path, table, args):
    header = open(os.path.join(ROOT, "benchmarks", "performance_header.md")
                  ).read()
    machine = (f"{platform.processor() or platform.machine()}, "
               f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
               f"TensorFlow {tf.__version__}, Keras {keras.__version__}, "
               f"tf_keras {tf_keras.__version__}")
    text = header.format(date=datetime.date.today().isoformat(),
                         machine=machine, rounds=args.rounds, table=table)
    if os.path.exists(path):  # benchmarks/ablation.py's tables stay.
        old = open(path).read()
        for marker in ("ablation", "mirrored", "mirrored_eager"):
            text = _keep_block(old, text, marker)
    with open(path, "w") as f:
        f.write(text)


def _markers(marker):
    return f"<!-- {marker} -->", f"<!-- /{marker} -->"


def replace_block(text, marker, content):
    """`text` with `content` between `marker`'s begin and end comments."""
    begin, end = _markers(marker)
    head, rest = text.split(begin, 1)
    return head + begin + content + end + rest.split(end, 1)[1]


def _keep_block(old, new, marker):
    """`new` with the text between `marker`'s comment lines taken from `old`."""
    begin, end = _markers(marker)
    if begin not in old or begin not in new:
        return new
    return replace_block(new, marker, old.split(begin, 1)[1].split(end, 1)[0])


if __name__ == "__main__":
    main()
