"""tf_lso: TensorFlow's legacy mixed-precision loss scaling API, on Keras 3.

With TensorFlow 2.16+ and Keras 3.8+, importing tf_lso imports its runtime,
so Keras finds tf_lso's classes by name. Without them `import tf_lso` still
works, and the first runtime name used raises an ImportError saying what to
install. The migration tool is `tf_lso_migration`, which imports nothing of
this package.
"""

import importlib
import sys
import typing

# Kept in the migration tool, which reads it without importing tf_lso.
from tf_lso_migration import __version__ as __version__

__all__ = (
    "GradientReport",
    "LossScaleOptimizer",
    "LossScalingWarning",
    "Overflow",
    "callbacks",
    "experimental",
    "install",
    "uninstall",
)

# Each public name and the module it comes from (subpackages: themselves).
_SOURCES = {
    "GradientReport": "tf_lso._src.optimizer.gradient_report",
    "LossScaleOptimizer": "tf_lso._src.optimizer.loss_scale_optimizer",
    "LossScalingWarning": "tf_lso._src.optimizer.training_health",
    "Overflow": "tf_lso._src.optimizer.training_health",
    "callbacks": "tf_lso.callbacks",
    "experimental": "tf_lso.experimental",
    "install": "tf_lso._src.legacy_api.install",
    "uninstall": "tf_lso._src.legacy_api.install",
}

if typing.TYPE_CHECKING:  # What type checkers and IDEs read.
    from tf_lso import callbacks
    from tf_lso import experimental
    from tf_lso._src.legacy_api.install import install
    from tf_lso._src.legacy_api.install import uninstall
    from tf_lso._src.optimizer.gradient_report import GradientReport
    from tf_lso._src.optimizer.loss_scale_optimizer import LossScaleOptimizer
    from tf_lso._src.optimizer.training_health import LossScalingWarning
    from tf_lso._src.optimizer.training_health import Overflow


def __getattr__(name: str) -> typing.Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'tf_lso' has no attribute {name!r}")
    _require_runtime()
    module = importlib.import_module(source)
    value = module if source == f"tf_lso.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _require_runtime() -> None:
    """Raises an ImportError saying what to install, unless TF/Keras fit."""
    importlib.import_module("tf_lso._src.version_gate")


def _import_runtime_if_usable() -> None:
    if sys.argv[:1] == ["-m"]:
        # `python -m tf_lso ...` (argv[0] is "-m" while Python imports the
        # package): `check` and `rule` need no runtime, so skip TensorFlow's
        # start-up time and logs. `run` imports the runtime itself. Only a
        # speed-up: the checker stays free of TensorFlow regardless.
        return
    try:
        _require_runtime()
    except ImportError:
        return  # Raised again, with what to install, on first use.
    for name in __all__:
        __getattr__(name)


_import_runtime_if_usable()
