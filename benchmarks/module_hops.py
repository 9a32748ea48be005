"""How many tf_lso modules one gradient passes through in `apply_gradients`.

    .venv/bin/python benchmarks/module_hops.py [--verbose]
    PYTHONPATH=/path/to/other/checkout .venv/bin/python benchmarks/module_hops.py

Traces (with `sys.setprofile`) one eager `apply_gradients` of a
`tf_lso.LossScaleOptimizer` around Keras 3's SGD, one variable, after a first
step that built everything, and counts the calls that go from one tf_lso
module into another (a "hop"), and the modules visited. TensorFlow's and
Keras's own frames are not counted (a call through them into tf_lso counts
from the last tf_lso module), and which module made each call.
`--verbose` prints every hop.
"""

import argparse
import collections
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_lso  # noqa: E402


def _module(frame):
    name = frame.f_globals.get("__name__", "")
    return name if name.startswith("tf_lso") else None


def hops(fn):
    """The (caller module, callee module, callee function) of each hop."""
    found = []
    stack = []

    def profile(frame, event, arg):
        del arg
        if event == "call":
            module = _module(frame)
            last = next((m for m in reversed(stack) if m is not None), None)
            if module is not None and last is not None and module != last:
                found.append((last, module, frame.f_code.co_name))
            stack.append(module)
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    var = tf.Variable([1.0, 2.0])
    opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    grads = [tf.constant([0.5, 0.25])]
    opt.apply_gradients(zip(grads, [var]))  # Builds everything.
    found = hops(lambda: opt.apply_gradients(zip(grads, [var])))
    # The entry into tf_lso (apply_gradients itself) is not a hop.
    modules = {callee for _, callee, _ in found} | {
        caller for caller, _, _ in found}
    if args.verbose:
        for caller, callee, function in found:
            print(f"{caller} -> {callee}.{function}")
    print(f"tf_lso from {os.path.dirname(tf_lso.__file__)}: "
          f"{len(found)} hops between {len(modules)} modules")
    callers = collections.Counter(caller.rsplit(".", 1)[-1]
                                  for caller, _, _ in found)
    print("hops made by each module:", ", ".join(
        f"{name} {count}" for name, count in callers.most_common()))


if __name__ == "__main__":
    main()
