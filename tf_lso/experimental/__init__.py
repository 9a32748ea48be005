"""The TF 2.1-2.3 experimental API: loss scale classes and their optimizer."""

from tf_lso._src.experimental_loss_scale_optimizer import (
    LossScaleOptimizerV1 as LossScaleOptimizer,
)
from tf_lso._src.graph_rewrite import disable_mixed_precision_graph_rewrite
from tf_lso._src.graph_rewrite import enable_mixed_precision_graph_rewrite
from tf_lso._src.loss_scale import DynamicLossScale
from tf_lso._src.loss_scale import FixedLossScale
from tf_lso._src.loss_scale import LossScale
from tf_lso._src.policy import Policy
from tf_lso._src.policy import get_layer_policy
from tf_lso._src.policy import global_policy
from tf_lso._src.policy import set_policy
from tf_lso._src.serialization import deserialize
from tf_lso._src.serialization import get
from tf_lso._src.serialization import serialize

__all__ = (
    "DynamicLossScale",
    "FixedLossScale",
    "LossScale",
    "LossScaleOptimizer",
    "Policy",
    "deserialize",
    "disable_mixed_precision_graph_rewrite",
    "enable_mixed_precision_graph_rewrite",
    "get",
    "get_layer_policy",
    "global_policy",
    "serialize",
    "set_policy",
)
