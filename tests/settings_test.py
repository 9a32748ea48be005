"""Tests for tf_lso._src.optimizer.settings: TF 2.4's optimizer arguments.

The constructor's checks are tested through the classes
(loss_scale_optimizer_test.py, experimental_loss_scale_optimizer_test.py).
"""

import pytest

from tf_lso._src.optimizer import settings
from tf_lso._src.scaling import loss_scale as loss_scale_lib


def test_multiplier_other_than_2_is_rejected():
    with pytest.raises(ValueError, match="multiplier is not 2"):
        settings.check_multiplier(
            loss_scale_lib.DynamicLossScale(multiplier=4.0), "config"
        )


def test_multiplier_message_for_a_constructor_argument():
    with pytest.raises(ValueError, match="multiplier must be 2"):
        settings.check_multiplier(
            loss_scale_lib.DynamicLossScale(multiplier=4.0), "argument"
        )
    settings.check_multiplier(
        loss_scale_lib.DynamicLossScale(multiplier=2.0), "argument")
    settings.check_multiplier(
        loss_scale_lib.FixedLossScale(4.0), "config")
