"""How many ops one traced training step has: bare, and with tf_lso.

    .venv/bin/python benchmarks/traced_ops.py [--layers 100] [--width 32]
    PYTHONPATH=/path/to/other/checkout .venv/bin/python benchmarks/traced_ops.py

Traces one step of a custom loop (TF 2.x protocol: `get_scaled_loss`,
`get_unscaled_gradients`, `apply_gradients`) and one of Keras 3's protocol
(`scale_loss`, then `apply_gradients` with scaled gradients) on an MLP of
`--layers` dense layers of `--width` units, and counts the ops of the traced
graph, those of the functions it calls (cond branches that are not lowered)
included. The count is exact and machine-independent, so two revisions
compare by running this file under each (`PYTHONPATH`). Step time is
`compare_revisions.py`'s job; this file says where a change in it can come
from.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_lso  # noqa: E402


def _variables(layers, width):
    variables = []
    for i in range(layers):
        variables.append(tf.Variable(tf.random.normal([width, width]) * 0.1,
                                     name=f"kernel_{i}"))
        variables.append(tf.Variable(tf.zeros([width]), name=f"bias_{i}"))
    return variables


def _loss(variables, x):
    for kernel, bias in zip(variables[::2], variables[1::2]):
        x = tf.nn.relu(x @ kernel + bias)
    return tf.reduce_mean(tf.square(x))


def count_ops(fn, *args):
    """Ops in `fn`'s traced graph and in the functions the graph calls."""
    graph_def = fn.get_concrete_function(*args).graph.as_graph_def()
    return len(graph_def.node) + sum(
        len(function.node_def) for function in graph_def.library.function)


def steps(make_optimizer, variables):
    """The two protocols' steps (tf.functions) for a fresh optimizer."""
    opt = make_optimizer()
    opt.build(variables)

    @tf.function
    def tf2_protocol(x):
        with tf.GradientTape() as tape:
            loss = _loss(variables, x)
            if hasattr(opt, "get_scaled_loss"):
                loss = opt.get_scaled_loss(loss)
        grads = tape.gradient(loss, variables)
        if hasattr(opt, "get_unscaled_gradients"):
            grads = opt.get_unscaled_gradients(grads)
        opt.apply_gradients(zip(grads, variables))

    @tf.function
    def keras3_protocol(x):
        with tf.GradientTape() as tape:
            loss = _loss(variables, x)
            if hasattr(opt, "scale_loss"):
                loss = opt.scale_loss(loss)
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))

    return tf2_protocol, keras3_protocol


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=100)
    parser.add_argument("--width", type=int, default=32)
    args = parser.parse_args()
    x = tf.random.normal([8, args.width])
    candidates = {
        "bare SGD": lambda: keras.optimizers.SGD(0.01, momentum=0.9),
        "tf_lso dynamic": lambda: tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(0.01, momentum=0.9)),
        "tf_lso fixed": lambda: tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(0.01, momentum=0.9), dynamic=False,
            initial_scale=128),
    }
    print(f"MLP {args.layers} x {args.width}; tf_lso from "
          f"{os.path.dirname(tf_lso.__file__)}")
    print(f"{'optimizer':16} {'TF 2.x protocol':>16} {'Keras 3 protocol':>17}")
    for name, make in candidates.items():
        tf2, keras3 = steps(make, _variables(args.layers, args.width))
        print(f"{name:16} {count_ops(tf2, x):16d} {count_ops(keras3, x):17d}")


if __name__ == "__main__":
    main()
