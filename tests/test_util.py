"""Helpers shared by the tests."""

import functools

import keras
import tensorflow as tf
from absl.testing import parameterized

EAGER_AND_FUNCTION = parameterized.named_parameters(
    ("eager", False), ("tf_function", True)
)


def maybe_function(fn, use_tf_function):
    return tf.function(fn) if use_tf_function else fn


@functools.cache
def mirrored_strategy():
    """One MirroredStrategy over the two logical CPUs for the whole run.

    Every MirroredStrategy numbers its collectives from the same start, so
    two instances in one process can pair up unrelated collectives ("Shape
    mismatch in the collective instance"). Sharing one avoids that, so
    import this module as `import test_util` everywhere: `from tests import
    test_util` would be a second module with a second strategy.
    """
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def default_strategy():
    return tf.distribute.get_strategy()


@functools.cache
def one_device_strategy():
    return tf.distribute.OneDeviceStrategy("/cpu:0")


STRATEGIES = {
    "default": default_strategy,
    "one_device": one_device_strategy,
    "mirrored": mirrored_strategy,
}


def strategy_and_mode_cases(prefix=""):
    """Named-parameter dicts for every strategy, eagerly and in tf.function."""
    for strategy_name in STRATEGIES:
        for use_tf_function in (False, True):
            mode = "tf_function" if use_tf_function else "eager"
            yield {
                "testcase_name": f"{prefix}{strategy_name}_{mode}",
                "strategy_name": strategy_name,
                "use_tf_function": use_tf_function,
            }


def local_values(strategy, value):
    """NumPy values of every replica's copy of `value` (Keras variables too)."""
    # Duck-typed: Keras variables and tf.Variables share no base class.
    if not isinstance(value, tf.Variable) and hasattr(value, "value"):
        value = value.value
    return [v.numpy() for v in strategy.experimental_local_results(value)]


def assert_same_state_as_tf_keras(test, opt, var_list, ref, ref_vars,
                                   use_tf_function, strategy=None):
    """Asserts variables and inner slots of `opt` and tf_keras's `ref` bit-equal.

    Eagerly, tf_keras creates slots at the first applied step, tf_lso at the
    first step (docs/migration.md). Until then they hold their initial
    values. With a `strategy`, every replica's copy is compared.
    """
    strategy = strategy or tf.distribute.get_strategy()
    expected = ref_vars + ref.inner_optimizer.variables()
    actual = var_list + opt.inner_optimizer.variables()
    if len(actual) > len(expected):
        test.assertFalse(use_tf_function)
        test.assertLen(expected, len(var_list) + 1)  # + iterations.
        for slot in actual[len(expected):]:
            for local in local_values(strategy, slot):
                test.assertAllEqual(local, tf.zeros_like(local))
        actual = actual[:len(expected)]
    test.assertLen(actual, len(expected))
    for a, e in zip(actual, expected):
        for a_local, e_local in zip(local_values(strategy, a),
                                    local_values(strategy, e)):
            test.assertAllEqual(a_local, e_local, msg=a.name)


def replica_id():
    """The current replica id as an int32 tensor (0 without a strategy)."""
    return tf.cast(
        tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int32
    )


def value_on_replica_0(value, elsewhere):
    """`value` on replica 0, `elsewhere` on the others (float32)."""
    return tf.where(tf.equal(replica_id(), 0), value, elsewhere)


def create_identity_with_grad_check_fn(expected_gradient):
    """An identity op whose backward pass asserts the incoming gradient.

    Proves that a loss really was scaled: the gradient that reaches this
    point is the loss scale times the true gradient.
    """

    @tf.custom_gradient
    def identity(x):
        def grad(dx):
            tf.debugging.assert_equal(
                dx,
                tf.cast(expected_gradient, dx.dtype),
                message="unexpected gradient reached the loss",
            )
            return dx

        return tf.identity(x), grad

    return identity


def num(value):
    """A scalar's value as a Python number; works on mirrored variables too."""
    return tf.convert_to_tensor(value).numpy().item()


def keras_has_gradient_accumulation():
    """Whether Keras 3 optimizers take `gradient_accumulation_steps` (3.4+)."""
    import inspect

    return "gradient_accumulation_steps" in inspect.signature(
        keras.optimizers.SGD).parameters


def _settings(opt):
    """What a loss scale optimizer is, beyond its variables."""
    loss_scale = opt._loss_scale
    return (type(opt), type(opt.inner_optimizer), type(loss_scale),
            loss_scale.get_config(), opt.dynamic, opt.initial_scale,
            opt.dynamic_growth_steps, opt.get_config())


def _training(opt):
    """Three eager steps of `opt` on a new variable (the second skipped),
    and the state after each."""
    var = tf.Variable([5.0, 6.0])
    states = []
    for grad in (1.0, float("nan"), 2.0):
        opt.apply_gradients([(tf.fill([2], grad), var)])
        counter = opt.dynamic_counter
        states.append((var.numpy().tolist(), num(opt.iterations),
                       float(tf.convert_to_tensor(opt.loss_scale)),
                       None if counter is None else num(counter),
                       num(opt.skipped_steps)))
    return states


def assert_rebuilds_alike(opt, classes):
    """`cls.from_config(opt.get_config())` is `opt` again for each class:
    equal in config, attributes and training steps (issue 59). Trains
    `opt`."""
    rebuilt = {cls: cls.from_config(opt.get_config()) for cls in classes}
    settings = _settings(opt)
    for cls, other in rebuilt.items():
        assert _settings(other) == settings, (cls, _settings(other))
    steps = _training(opt)
    for cls, other in rebuilt.items():
        assert _training(other) == steps, cls


class _OptionalTfKeras:
    """`tf_keras`, imported when first used; skips the test if it is missing.

    A test module that needs tf_keras for some tests only uses this, so that
    its other tests still run without tf_keras.
    """

    def __getattr__(self, name):
        if name.startswith("__"):  # pytest's collection probes these.
            raise AttributeError(name)
        try:
            import tf_keras
        except ImportError:
            import pytest

            pytest.skip("needs tf_keras (pip install tf-keras)")
        return getattr(tf_keras, name)


tf_keras = _OptionalTfKeras()
