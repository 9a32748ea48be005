"""Plot the loss scale, the loss and the skipped steps of a training run.

Trains a small mixed_float16 model with `tf_lso.LossScaleOptimizer` in a
custom loop. Batches 60-64 and every 50th batch after 100 have huge targets,
so their float16 gradients overflow: those steps are skipped and the scale
halves; between them it doubles every 20 finite steps. Saves a PNG: the loss
scale as a step curve on a log2 axis with the skipped steps marked on it, and
the loss. Prints what `opt.last_overflow` says about the last skipped step,
and where the PNG went (by default the system's temporary directory).

Needs matplotlib: `pip install "tf_lso[examples]"`.

    python examples/plot_training_health.py

`--output PATH` saves the PNG elsewhere, `--steps N` trains longer or
shorter. `--gradient-report` adds two panels below them: at every step,
the share of gradient elements below float16's smallest normal at the loss
scale, and the headroom (doublings left for the largest element), from
`opt.gradient_report` (docs/training_health.md):

    python examples/plot_training_health.py --gradient-report
"""

import argparse
import math
import os
import tempfile

# The demo's helper: TensorFlow's start-up notices stay hidden unless
# --tf-logs is given. Importing the demo imports TensorFlow (quietly).
from demo import tensorflow_notices_silenced


def _bad(step):
    return 60 <= step < 65 or (step > 100 and step % 50 == 0)


def train(steps, gradient_report=False):
    """Runs the training.

    Args:
        steps: How many steps.
        gradient_report: Whether to report every step's gradients.

    Returns:
        (the loss scale each step was taken with, whether each step was
        skipped, each step's loss, the optimizer, and with
        `gradient_report` each step's (below-normal share, headroom), else
        None).
    """
    import keras
    import numpy as np
    import tensorflow as tf

    import tf_lso

    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([
            keras.Input((16,)),
            keras.layers.Dense(64, activation="relu", name="hidden"),
            keras.layers.Dense(1, name="out", dtype="float32"),
        ])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1e-3),
                                    initial_scale=2**12,
                                    dynamic_growth_steps=20)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 16)).astype("float32")
    y = x.sum(axis=1, keepdims=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
            scaled_loss = opt.get_scaled_loss(loss)
        grads = opt.get_unscaled_gradients(
            tape.gradient(scaled_loss, model.trainable_variables))
        report = ()
        if gradient_report:  # At the scale this step is taken with.
            totals = opt.gradient_report(grads)
            report = (totals.total_below_normal_share, totals.min_headroom)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss, report

    scales, skipped, losses, reports = [], [], [], []
    for step in range(steps):
        scales.append(float(opt.loss_scale))
        before = int(opt.skipped_steps.numpy())
        if step == 0:  # Tracing logs kernel notices.
            with tensorflow_notices_silenced():
                loss, report = train_step(x, y)
        else:
            loss, report = train_step(x, y * (6e4 if _bad(step) else 1.0))
        skipped.append(int(opt.skipped_steps.numpy()) > before)
        losses.append(float(loss))
        reports.append(tuple(float(value) for value in report))
    return scales, skipped, losses, opt, reports if gradient_report else None


def figure(scales, skipped, losses, reports=None):
    """The plot, as a matplotlib Figure with two axes: scale and loss.

    Args:
        scales: The loss scale each step was taken with.
        skipped: Whether each step was skipped.
        losses: Each step's loss.
        reports: None, or each step's (below-normal share, headroom): two
            more axes show them, the share and the headroom.
    """
    try:
        import matplotlib
    except ImportError as e:
        raise SystemExit(
            f"This example plots with matplotlib, which is missing ({e}). "
            "Install it with `pip install \"tf_lso[examples]\"`."
        ) from e
    matplotlib.use("Agg")
    from matplotlib import pyplot

    steps = range(len(scales))
    bad = [step for step in steps if skipped[step]]
    result, axes = pyplot.subplots(2 if reports is None else 4, 1,
                                   sharex=True,
                                   figsize=(11, 6 if reports is None else 10))
    top, bottom = axes[:2]
    result.suptitle(f"Loss scaling over {len(scales)} steps: {len(bad)} "
                    "skipped for non-finite gradients")
    # A step curve: the scale only ever jumps (x2 after a run of finite
    # steps, /2 at a skipped step), so a line would draw false slopes.
    top.step(steps, scales, where="post", label="loss scale")
    top.plot(bad, [scales[step] for step in bad], "x", color="C3",
             markersize=8, label="skipped step (scale then halved)")
    top.set_yscale("log", base=2)
    top.set_ylabel("loss scale (log2)")
    bottom.plot(steps, losses, color="C2", label="loss")
    bottom.plot(bad, [losses[step] for step in bad], "x", color="C3",
                markersize=8, label="skipped step")
    bottom.set_yscale("log")
    bottom.set_ylabel("loss (log)")
    if reports is not None:
        _report_axes(axes[2], axes[3], steps, reports)
    axes[-1].set_xlabel("step")
    for axis in axes:  # Beside the panel, never on the data.
        axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1),
                    borderaxespad=0)
    result.tight_layout()
    return result


def _report_axes(share_axis, headroom_axis, steps, reports):
    """The gradient reports: the below-normal share, and the headroom."""
    below = [100 * share for share, _ in reports]
    # A share of 0 lies on the axis's bottom edge: drawn over it.
    share_axis.plot(steps, below, color="C1", clip_on=False, linewidth=2,
                    zorder=3,
                    label="gradient elements\nbelow $2^{-14}$, float16's\n"
                    "smallest normal")
    share_axis.set_ylabel("below float16 normal (%)")
    # A share starts at 0; a share of 0 everywhere gets a 0-1 % axis.
    share_axis.set_ylim(0, max(1.0, 1.1 * max(below, default=0.0)))
    headroom = [room for _, room in reports]
    headroom_axis.step(steps, headroom, where="post", color="C0",
                       label="headroom: doublings\nleft for the largest\n"
                       "element")
    headroom_axis.axhline(0, color="0.3", linestyle="--", linewidth=1,
                          label="0: at float16's maximum\n(below 0: beyond it)")
    headroom_axis.set_ylabel("headroom (doublings)")
    finite = [room for room in headroom if math.isfinite(room)]
    low, high = min(finite + [0.0]), max(finite + [0.0])
    headroom_axis.set_ylim(low - 1, high + 1)
    # An overflowed gradient has no headroom (-inf), which a line leaves
    # out: a marker on the panel's floor shows the step.
    overflowed = [step for step, room in zip(steps, headroom)
                  if not math.isfinite(room)]
    if overflowed:
        headroom_axis.plot(overflowed, [low - 1] * len(overflowed), "v",
                           color="C3", clip_on=False, zorder=3,
                           label="overflowed: no\nheadroom (−∞)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument(
        "--output",
        default=os.path.join(tempfile.gettempdir(),
                             "tf_lso_training_health.png"),
        help="where to save the PNG (default: %(default)s)")
    parser.add_argument("--tf-logs", action="store_true",
                        help="show TensorFlow's start-up notices")
    parser.add_argument("--gradient-report", action="store_true",
                        help="add a panel with every step's gradient report")
    args = parser.parse_args(argv)
    scales, skipped, losses, opt, reports = train(args.steps,
                                                  args.gradient_report)
    figure(scales, skipped, losses, reports).savefig(args.output)
    print(f"final loss scale {float(opt.loss_scale):g}, skipped steps "
          f"{sum(skipped)}")
    print(f"last overflow: {opt.last_overflow}")
    print(f"saved the plot to {os.path.abspath(args.output)}")


if __name__ == "__main__":
    main()
