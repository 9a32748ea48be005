"""Keras callbacks for loss scale optimizers."""

# First: without a usable TensorFlow, an ImportError says what to install.
from tf_lso._src import version_gate  # noqa: F401
from tf_lso._src.optimizer.callbacks import LossScaleMonitor

__all__ = ["LossScaleMonitor"]
