"""tf_lso demo: a small mixed_float16 training run showing the loss scale work.

Trains a small MLP for 300 steps with a TF 2.x style custom loop
(`get_scaled_loss` / `get_unscaled_gradients` / `apply_gradients`) and TF
2.4's `LossScaleOptimizer`. Every 60 steps, starting at step 45, a batch is
blown up so that float16 overflows: that step is skipped (weights untouched,
`opt.skipped_steps` counts it) and the loss scale halves. Between overflows
the scale grows again every 20 finite steps.

    python examples/demo.py             # TensorFlow's start-up notices hidden
    python examples/demo.py --tf-logs   # shown

With `--gradient-report` it also shows what the loss scale is for: at steps
1, 150 and 300 it reports (`opt.gradient_report`) how that step's gradients
sit in float16's range at the dynamic loss scale and, for the same batch
and weights, at a loss scale of 1: the share of elements that are 0, the
share below float16's smallest normal, and the headroom (doublings left
for the largest element).

    python examples/demo.py --gradient-report
"""

import contextlib
import os
import sys


@contextlib.contextmanager
def tensorflow_notices_silenced():
    """Points stderr at /dev/null while TensorFlow logs its start-up notices.

    TensorFlow 2.21 logs them (oneDNN, CUDA, CPU features, float16 kernels)
    through absl, before or regardless of TF_CPP_MIN_LOG_LEVEL
    (tensorflow/tensorflow#100442). Errors still show: they are raised after
    stderr is restored. Run with --tf-logs to see the notices.
    """
    if "--tf-logs" in sys.argv:
        yield
        return
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
with tensorflow_notices_silenced():
    import tensorflow as tf

    tf.constant(0.0) + 1.0  # The first op logs the device notices.

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_lso  # noqa: E402

STEPS = 300
OVERFLOW_STEPS = set(range(45, STEPS, 60))


def main():
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = keras.Sequential([
        keras.Input((16,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(1, dtype="float32"),
    ])
    opt = tf_lso.LossScaleOptimizer(
        keras.optimizers.Adam(1e-3), initial_scale=2**10,
        dynamic_growth_steps=20,
    )

    rng = np.random.default_rng(0)
    true_w = rng.normal(size=(16, 1)).astype("float32")

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
            scaled_loss = opt.get_scaled_loss(loss)
        grads = opt.get_unscaled_gradients(
            tape.gradient(scaled_loss, model.trainable_variables)
        )
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    reports = []
    if "--gradient-report" in sys.argv:
        report = gradient_reporter(model, opt)

    print(f"{'step':>5} {'loss scale':>11} {'skipped':>8} {'loss':>10}")
    for step in range(1, STEPS + 1):
        x = rng.normal(size=(64, 16)).astype("float32")
        y = x @ true_w
        if step in OVERFLOW_STEPS:
            x = x * 1e4  # float16 activations overflow: a non-finite step.
        if "--gradient-report" in sys.argv and step in REPORT_STEPS:
            with tensorflow_notices_silenced():  # Tracing logs notices.
                reports.append((step, *report(tf.constant(x),
                                              tf.constant(y))))
        if step == 1:  # Tracing logs float16 kernel notices.
            with tensorflow_notices_silenced():
                loss = train_step(tf.constant(x), tf.constant(y))
        else:
            loss = train_step(tf.constant(x), tf.constant(y))
        if step % 15 == 0 or step in OVERFLOW_STEPS:
            mark = "  <- overflow, step skipped" if step in OVERFLOW_STEPS else ""
            print(f"{step:>5} {float(opt.loss_scale):>11.0f} "
                  f"{int(opt.skipped_steps.numpy()):>8} "
                  f"{float(loss):>10.4g}{mark}")
    print(f"done: {int(opt.iterations.numpy())} iterations, "
          f"{int(opt.skipped_steps.numpy())} skipped, "
          f"final loss scale {float(opt.loss_scale):.0f}")
    if reports:
        print_reports(reports)


REPORT_STEPS = (1, 150, 300)


def gradient_reporter(model, opt):
    """A function of a batch: its gradient reports at opt's scale and at 1.

    The gradients are computed as the training step computes them (float16
    layers, the loss scaled), once with `opt`'s current scale and once with
    a fixed scale of 1, and neither is applied.
    """
    at_one = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(), dynamic=False,
                                       initial_scale=1)

    def gradients_with(optimizer):
        @tf.function
        def gradients(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x) - y))
                scaled_loss = optimizer.get_scaled_loss(loss)
            return optimizer.get_unscaled_gradients(
                tape.gradient(scaled_loss, model.trainable_variables))

        return gradients

    dynamic_gradients, gradients_at_one = map(gradients_with, (opt, at_one))

    def report(x, y):
        variables = model.trainable_variables
        return (opt.gradient_report(dynamic_gradients(x, y), variables),
                at_one.gradient_report(gradients_at_one(x, y), variables))

    return report


def print_reports(reports):
    """The reports' totals, then the last step's per variable."""
    print("\ngradients in float16's range (zero / below 2**-14 / headroom "
          "in doublings):")
    print(f"{'step':>5} {'loss scale':>11} {'zero':>7} {'below':>7} "
          f"{'room':>5} | {'scale 1:':>8} {'zero':>7} {'below':>7} "
          f"{'room':>5}")
    for step, dynamic, at_one in reports:
        print(f"{step:>5} {dynamic.loss_scale:>11.0f} "
              f"{float(dynamic.total_zero_share):>7.2%} "
              f"{float(dynamic.total_below_normal_share):>7.2%} "
              f"{float(dynamic.min_headroom):>5.0f} | {'':>8} "
              f"{float(at_one.total_zero_share):>7.2%} "
              f"{float(at_one.total_below_normal_share):>7.2%} "
              f"{float(at_one.min_headroom):>5.0f}")
    step, dynamic, at_one = reports[-1]
    print(f"\nstep {step}, per variable:")
    for i, name in enumerate(dynamic.variables):
        print(f"  {name:<26} {dynamic.zero_share[i]:>7.2%} "
              f"{dynamic.below_normal_share[i]:>7.2%} "
              f"{dynamic.headroom[i]:>5.0f} | {'':>8} "
              f"{at_one.zero_share[i]:>7.2%} "
              f"{at_one.below_normal_share[i]:>7.2%} "
              f"{at_one.headroom[i]:>5.0f}")


if __name__ == "__main__":
    main()
