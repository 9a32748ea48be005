"""What the opt-in gradient report costs per training step (issue 43).

    .venv/bin/python benchmarks/gradient_report.py [--rounds N]
        [--round-seconds S] [--inner keras|legacy]

Times, in one process with interleaved rounds, the TF 2.x-protocol step of
`compare_revisions.py` (get_scaled_loss, get_unscaled_gradients,
apply_gradients of SGD with momentum, in a tf.function) with three
optimizers over copies of the same variables:

- `off`: the report off, as every optimizer starts (nothing in the step);
- `on`: the report on (as `LossScaleMonitor(gradient_report_freq=N)` turns
  it on) but not requested: what every step between two reports pays;
- `every step`: on and requested at every step: what a reported step pays
  (the flag set from the host and the report computed and stored on
  device; reading it back, which the monitor does once per report, is not
  included).

Reports the median step times and each one's ratio to `off` (the median of
the per-round ratios), and the ops in the traced step off and on. The loss
scale never overflows.
"""

import argparse
import os
import pathlib
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import compare_revisions  # noqa: E402


def _step(init, loss, inner, variant):
    import tensorflow as tf

    import tf_lso

    variables = [tf.Variable(a, dtype=tf.float32) for a in init]
    opt = tf_lso.LossScaleOptimizer(compare_revisions._sgd(inner))
    reports = opt._gradient_reports()
    reports.enabled = variant != "off"

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            scaled_loss = opt.get_scaled_loss(loss(variables))
        grads = opt.get_unscaled_gradients(
            tape.gradient(scaled_loss, variables))
        opt.apply_gradients(zip(grads, variables))

    def run():
        if variant == "every step":
            reports.requested.assign(True)
        step()

    for _ in range(5):
        run()
    run.ops = compare_revisions.op_count(step)
    return run


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--round-seconds", type=float, default=0.4)
    parser.add_argument("--inner", choices=("keras", "legacy"),
                        default="keras")
    args = parser.parse_args(argv)
    variants = ("off", "on", "every step")
    print("| model | off (ms) | on, not requested (ms) | ratio | "
          "every step (ms) | ratio | ops off | ops on |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (layers, width) in compare_revisions.MODELS.items():
        init, loss = compare_revisions._mlp(layers, width)
        steps = {v: _step(init, loss, args.inner, v) for v in variants}
        times = {v: [] for v in variants}
        for _ in range(args.rounds):
            for variant, step in steps.items():
                times[variant].append(
                    compare_revisions._median_step(step, args.round_seconds))
        medians = {v: statistics.median(times[v]) for v in variants}
        ratios = {v: statistics.median(
            t / base for t, base in zip(times[v], times["off"]))
            for v in variants}
        print(f"| {name} | {medians['off'] * 1e3:.3f} | "
              f"{medians['on'] * 1e3:.3f} | {ratios['on']:.3f} | "
              f"{medians['every step'] * 1e3:.3f} | "
              f"{ratios['every step']:.3f} | {steps['off'].ops} | "
              f"{steps['on'].ops} |")


if __name__ == "__main__":
    main()
