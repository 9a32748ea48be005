"""tf_lso: TensorFlow's legacy mixed-precision loss scaling API, on Keras 3."""

from tf_lso import callbacks
from tf_lso import experimental
from tf_lso._src.install import install
from tf_lso._src.install import uninstall
from tf_lso._src.loss_scale_optimizer import LossScaleOptimizer
from tf_lso._src.training_health import Overflow

__version__ = "0.1.0.dev0"

__all__ = (
    "LossScaleOptimizer",
    "Overflow",
    "callbacks",
    "experimental",
    "install",
    "uninstall",
)
