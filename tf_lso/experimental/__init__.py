"""The TF 2.1-2.3 experimental API: loss scale classes and their optimizer."""

from tf_lso._src.experimental_loss_scale_optimizer import (
    LossScaleOptimizerV1 as LossScaleOptimizer,
)
from tf_lso._src.loss_scale import DynamicLossScale
from tf_lso._src.loss_scale import FixedLossScale
from tf_lso._src.loss_scale import LossScale
from tf_lso._src.serialization import deserialize
from tf_lso._src.serialization import get
from tf_lso._src.serialization import serialize

__all__ = (
    "DynamicLossScale",
    "FixedLossScale",
    "LossScale",
    "LossScaleOptimizer",
    "deserialize",
    "get",
    "serialize",
)
