"""`tf_lso.install()` / `uninstall()`: the legacy names, resolved to tf_lso.

`install()` records what it replaces, so that `uninstall()` restores
TensorFlow exactly.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Mapping
from typing import Any

import keras
import tensorflow as tf

from tf_lso._src.legacy_api import compile_hook
from tf_lso._src.legacy_api import policy as policy_lib
from tf_lso_migration import legacy_names as legacy

_MISSING = object()
# (owner, attribute, previous value or _MISSING)
_installed: list[tuple[Any, str, Any]] = []
# (sys.modules key, previous module or _MISSING)
_modules: list[tuple[str, Any]] = []


def _module(name: str, attributes: Mapping[str, Any]) -> types.ModuleType:
    module = types.ModuleType(name, "Legacy names provided by tf_lso.")
    for key, value in attributes.items():
        setattr(module, key, value)
    return module


def _set(owner: Any, name: str, value: Any) -> None:
    _installed.append((owner, name, getattr(owner, name, _MISSING)))
    setattr(owner, name, value)


def _is_tf_keras(value: object) -> bool:
    """Whether `value` is tf_keras's. Such a name works on the legacy-Keras
    route, so `install()` leaves it alone."""
    return getattr(value, "__module__", "").split(".")[0] == "tf_keras"


def _register(name: str, module: types.ModuleType) -> None:
    _modules.append((name, sys.modules.get(name, _MISSING)))
    sys.modules[name] = module


def _keras_mixed_precision_modules() -> list[types.ModuleType]:
    """Every module object a script reaches as tf.keras.mixed_precision:
    Keras's tf_keras facade and `keras.mixed_precision` itself."""
    modules: list[types.ModuleType] = []
    for module in (
        tf.keras.mixed_precision,
        importlib.import_module("tensorflow.keras.mixed_precision"),
        keras.mixed_precision,
        importlib.import_module("keras.mixed_precision"),
    ):
        if all(module is not seen for seen in modules):
            modules.append(module)
    return modules


def installed_names() -> list[str]:
    """The dotted names `install()` provides: the public names of
    `tf_lso_migration/legacy_names.py`, which `check --fix` rewrites too."""
    return legacy.installed_names()


def _tf_lso_object(dotted: str) -> Any:
    """The object a dotted name such as `tf_lso.experimental.Policy` names."""
    module, _, attribute = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attribute)


def _owners() -> dict[str, dict[str, Any]]:
    """`{'tf.train.experimental': {attribute: tf_lso object}, ...}` for
    every name `install()` provides."""
    owners: dict[str, dict[str, Any]] = {}
    for name in installed_names():
        owner, _, attribute = name.rpartition(".")
        owners.setdefault(owner, {})[attribute] = _tf_lso_object(
            legacy.LEGACY_NAMES[name])
    return owners


def _modules_at(path: str) -> list[types.ModuleType]:
    """The module objects a script reaches as `path` (`tf.train`, ...),
    making those TensorFlow no longer has (`tf.mixed_precision`)."""
    if path == "tf.keras.mixed_precision":
        return _keras_mixed_precision_modules()
    owner = tf
    for part in path.split(".")[1:]:
        child = getattr(owner, part, None)
        if child is None:
            name = "tensorflow" + path[2:]
            child = _module(name, {})
            _set(owner, part, child)
            _register(name, child)
        owner = child
    return [owner]


def install() -> None:
    """Makes TF 2.1-2.4's mixed-precision names resolve to tf_lso.

    Explicit and idempotent. The names are those under
    `tf.keras.mixed_precision.experimental`, `tf.mixed_precision.experimental`
    and `tf.train.experimental`, and `tf.keras.mixed_precision.
    LossScaleOptimizer` with TF 2.4's signature (`installed_names()`; the
    list is in docs/migration.md). `import` statements find them too.
    `model.compile` under a `'mixed_float16'` policy then wraps the optimizer
    in `tf_lso.LossScaleOptimizer`, not Keras 3's class.

    On the legacy-Keras route (`TF_USE_LEGACY_KERAS=1`) it provides only
    what tf_keras lacks.

    >>> tf_lso.install()
    >>> (tf.keras.mixed_precision.experimental.LossScaleOptimizer
    ...  is tf_lso.experimental.LossScaleOptimizer)
    True
    >>> tf_lso.uninstall()
    >>> hasattr(tf.keras.mixed_precision, "experimental")
    False
    """
    if _installed:
        return
    for owner, attributes in _owners().items():
        if owner in legacy.LEGACY_MODULES:
            # A module TF 2.16+ lacks: provided whole, also to `import`.
            name = "tensorflow" + owner[2:]
            module = _module(name, attributes)
            parent, _, last = owner.rpartition(".")
            for parent_module in _modules_at(parent):
                _set(parent_module, last, module)
            _register(name, module)
        else:
            for owner_module in _modules_at(owner):
                for attribute, value in attributes.items():
                    if not _is_tf_keras(getattr(owner_module, attribute,
                                                None)):
                        _set(owner_module, attribute, value)
    compile_hook.enable(wrap_mixed_float16=True)


def uninstall() -> None:
    """Undoes `install()`: TensorFlow's names are as they were before.

    It removes the `keras.Model.compile` hook too, unless the global policy
    is a tf_lso `Policy`, which needs the hook.
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
