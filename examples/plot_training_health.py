"""Plot the loss scale and skipped steps of a training run that overflows.

Trains a small mixed_float16 model with `tf_lso.LossScaleOptimizer` in a
custom loop. Batches 60-64 and every 50th batch after 100 have huge targets,
so their float16 gradients overflow: those steps are skipped and the scale
halves; between them it doubles every 20 finite steps. Saves a PNG with the
loss scale (log scale) and the skipped-step count per step, and prints what
`opt.last_overflow` says about the last skipped step.

Needs matplotlib: `pip install "tf_lso[examples]"`.

    python examples/plot_training_health.py --steps 300 --output health.png
"""

import argparse

# The demo's helper: TensorFlow's start-up notices stay hidden unless
# --tf-logs is given. Importing the demo imports TensorFlow (quietly).
from demo import tensorflow_notices_silenced


def _bad(step):
    return 60 <= step < 65 or (step > 100 and step % 50 == 0)


def train(steps):
    """Runs the training; returns (loss scales, skipped counts, optimizer)."""
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
        opt.apply_gradients(zip(grads, model.trainable_variables))

    scales, skipped = [], []
    for step in range(steps):
        if step == 0:  # Tracing logs kernel notices.
            with tensorflow_notices_silenced():
                train_step(x, y)
        else:
            train_step(x, y * (6e4 if _bad(step) else 1.0))
        scales.append(float(opt.loss_scale))
        skipped.append(int(opt.skipped_steps.numpy()))
    return scales, skipped, opt


def plot(scales, skipped, output):
    """Saves the two curves to `output` (a PNG) with matplotlib."""
    try:
        import matplotlib
    except ImportError as e:
        raise SystemExit(
            f"This example plots with matplotlib, which is missing ({e}). "
            "Install it with `pip install \"tf_lso[examples]\"`."
        ) from e
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, (top, bottom) = pyplot.subplots(2, 1, sharex=True,
                                            figsize=(8, 5))
    top.semilogy(scales, base=2)
    top.set_ylabel("loss scale")
    bottom.step(range(len(skipped)), skipped, where="post", color="C3")
    bottom.set_ylabel("skipped steps")
    bottom.set_xlabel("step")
    figure.tight_layout()
    figure.savefig(output)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--output", default="training_health.png")
    parser.add_argument("--tf-logs", action="store_true",
                        help="show TensorFlow's start-up notices")
    args = parser.parse_args(argv)
    scales, skipped, opt = train(args.steps)
    plot(scales, skipped, args.output)
    print(f"final loss scale {scales[-1]:g}, skipped steps {skipped[-1]}")
    print(f"last overflow: {opt.last_overflow}")
    print(f"saved {args.output}")


if __name__ == "__main__":
    main()
