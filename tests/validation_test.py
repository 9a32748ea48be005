"""Tests for tf_lso._src.scaling.validation: scales judged as float32, step counts."""

import inspect

import numpy as np
import pytest

import tf_lso
from tf_lso._src.scaling import validation

F32_MAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("value", [1, 2.5, 2**15, 0.5, 2.0**-126, F32_MAX,
                                   np.float32(4.0), np.int64(3)])
def test_scale_accepts_usable_float32_values(value):
    assert validation.scale(value, "initial_scale") == float(value)


@pytest.mark.parametrize("value, error, message", [
    ("8", TypeError, r"`initial_scale` must be a number. Received: "
                     r"initial_scale='8' of type str"),
    (True, TypeError, "must be a number"),
    (None, TypeError, "must be a number"),
    (0, ValueError, "must be positive and finite. Received: initial_scale=0."),
    (-2.0, ValueError, "positive and finite"),
    (float("inf"), ValueError, "positive and finite"),
    (float("nan"), ValueError, "Received: initial_scale=nan"),
    # Fine Python floats that a float32 variable cannot hold.
    (1e39, ValueError, r"initial_scale=1e\+39, which is inf as a float32"),
    (1e-50, ValueError, r"initial_scale=1e-50, which is 0.0 as a float32"),
    (1e-40, ValueError, r"which is 9.99994610111476e-41 as a float32"),
])
def test_scale_rejects(value, error, message):
    with pytest.raises(error, match=message):
        validation.scale(value, "initial_scale")


@pytest.mark.parametrize("value", [0.5, 1e39, float("inf"), float("nan")])
def test_scale_of_at_least_one(value):
    with pytest.raises(ValueError, match="`loss_scale_value` must be at least 1"):
        validation.scale(value, "loss_scale_value", minimum=1)


@pytest.mark.parametrize("value, expected", [
    (2, 2), (2.0, 2), (3., 3), (np.int64(5), 5), (np.float32(4.0), 4),
    (2**63 - 1, 2**63 - 1),
])
def test_integer_accepts_integral_values(value, expected):
    result = validation.integer(value, "dynamic_growth_steps")
    assert result == expected and type(result) is int


@pytest.mark.parametrize("value, error", [
    (2.5, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
    (2**63, ValueError), (1e30, ValueError), (0, ValueError), (-3.0, ValueError),
    (True, TypeError), ("3", TypeError), (None, TypeError),
])
def test_integer_rejects(value, error):
    # Every message names the argument, NaN and inf included.
    with pytest.raises(error, match="`dynamic_growth_steps` must be an integer"):
        validation.integer(value, "dynamic_growth_steps")


@pytest.mark.parametrize("make", [
    lambda v: tf_lso.LossScaleOptimizer(_sgd(), initial_scale=v),
    lambda v: tf_lso.LossScaleOptimizer(_sgd(), dynamic=False, initial_scale=v),
    lambda v: tf_lso.experimental.LossScaleOptimizer(_sgd(), v),
    lambda v: tf_lso.experimental.DynamicLossScale(v),
    lambda v: tf_lso.experimental.FixedLossScale(v),
])
@pytest.mark.parametrize("value", [1e39, 1e-50, float("inf")])
def test_constructors_look_at_the_float32_value(make, value):
    with pytest.raises(ValueError, match="Loss scales are float32"):
        make(value)


def test_integral_float_growth_steps_everywhere():
    opt = tf_lso.LossScaleOptimizer(_sgd(), dynamic_growth_steps=2.0)
    assert opt.dynamic_growth_steps == 2
    assert type(opt.dynamic_growth_steps) is int
    loss_scale = tf_lso.experimental.DynamicLossScale(increment_period=3.)
    assert loss_scale.increment_period == 3
    assert loss_scale.get_config()["increment_period"] == 3
    for make in (lambda v: tf_lso.LossScaleOptimizer(
                     _sgd(), dynamic_growth_steps=v),
                 lambda v: tf_lso.experimental.DynamicLossScale(
                     increment_period=v)):
        with pytest.raises(ValueError, match="must be an integer"):
            make(2.5)
        with pytest.raises(ValueError, match="must be an integer"):
            make(float("nan"))


def _sgd():
    import keras

    return keras.optimizers.SGD()


# Messages name the public classes, never tf_lso._src's (issue 51).


def test_experimental_optimizer_without_loss_scale_names_the_public_class():
    # TF 2.1-2.3's class was LossScaleOptimizer (TypeError, as Python's).
    with pytest.raises(TypeError) as error:
        tf_lso.experimental.LossScaleOptimizer(_sgd())
    assert str(error.value) == (
        "LossScaleOptimizer.__init__() missing 1 required positional "
        "argument: 'loss_scale'. tf_lso.experimental.LossScaleOptimizer("
        "optimizer, loss_scale) takes a loss scale: \"dynamic\" "
        "(recommended) or a number for a fixed one.")
    with pytest.raises(TypeError) as error:
        tf_lso.experimental.LossScaleOptimizer(loss_scale="dynamic")
    assert str(error.value).startswith(
        "LossScaleOptimizer.__init__() missing 1 required positional "
        "argument: 'optimizer'. ")
    with pytest.raises(TypeError) as error:
        tf_lso.experimental.LossScaleOptimizer()
    assert str(error.value).startswith(
        "LossScaleOptimizer.__init__() missing 2 required positional "
        "arguments: 'optimizer' and 'loss_scale'. ")


def test_experimental_optimizer_calls_that_do_not_fit_name_the_public_class():
    # Found by the issue 51 walk-through: Python's own messages named
    # LossScaleOptimizerV1.
    signature = (
        "it takes tf_lso.experimental.LossScaleOptimizer(optimizer, "
        "loss_scale, *, name=None, max_consecutive_skips=None, "
        "print_overflows=False, stop_on_nonfinite_loss=False).")
    with pytest.raises(TypeError) as error:
        tf_lso.experimental.LossScaleOptimizer(_sgd(), "dynamic",
                                               learning_rate=0.1)
    assert str(error.value) == (
        "LossScaleOptimizer.__init__() got an unexpected keyword argument "
        f"'learning_rate': {signature} Set `learning_rate` on the optimizer "
        "it wraps.")
    with pytest.raises(TypeError) as error:
        tf_lso.experimental.LossScaleOptimizer(_sgd(), "dynamic", "extra")
    assert str(error.value) == (
        f"LossScaleOptimizer.__init__() too many positional arguments: "
        f"{signature}")
    assert str(inspect.signature(tf_lso.experimental.LossScaleOptimizer)) == (
        "(optimizer: 'Any', loss_scale: 'Any', *, name: 'str | None' = None, "
        "max_consecutive_skips: 'int | None' = None, print_overflows: "
        "'bool' = False, stop_on_nonfinite_loss: 'bool' = False) -> 'None'")


def test_reprs_show_the_public_paths():
    opt = tf_lso.LossScaleOptimizer(_sgd())
    assert repr(opt) == f"<tf_lso.LossScaleOptimizer object at {id(opt):#x}>"
    v1 = tf_lso.experimental.LossScaleOptimizer(_sgd(), "dynamic")
    assert repr(v1) == (
        f"<tf_lso.experimental.LossScaleOptimizer object at {id(v1):#x}>")

    class Mine(tf_lso.LossScaleOptimizer):
        pass

    mine = Mine(_sgd())
    assert repr(mine) == (f"<{__name__}.{Mine.__qualname__} object at "
                          f"{id(mine):#x}>")


def test_learning_rate_on_the_wrapper_says_where_it_goes():
    # As Keras 3 says for clipnorm.
    with pytest.raises(ValueError) as error:
        tf_lso.LossScaleOptimizer(_sgd(), learning_rate=0.1)
    assert str(error.value) == (
        "LossScaleOptimizer does not support `learning_rate`. Instead, set "
        "`learning_rate` on the `inner_optimizer`. Received: "
        "learning_rate=0.1.")
