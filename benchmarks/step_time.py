"""Step time of loss scaling against the bare optimizer, side by side.

    .venv/bin/python benchmarks/step_time.py [--processes N] [--rounds N]
        [--shapes SHAPE ...] [--output PATH]

Measures one training step (forward, gradients, apply) for each variant with
interleaved rounds (A B C ... A B C ...), each shape in a process of its
own, and the whole run N times (default 3), one process after another. In
each process a variant's ratio is the median over rounds of its step time
divided by its baseline's in the same round; a cell reports the median of
the N processes' ratios and their range (one process can sit 0.2x off the
others under XLA), the median step time and the number of ops in the traced
step (the step's graph and every function it calls). Prints a Markdown
table; `--output docs/performance.md` also writes that page with it (the
nox session `benchmarks` does).

Variants:
  keras            bare Keras 3 optimizer (baseline for the rows below it)
  floor            the bare optimizer's update inside a tf.cond on a finite
                   check of each gradient: what exact skip semantics cost
                   with nothing else of loss scaling
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
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
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


def _keras_mlp(layers, width, batch):
    """The 100 x 32 MLP as a user writes it: Keras layers and variables.

    Returns a builder in place of initial values (see `instantiate`): each
    variant gets its own model, seeded alike.
    """
    x = tf.constant(np.random.default_rng(0).normal(size=(batch, width)),
                    tf.float32)

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((width,))]
            + [keras.layers.Dense(width, activation="tanh")
               for _ in range(layers)]
        )

        def loss(variables):  # The model reads them; the tape watches them.
            return tf.reduce_mean(tf.square(model(x)))

        return model.trainable_variables, loss

    return build, None


def instantiate(init, loss_fn):
    """Fresh variables for one variant, and the loss function of them."""
    if callable(init):
        return init()
    return [tf.Variable(tf.constant(v, tf.float32)) for v in init], loss_fn


SHAPES = {
    "MLP 100 layers x 32 (200 vars)": lambda: _mlp(100, 32, 32),
    "Keras Dense 100 layers x 32 (200 vars)": lambda: _keras_mlp(100, 32, 32),
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


def _floor_step(opt, variables, loss_fn):
    with tf.GradientTape() as tape:
        loss = loss_fn(variables)
    grads = tape.gradient(loss, variables)
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g))
                            for g in grads])

    def apply():
        opt.apply_gradients(zip(grads, variables))
        return tf.constant(True)

    tf.cond(finite, apply, lambda: tf.constant(False))
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
    "floor": (_sgd, _floor_step, "keras"),
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


# (variant, shape, jit_compile): why that cell is not measured.
NOT_MEASURED = {
    # XLA turns the floor's conditional into selects and fuses the 1000
    # per-gradient finite flags into each of the 1000 updates: its compile
    # of that quadratic program reached this machine's 24 GB in 30 min.
    ("floor", "1000 independent vars", True): "XLA compile > 24 GB",
}


def _op_count(concrete):
    graph_def = concrete.graph.as_graph_def()
    return len(graph_def.node) + sum(
        len(f.node_def) for f in graph_def.library.function
    )


def _make(variant, init, loss_fn, jit_compile):
    make_opt, step, _ = VARIANTS[variant]
    variables, loss_fn = instantiate(init, loss_fn)
    opt = make_opt()
    if step is _floor_step:  # No variables may be created inside its cond.
        opt.build(variables)
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


def interleaved_samples(fns, rounds, round_seconds):
    """Step times of each of `fns`, one per round, timed interleaved."""
    # Steps per round: about `round_seconds` for the slowest function.
    slowest = max(_time(fn, 3) for fn in fns.values())
    steps = max(5, int(round_seconds / slowest))
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():  # interleaved: A B C ... A B C ...
            samples[name].append(_time(fn, steps))
    return samples


def median_ratio(times, base_times):
    """The median over rounds of `times` divided by `base_times` (same round)."""
    return statistics.median(a / b for a, b in zip(times, base_times))


def measure(shape, jit_compile, rounds, round_seconds):
    """{variant: (median seconds, ratio, ops) or the error's type name}.

    The ratio is the median over rounds of the variant's time divided by its
    baseline's in the same round (a round's load affects both alike).
    """
    init, loss_fn = SHAPES[shape]()
    fns, ops, failed = {}, {}, {}
    for variant in VARIANTS:
        if (variant, shape, jit_compile) in NOT_MEASURED:
            failed[variant] = NOT_MEASURED[variant, shape, jit_compile]
            continue
        try:
            fns[variant], ops[variant] = _make(variant, init, loss_fn,
                                               jit_compile)
        except Exception as e:  # e.g. an op XLA cannot compile
            failed[variant] = f"{type(e).__name__}"
    samples = interleaved_samples(fns, rounds, round_seconds)

    def cell(variant, base):
        if variant in failed:
            return failed[variant]
        if base in failed:
            return f"its baseline: {failed[base]}"
        return (statistics.median(samples[variant]),
                median_ratio(samples[variant], samples[base]), ops[variant])

    return {variant: cell(variant, base)
            for variant, (_, _, base) in VARIANTS.items()}


def combine(runs):
    """One cell per variant from several processes' `measure` results.

    Returns {variant: (median seconds, median ratio, lowest ratio, highest
    ratio, ops)}, or the error's text if any process failed it.
    """
    cells = {}
    for variant in runs[0]:
        results = [run[variant] for run in runs]
        failures = [r for r in results if isinstance(r, str)]
        if failures:
            cells[variant] = failures[0]
            continue
        ratios = [r[1] for r in results]
        cells[variant] = (statistics.median(r[0] for r in results),
                          statistics.median(ratios), min(ratios), max(ratios),
                          results[0][2])
    return cells


def _cell(value):
    if isinstance(value, str):
        if value in NOT_MEASURED.values():
            return f"not measured: {value}"
        return f"fails: {value}"
    seconds, ratio, low, high, ops = value
    return (f"{ratio:.2f}× ({low:.2f}–{high:.2f}; {seconds * 1e3:.2f} ms, "
            f"{ops} ops)")


def _table(results):
    variants = list(VARIANTS)
    lines = [
        "| shape | mode | " + " | ".join(variants) + " |",
        "|---|---|" + "---|" * len(variants),
    ]
    for (shape, mode), row in results.items():
        cells = [_cell(row[v]) for v in variants]
        lines.append(f"| {shape} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


MODES = {"tf.function": False, "jit_compile": True}


def _run_process(args, shape):
    """Measures one shape in every mode in a new process; returns results.

    One process per shape: a process keeps what XLA compiled, and one that
    measured every shape reached 18 GB at the last.
    """
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "results.json")
        subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child", path,
             "--rounds", str(args.rounds),
             "--round-seconds", str(args.round_seconds),
             "--shapes", shape, "--modes", *args.modes],
            check=True,
        )
        with open(path) as f:
            return {tuple(key.split("\t")): row
                    for key, row in json.load(f).items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--round-seconds", type=float, default=0.1)
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES))
    parser.add_argument("--modes", nargs="*", default=list(MODES))
    parser.add_argument("--output",
                        help="also write this page (docs/performance.md)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # One process's share: results as JSON, no table.
        results = {}
        for shape in args.shapes:
            for mode in args.modes:
                results[f"{shape}\t{mode}"] = measure(
                    shape, MODES[mode], args.rounds, args.round_seconds)
                print(f"measured {shape}, {mode}", flush=True)
        with open(args.child, "w") as f:
            json.dump(results, f)
        return
    runs = []
    for number in range(args.processes):
        print(f"process {number + 1} of {args.processes}", flush=True)
        run = {}
        for shape in args.shapes:
            run.update(_run_process(args, shape))
        runs.append(run)
    results = {key: combine([run[key] for run in runs]) for key in runs[0]}
    table = _table(results)
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
                         machine=machine, rounds=args.rounds,
                         processes=args.processes, table=table)
    if os.path.exists(path):  # benchmarks/ablation.py's tables stay.
        old = open(path).read()
        for marker in ("ablation", "candidates", "hlo", "mirrored",
                       "mirrored_eager"):
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


def write_block(path, marker, table):
    """Replaces the text between `marker`'s begin/end lines in `path`."""
    text = replace_block(open(path).read(), marker, f"\n{table}\n")
    with open(path, "w") as f:
        f.write(text)


def _keep_block(old, new, marker):
    """`new` with the text between `marker`'s comment lines taken from `old`."""
    begin, end = _markers(marker)
    if begin not in old or begin not in new:
        return new
    return replace_block(new, marker, old.split(begin, 1)[1].split(end, 1)[0])


if __name__ == "__main__":
    main()
