"""tf_lso: TensorFlow's legacy mixed-precision loss scaling API, on Keras 3.

The public names are imported when first used: `python -m tf_lso check`
needs neither TensorFlow nor Keras, and the first use of the runtime checks
their versions (an ImportError that says what to install).
"""

import importlib
import typing

__version__ = "0.1.0.dev0"

__all__ = (
    "LossScaleOptimizer",
    "Overflow",
    "callbacks",
    "experimental",
    "install",
    "uninstall",
)

# Each public name and the module it comes from (subpackages: themselves).
_SOURCES = {
    "LossScaleOptimizer": "tf_lso._src.loss_scale_optimizer",
    "Overflow": "tf_lso._src.training_health",
    "callbacks": "tf_lso.callbacks",
    "experimental": "tf_lso.experimental",
    "install": "tf_lso._src.install",
    "uninstall": "tf_lso._src.install",
}

if typing.TYPE_CHECKING:  # What type checkers and IDEs read.
    from tf_lso import callbacks
    from tf_lso import experimental
    from tf_lso._src.install import install
    from tf_lso._src.install import uninstall
    from tf_lso._src.loss_scale_optimizer import LossScaleOptimizer
    from tf_lso._src.training_health import Overflow


def __getattr__(name):
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'tf_lso' has no attribute {name!r}")
    module = importlib.import_module(source)
    value = module if source == f"tf_lso.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
