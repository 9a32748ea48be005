"""Pins the public API of tf_lso and runs every docstring example."""

import doctest
import importlib

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_lso
from tf_lso._src.legacy_api import install
from tf_lso._src.legacy_api import policy
from tf_lso._src.optimizer import callbacks
from tf_lso._src.optimizer import experimental_loss_scale_optimizer
from tf_lso._src.optimizer import gradient_report
from tf_lso._src.optimizer import loss_scale_optimizer
from tf_lso._src.scaling import loss_scale
from tf_lso._src.scaling import serialization

PUBLIC = {
    "tf_lso": {"GradientReport", "LossScaleOptimizer", "LossScalingWarning",
               "Overflow", "callbacks", "experimental", "install",
               "uninstall"},
    "tf_lso.callbacks": {"LossScaleMonitor"},
    "tf_lso.experimental": {
        "DynamicLossScale", "FixedLossScale", "LossScale",
        "LossScaleOptimizer", "Policy", "deserialize",
        "disable_mixed_precision_graph_rewrite",
        "enable_mixed_precision_graph_rewrite", "get",
        "get_layer_policy", "global_policy", "serialize", "set_policy",
    },
}
DOCTESTED_MODULES = [
    callbacks, experimental_loss_scale_optimizer, gradient_report, install,
    loss_scale, loss_scale_optimizer, policy, serialization,
]


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_public_names(module_name):
    module = importlib.import_module(module_name)
    assert set(module.__all__) == PUBLIC[module_name]
    for name in module.__all__:
        assert getattr(module, name).__doc__, f"{module_name}.{name}"


def test_version():
    assert isinstance(tf_lso.__version__, str)
    assert tf_lso.__version__[0].isdigit()


def test_public_methods_have_docstrings():
    for cls in (tf_lso.LossScaleOptimizer, tf_lso.experimental.LossScaleOptimizer,
                tf_lso.experimental.DynamicLossScale,
                tf_lso.experimental.FixedLossScale,
                tf_lso.experimental.Policy,
                tf_lso.callbacks.LossScaleMonitor):
        for name, member in vars(cls).items():
            if name.startswith("_") or not callable(member):
                continue
            assert member.__doc__, f"{cls.__name__}.{name}"


@pytest.mark.parametrize(
    "module", DOCTESTED_MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1]
)
def test_docstring_examples(module):
    globs = {"tf": tf, "tf_lso": tf_lso, "keras": keras, "np": np}
    result = doctest.testmod(
        module, extraglobs=globs,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        verbose=False,
    )
    assert result.attempted > 0, f"{module.__name__} has no examples"
    assert result.failed == 0
