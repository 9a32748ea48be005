"""Where tf_lso's step overhead goes: an ablation, side by side.

    .venv/bin/python benchmarks/ablation.py [--rounds N] [--output PATH]
    .venv/bin/python benchmarks/ablation.py --mirrored [--eager]

Builds the bare optimizer's step up to tf_lso's one piece at a time and times
every variant in one process, with interleaved rounds (A B C ... A B C ...),
reporting the median step time as a ratio to the bare step:

  bare            Keras 3 SGD(momentum=0.9), apply_gradients
  check           + tf_lso's finite check of the gradients (its result is
                  returned, not used by the update)
  barrier         + the check as a control dependency of the update
  cond_flag       the update inside a lowered tf.cond on a True flag variable
  cond_flag_if    the same cond, not lowered (one If op)
  cond_check      the update inside a lowered tf.cond on the check
  cond_check_if   the same, not lowered
  tf_lso_*        tf_lso.LossScaleOptimizer (Keras 3 protocol, and the TF 2.x
                  protocol), as it ships, and with each candidate change
                  switched to its other side (see CANDIDATES)

`--mirrored` times bare Keras 3, Keras 3's LossScaleOptimizer and tf_lso in
a custom loop under MirroredStrategy on two logical CPUs (the cost of the
shared skip decision). It prints the table; `--output docs/performance.md`
also writes it there, between the `ablation` markers (`--marker` names
another block, e.g. `candidates` for a run of chosen shapes and variants).
`--mirrored --eager` runs that loop eagerly (`strategy.run` outside
`tf.function`).
"""

import argparse
import contextlib
import functools
import os
import statistics
import sys
import time
from unittest import mock

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

MIRRORED = "--mirrored" in sys.argv
import tensorflow as tf  # noqa: E402

if MIRRORED:  # Before TensorFlow initialises its devices.
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * 2,
    )

import keras  # noqa: E402

import tf_lso  # noqa: E402
from tf_lso._src.gradients import packing as gradients_lib  # noqa: E402
from tf_lso._src.gradients import replicas as distribute  # noqa: E402
from tf_lso._src.optimizer import apply_step  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step_time  # noqa: E402

SHAPES = ("MLP 100 layers x 32 (200 vars)",
          "Keras Dense 100 layers x 32 (200 vars)",
          "MLP 8 layers x 512 (16 vars)",
          "Embedding 20000x64 + 2 dense (5 vars)", "1000 independent vars")
MIRRORED_SHAPES = ("MLP 100 layers x 32 (200 vars)",
                   "MLP 8 layers x 512 (16 vars)")


@tf.autograph.experimental.do_not_convert
def _take_nothing(self, grads):
    return None


def _cond_not_lowered(pred, true_fn, false_fn):
    """`tf.cond` kept as one If op when traced (functions return nothing).

    TensorFlow lowers a cond to Switch/Merge ops in a graph; this one it
    runs as a function call, and only the taken branch's. Private (TF 2.16
    to 2.21): `control_flow_util_v2.maybe_set_lowering_attr` and the If op's
    `_lower_using_switch_merge` attribute, the switch `cond_v2` itself uses.
    Here only, for the `*_if` variants and the `+cond_not_lowered` candidate.
    """
    from tensorflow.python.ops import control_flow_util_v2

    def branch(fn):
        def run():
            fn()
            return tf.constant(True)  # An output, to find the If op by.
        return run

    if tf.executing_eagerly():
        (true_fn if bool(pred) else false_fn)()
        return
    op = tf.cond(pred, branch(true_fn), branch(false_fn)).op
    while op.type == "Identity":
        op = op.inputs[0].op
    assert op.type in ("If", "StatelessIf"), op.type
    control_flow_util_v2.maybe_set_lowering_attr(
        op, lower_using_switch_merge=False)


# The inner optimizer whose step `_select_cond` is traced for (set by _make).
_SELECTED = []


def _select_cond(pred, true_fn, false_fn, args, false_args=()):
    """Candidate +select_skip: no conditional around the update.

    Applies on every step, then assigns each variable and each of the inner
    optimizer's variables `where(pred, new, old)`: exact skip semantics
    (the old values, bit for bit) with the update outside any `cond`, which
    XLA may fuse with the select. Only the skip's bookkeeping (counters, the
    overflow record) stays in a `cond`. A prototype: no strategy.
    """
    state = list(args[2]) + list(_SELECTED[-1].inner_optimizer.variables)
    old = [tf.identity(v) for v in state]
    with tf.control_dependencies(old):
        true_fn(*args)
    for variable, value in zip(state, old):
        variable.assign(tf.where(pred, variable, value))
    tf.cond(pred, lambda: tf.constant(True),
            lambda: _true(false_fn(*false_args)))


def _unscaled_keeping_scaled(self, scale, unscaled=gradients_lib.Packed.unscaled):
    result = unscaled(self, scale)
    result.check_values = self.values
    return result


def _all_finite_of_scaled(grads, all_finite=distribute.all_finite):
    if not isinstance(grads, gradients_lib.Packed):
        return all_finite(grads)
    return tf.equal(distribute.summed(
        gradients_lib.nonfinite, getattr(grads, "check_values", grads.values)),
        0.0)


@contextlib.contextmanager
def _scaled_check():
    """Candidate +scaled_check: the finite check reads the scaled gradients.

    For a loss scale of at least 1 this decides the same (dividing by it
    turns no finite value into a non-finite one, nor the reverse), and the
    check need not wait for the unscale. A prototype: assumes scale >= 1.
    """
    with mock.patch.object(gradients_lib.Packed, "unscaled",
                           _unscaled_keeping_scaled), \
            mock.patch.object(distribute, "all_finite",
                              _all_finite_of_scaled):
        yield


def _skip_as_call(cond=distribute.cond_on_all_replicas):
    """Candidate +skip_call: the skip branch as one function call op.

    A lowered cond dispatches every op of its untaken branch (as dead) on
    each step; a call op is one. The apply branch stays inline.
    """
    def patched(pred, true_fn, false_fn, args, false_args=()):
        return cond(pred, true_fn, apply_step._one_op(false_fn), args,
                    false_args)
    return mock.patch.object(distribute, "cond_on_all_replicas", patched)


# Candidate changes to tf_lso's step: label -> (a context manager that
# switches to the other side while a variant is traced, the protocols it
# concerns). "+x": tf_lso ships without x; "-x": tf_lso ships with x.
CANDIDATES = {
    "+select_skip": (
        lambda: mock.patch.object(distribute, "cond_on_all_replicas",
                                  _select_cond),
        ("keras", "legacy")),
    "+scaled_check": (_scaled_check, ("keras",)),
    "+skip_call": (_skip_as_call, ("keras", "legacy")),
    "-stacking": (
        lambda: mock.patch.object(gradients_lib, "PACK_MAX_ELEMENTS", 0),
        ("keras", "legacy")),
    "+cond_not_lowered": (
        lambda: mock.patch.object(distribute, "_lowered_cond",
                                  _cond_not_lowered),
        ("keras", "legacy")),
    "-reuse_packing": (
        lambda: mock.patch.object(gradients_lib.HandedOut, "take",
                                  _take_nothing),
        ("legacy",)),
}


def _grads(variables, loss_fn):
    with tf.GradientTape() as tape:
        loss = loss_fn(variables)
    return loss, tape.gradient(loss, variables)


def _apply(opt, grads, variables):
    return lambda: opt.apply_gradients(zip(grads, variables))


def _without_flag(step):
    """One of step_time's steps, in this file's step signature."""
    return lambda opt, variables, loss_fn, flag: step(opt, variables, loss_fn)


bare = _without_flag(step_time._plain_step)
keras_protocol = _without_flag(step_time._keras_protocol_step)
legacy_protocol = _without_flag(step_time._legacy_protocol_step)


def check(opt, variables, loss_fn, flag):
    loss, grads = _grads(variables, loss_fn)
    opt.apply_gradients(zip(grads, variables))
    return loss, distribute.all_finite(grads)


def _finite_per_tensor(grads):
    return tf.reduce_all(tf.stack(
        [tf.reduce_all(tf.math.is_finite(g)) for g in grads]))


def check_per_tensor(opt, variables, loss_fn, flag):
    loss, grads = _grads(variables, loss_fn)
    opt.apply_gradients(zip(grads, variables))
    return loss, _finite_per_tensor(grads)


def barrier_per_tensor(opt, variables, loss_fn, flag):
    loss, grads = _grads(variables, loss_fn)
    with tf.control_dependencies([_finite_per_tensor(grads)]):
        opt.apply_gradients(zip(grads, variables))
    return loss


def barrier(opt, variables, loss_fn, flag):
    loss, grads = _grads(variables, loss_fn)
    with tf.control_dependencies([distribute.all_finite(grads)]):
        opt.apply_gradients(zip(grads, variables))
    return loss


def _cond_step(pred_fn, lowered):
    def step(opt, variables, loss_fn, flag):
        loss, grads = _grads(variables, loss_fn)
        pred = pred_fn(grads, flag)
        apply = _apply(opt, grads, variables)
        if lowered:
            tf.cond(pred, lambda: _true(apply()), lambda: tf.constant(False))
        else:
            _cond_not_lowered(pred, apply, lambda: None)
        return loss
    return step


def _true(_):
    return tf.constant(True)


def _flag(grads, flag):
    return flag.read_value()


def _check(grads, flag):
    return distribute.all_finite(grads)


def _lso():
    return tf_lso.LossScaleOptimizer(step_time._sgd())


def _variants():
    """name: (make optimizer, step, candidate switched off or None)."""
    variants = {
        "bare": (step_time._sgd, bare, None),
        "check": (step_time._sgd, check, None),
        "barrier": (step_time._sgd, barrier, None),
        "check_per_tensor": (step_time._sgd, check_per_tensor, None),
        "barrier_per_tensor": (step_time._sgd, barrier_per_tensor, None),
        "cond_flag": (step_time._sgd, _cond_step(_flag, True), None),
        "cond_flag_if": (step_time._sgd, _cond_step(_flag, False), None),
        "cond_check": (step_time._sgd, _cond_step(_check, True), None),
        "cond_check_if": (step_time._sgd, _cond_step(_check, False), None),
        "tf_lso_keras": (_lso, keras_protocol, None),
        "tf_lso_legacy": (_lso, legacy_protocol, None),
    }
    steps = {"keras": keras_protocol, "legacy": legacy_protocol}
    for candidate, (_, protocols) in CANDIDATES.items():
        for protocol in protocols:
            variants[f"tf_lso_{protocol} {candidate}"] = (
                _lso, steps[protocol], candidate)
    return variants


def _make(make_opt, step, candidate, init, loss_fn, jit_compile):
    variables, loss_fn = step_time.instantiate(init, loss_fn)
    flag = tf.Variable(True)
    opt = make_opt()
    _SELECTED.append(opt)
    opt.build(variables)  # No variables may be created inside a cond.
    fn = tf.function(lambda: step(opt, variables, loss_fn, flag),
                     jit_compile=jit_compile)
    switch = CANDIDATES[candidate][0] if candidate else contextlib.nullcontext
    with switch():
        ops = step_time._op_count(fn.get_concrete_function())
        for _ in range(3):  # trace, compile, create slots, warm caches
            tf.nest.map_structure(lambda t: t.numpy(), fn())
    return fn, ops


def measure(shape, jit_compile, rounds, round_seconds, only=()):
    init, loss_fn = step_time.SHAPES[shape]()
    fns, ops = {}, {}
    for name, (make_opt, step, candidate) in _variants().items():
        if only and name != "bare" and not any(o in name for o in only):
            continue
        start = time.perf_counter()
        fns[name], ops[name] = _make(make_opt, step, candidate, init, loss_fn,
                                     jit_compile)
        print(f"  built {name} in {time.perf_counter() - start:.0f} s",
              file=sys.stderr, flush=True)
    return _ratios(step_time.interleaved_samples(fns, rounds, round_seconds), ops)


def _ratios(samples, ops):
    """{name: (median seconds, median of per-round ratios to bare, ops)}."""
    return {
        name: (statistics.median(times),
               step_time.median_ratio(times, samples["bare"]), ops.get(name))
        for name, times in samples.items()
    }


@functools.cache
def _strategy():
    # One per process: TensorFlow reuses collective keys across strategy
    # objects ("Shape mismatch in the collective instance").
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def measure_mirrored(shape, rounds, round_seconds, eager=False):
    strategy = _strategy()
    init, shape_loss_fn = step_time.SHAPES[shape]()
    makers = {
        "bare": (step_time._sgd, bare),
        "keras_lso": (lambda: keras.optimizers.LossScaleOptimizer(
            step_time._sgd()), keras_protocol),
        "tf_lso_keras": (_lso, keras_protocol),
        "tf_lso_legacy": (_lso, legacy_protocol),
    }
    fns = {}
    for name, (make_opt, step) in makers.items():
        with strategy.scope():
            variables, loss_fn = step_time.instantiate(init, shape_loss_fn)
            opt = make_opt()
            opt.build(variables)  # Not on the first call of a tf.function.

        def replica_step(opt=opt, variables=variables, step=step,
                         loss_fn=loss_fn):
            return step(opt, variables, loss_fn, None)

        def fn(replica_step=replica_step):
            return strategy.reduce("SUM", strategy.run(replica_step),
                                   axis=None)

        if not eager:
            fn = tf.function(fn)
        for _ in range(3):
            fn().numpy()
        fns[name] = fn
    return _ratios(step_time.interleaved_samples(fns, rounds, round_seconds), {})


def _table(results):
    names = list(next(iter(results.values())))
    lines = ["| variant | " + " | ".join(f"{s} {m}" for s, m in results) + " |",
             "|---|" + "---|" * len(results)]
    for name in names:
        cells = []
        for row in results.values():
            seconds, ratio, ops = row[name]
            ops = "" if ops is None else f", {ops} ops"
            cells.append(f"{ratio:.2f}× ({seconds * 1e3:.2f} ms{ops})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--round-seconds", type=float, default=0.1)
    parser.add_argument("--mirrored", action="store_true")
    parser.add_argument("--eager", action="store_true",
                        help="with --mirrored: an eager loop (strategy.run "
                        "outside tf.function)")
    parser.add_argument("--shapes", nargs="*")
    parser.add_argument("--variants", nargs="*", default=(),
                        help="only variants whose name contains one of "
                        "these (and bare)")
    parser.add_argument("--modes", nargs="*",
                        default=["tf.function", "jit_compile"])
    parser.add_argument("--output",
                        help="also write the table into this page "
                        "(docs/performance.md)")
    parser.add_argument("--marker",
                        help="the block of --output to write (default: "
                        "ablation, mirrored or mirrored_eager)")
    args = parser.parse_args()
    results = {}
    if args.mirrored:
        for shape in args.shapes or MIRRORED_SHAPES:
            mode = "MirroredStrategy x2" + (", eager" if args.eager else "")
            results[(shape, mode)] = measure_mirrored(
                shape, args.rounds, args.round_seconds, args.eager)
            print(f"measured {shape}", flush=True)
    else:
        for shape in args.shapes or SHAPES:
            for mode in args.modes:
                jit_compile = mode == "jit_compile"
                results[(shape, mode)] = measure(shape, jit_compile,
                                                 args.rounds,
                                                 args.round_seconds,
                                                 args.variants)
                print(f"measured {shape}, {mode}", flush=True)
    table = _table(results)
    print(table)
    if args.output:
        marker = "ablation"
        if args.mirrored:
            marker = "mirrored_eager" if args.eager else "mirrored"
        step_time.write_block(args.output, args.marker or marker, table)


if __name__ == "__main__":
    main()
