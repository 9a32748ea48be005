"""The TF 2.1-2.3 experimental API: loss scale classes and their optimizer."""

# First: without a usable TensorFlow, an ImportError says what to install.
from tf_lso._src import version_gate  # noqa: F401
from tf_lso._src.legacy_api.graph_rewrite import disable_mixed_precision_graph_rewrite
from tf_lso._src.legacy_api.graph_rewrite import enable_mixed_precision_graph_rewrite
from tf_lso._src.legacy_api.policy import Policy
from tf_lso._src.legacy_api.policy import get_layer_policy
from tf_lso._src.legacy_api.policy import global_policy
from tf_lso._src.legacy_api.policy import set_policy
from tf_lso._src.optimizer.experimental_loss_scale_optimizer import (
    LossScaleOptimizerV1 as LossScaleOptimizer,
)
from tf_lso._src.scaling.loss_scale import DynamicLossScale
from tf_lso._src.scaling.loss_scale import FixedLossScale
from tf_lso._src.scaling.loss_scale import LossScale
from tf_lso._src.scaling.serialization import deserialize
from tf_lso._src.scaling.serialization import get
from tf_lso._src.scaling.serialization import serialize

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
