"""`tf_lso.install()` / `uninstall()`: the legacy names, resolved to tf_lso.

Old TF 2.1-2.4 scripts die on their first mixed-precision line on TF 2.16+,
because the names they use no longer exist. `install()` puts tf_lso's
classes and functions where those scripts look for them, and records what it
replaced so that `uninstall()` restores TensorFlow exactly as it was.
"""

from __future__ import annotations

import importlib
import sys
import types

import keras
import tensorflow as tf

from tf_lso._src import compile_hook
from tf_lso._src import experimental_loss_scale_optimizer as v1
from tf_lso._src import graph_rewrite
from tf_lso._src import loss_scale as loss_scale_lib
from tf_lso._src import loss_scale_optimizer as v2
from tf_lso._src import policy as policy_lib

_LOSS_SCALES = {
    "LossScale": loss_scale_lib.LossScale,
    "FixedLossScale": loss_scale_lib.FixedLossScale,
    "DynamicLossScale": loss_scale_lib.DynamicLossScale,
}

# tf.keras.mixed_precision.experimental of TF 2.1-2.4, plus the loss scale
# classes (a convenience: TF had them under tf.mixed_precision.experimental).
_KERAS_EXPERIMENTAL = {
    "LossScaleOptimizer": v1.LossScaleOptimizerV1,
    "Policy": policy_lib.Policy,
    "set_policy": policy_lib.set_policy,
    "global_policy": policy_lib.global_policy,
    "get_layer_policy": policy_lib.get_layer_policy,
    **_LOSS_SCALES,
}

# TF 2.1-2.3's graph rewrite (tf.train.experimental; TF 2.16+ keeps only
# the tf.compat.v1 names, for TF1 optimizers). tf_lso's takes Keras
# optimizers and hands TF1 ones to TensorFlow's.
_GRAPH_REWRITE = {
    "enable_mixed_precision_graph_rewrite":
        graph_rewrite.enable_mixed_precision_graph_rewrite,
    "disable_mixed_precision_graph_rewrite":
        graph_rewrite.disable_mixed_precision_graph_rewrite,
}

_MISSING = object()
_installed = []  # (owner, attribute, previous value or _MISSING)
_modules = []  # (sys.modules key, previous module or _MISSING)


def _module(name, attributes):
    module = types.ModuleType(name, "Legacy names provided by tf_lso.")
    for key, value in attributes.items():
        setattr(module, key, value)
    return module


def _set(owner, name, value):
    _installed.append((owner, name, getattr(owner, name, _MISSING)))
    setattr(owner, name, value)


def _register(name, module):
    _modules.append((name, sys.modules.get(name, _MISSING)))
    sys.modules[name] = module


def _keras_mixed_precision_modules():
    """Every module object a script can reach as tf.keras.mixed_precision.

    On TF 2.16+ `tf.keras.mixed_precision` is Keras 3's `keras.mixed_precision`,
    but `import tensorflow.keras.mixed_precision` (and `from ... import`) can
    load Keras's tf_keras facade (`keras/_tf_keras/keras/mixed_precision`) as
    a second module object; both must show the legacy names.
    """
    modules = [tf.keras.mixed_precision]
    imported = importlib.import_module("tensorflow.keras.mixed_precision")
    if imported is not modules[0]:
        modules.append(imported)
    return modules


def installed_names() -> list[str]:
    """The dotted names `install()` provides, for docs and tests."""
    names = [f"tf.keras.mixed_precision.experimental.{n}"
             for n in _KERAS_EXPERIMENTAL]
    names += [f"tf.mixed_precision.experimental.{n}" for n in _LOSS_SCALES]
    names += [f"tf.train.experimental.{n}" for n in _LOSS_SCALES]
    names.append("tf.keras.mixed_precision.LossScaleOptimizer")
    names += [f"tf.train.experimental.{n}" for n in _GRAPH_REWRITE]
    return names


def install() -> None:
    """Makes TF 2.1-2.4's mixed-precision names resolve to tf_lso.

    Explicit and idempotent. Afterwards these work as in TF 2.1-2.4:
    `tf.keras.mixed_precision.experimental.{LossScaleOptimizer, Policy,
    set_policy, global_policy, get_layer_policy, LossScale, FixedLossScale,
    DynamicLossScale}`, `tf.mixed_precision.experimental.{LossScale,
    FixedLossScale, DynamicLossScale}`, `tf.train.experimental.{LossScale,
    FixedLossScale, DynamicLossScale}`, and
    `tf.keras.mixed_precision.LossScaleOptimizer` with TF 2.4's signature
    (still a Keras 3 `LossScaleOptimizer`), and
    `tf.train.experimental.{enable, disable}_mixed_precision_graph_rewrite`
    (Keras optimizers; TF1 ones go to TensorFlow's own). `from
    tensorflow.keras.mixed_precision import experimental` works too.
    `model.compile` under a `'mixed_float16'` policy then wraps the optimizer
    in `tf_lso.LossScaleOptimizer` instead of Keras 3's class.

    >>> tf_lso.install()
    >>> tf.keras.mixed_precision.experimental.LossScaleOptimizer
    <class 'tf_lso._src.experimental_loss_scale_optimizer.LossScaleOptimizerV1'>
    >>> tf_lso.uninstall()
    >>> hasattr(tf.keras.mixed_precision, "experimental")
    False
    """
    if _installed:
        return
    experimental = _module("tensorflow.keras.mixed_precision.experimental",
                           _KERAS_EXPERIMENTAL)
    for keras_mp in _keras_mixed_precision_modules():
        _set(keras_mp, "experimental", experimental)
        _set(keras_mp, "LossScaleOptimizer", v2.LossScaleOptimizer)
    _register("tensorflow.keras.mixed_precision.experimental", experimental)

    tf_mp = getattr(tf, "mixed_precision", None)
    if tf_mp is None:
        tf_mp = _module("tensorflow.mixed_precision", {})
        _set(tf, "mixed_precision", tf_mp)
        _register("tensorflow.mixed_precision", tf_mp)
    tf_mp_experimental = _module("tensorflow.mixed_precision.experimental",
                                 _LOSS_SCALES)
    _set(tf_mp, "experimental", tf_mp_experimental)
    _register("tensorflow.mixed_precision.experimental", tf_mp_experimental)

    for name, value in {**_LOSS_SCALES, **_GRAPH_REWRITE}.items():
        _set(tf.train.experimental, name, value)

    compile_hook.enable(wrap_mixed_float16=True)


def uninstall() -> None:
    """Undoes `install()`: TensorFlow's names are as they were before.

    The `keras.Model.compile` hook is removed too, unless a tf_lso
    `Policy` is the global policy (it still needs it).
    """
    while _installed:
        owner, name, previous = _installed.pop()
        if previous is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, previous)
    while _modules:
        name, previous = _modules.pop()
        if previous is _MISSING:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous
    if isinstance(keras.mixed_precision.global_policy(), policy_lib.Policy):
        compile_hook.enable(wrap_mixed_float16=False)  # The Policy needs it.
    else:
        compile_hook.disable()
