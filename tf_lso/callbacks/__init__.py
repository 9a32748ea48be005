"""Keras callbacks for loss scale optimizers."""

from tf_lso._src.callbacks import LossScaleMonitor

__all__ = ["LossScaleMonitor"]
