"""`tf_lso.experimental.LossScaleOptimizer(optimizer, loss_scale)`.

The `tf.keras.mixed_precision.experimental.LossScaleOptimizer` of TF 2.1-2.8:
a subclass of `tf_lso.LossScaleOptimizer` that takes a loss scale (or an
identifier for one) instead of the TF 2.4 arguments.
"""

from __future__ import annotations

import functools
from typing import Any

import keras

from tf_lso._src.gradients import replicas
from tf_lso._src.inner import inner_optimizer as inner_lib
from tf_lso._src.optimizer import config as optimizer_config
from tf_lso._src.optimizer import loss_scale_optimizer as lso_lib
from tf_lso._src.optimizer import settings as settings_lib
from tf_lso._src.scaling import loss_scale as loss_scale_lib
from tf_lso._src.scaling import serialization


def _to_loss_scale(loss_scale: Any) -> loss_scale_lib.LossScale:
    """The LossScale an experimental optimizer uses for `loss_scale`."""
    converted = serialization.interpret(
        loss_scale, functools.partial(serialization.fixed_loss_scale,
                                      tf24_arguments=True))
    if converted is None:
        raise ValueError(
            "Invalid value passed to loss_scale. loss_scale must be the string "
            '"dynamic" (recommended), an int, a float, a FixedLossScale, or a '
            f"DynamicLossScale. Got value: {loss_scale!r}."
        )
    settings_lib.check_multiplier(converted, "argument")
    return converted


class _Required:
    """The default of a required argument, so that its absence gets a
    message naming the public class (Python's names LossScaleOptimizerV1)."""

    def __repr__(self) -> str:
        return "<required>"


_REQUIRED: Any = _Required()


def _check_given(**arguments: Any) -> None:
    """Python's TypeError for missing arguments, with TF 2.1-2.3's class
    name (LossScaleOptimizer) and what to pass."""
    missing = [f"'{name}'" for name, value in arguments.items()
               if value is _REQUIRED]
    if missing:
        raise TypeError(
            f"LossScaleOptimizer.__init__() missing {len(missing)} required "
            f"positional argument{'s' if len(missing) > 1 else ''}: "
            f"{' and '.join(missing)}. tf_lso.experimental."
            "LossScaleOptimizer(optimizer, loss_scale) takes a loss scale: "
            '"dynamic" (recommended) or a number for a fixed one.')


@keras.saving.register_keras_serializable(package="tf_lso")
class LossScaleOptimizerV1(lso_lib.LossScaleOptimizer):
    """The TF 2.1-2.3 experimental loss scale optimizer.

    Exported as `tf_lso.experimental.LossScaleOptimizer`. It behaves like
    `tf_lso.LossScaleOptimizer` (of which it is a subclass), except that it
    takes a loss scale and that `loss_scale` is that `LossScale` object: call
    it (`opt.loss_scale()`) as TF 2.1-2.3 code does, or use it as a tensor as
    TF 2.4 code does.

    A `DynamicLossScale` that is passed in is used, not copied: its variables
    are the optimizer's loss scale state.

    Args:
        optimizer: The optimizer to wrap (see `tf_lso.LossScaleOptimizer`).
        loss_scale: `'dynamic'`, a positive int or float (a fixed scale), a
            `FixedLossScale`, a `DynamicLossScale` with multiplier 2, any
            other `LossScale` subclass instance, a dict from `serialize`, or
            one of TensorFlow's deprecated `tf.compat.v1.mixed_precision` loss
            scales (converted).
        name: See `tf_lso.LossScaleOptimizer`.
        max_consecutive_skips: See `tf_lso.LossScaleOptimizer`.
        print_overflows: See `tf_lso.LossScaleOptimizer`.
        stop_on_nonfinite_loss: See `tf_lso.LossScaleOptimizer`.

    Raises:
        TypeError: If `optimizer` is not a supported optimizer.
        ValueError: If `loss_scale` is None, an unknown string, not positive,
            or a `DynamicLossScale` whose multiplier is not 2, or if another
            loss scale optimizer wraps `optimizer` already.

    >>> opt = tf_lso.experimental.LossScaleOptimizer(
    ...     tf.keras.optimizers.SGD(1.0), loss_scale="dynamic")
    >>> opt.loss_scale
    DynamicLossScale(current_loss_scale=32768.0, num_good_steps=0,
                     initial_loss_scale=32768.0, increment_period=2000,
                     multiplier=2.0)
    >>> float(opt.loss_scale())
    32768.0
    """

    _public_name = "tf_lso.experimental.LossScaleOptimizer"

    def __init__(
        self,
        optimizer: Any = _REQUIRED,
        loss_scale: Any = _REQUIRED,
        *,
        name: str | None = None,
        max_consecutive_skips: int | None = None,
        print_overflows: bool = False,
        stop_on_nonfinite_loss: bool = False,
    ) -> None:
        _check_given(optimizer=optimizer, loss_scale=loss_scale)
        inner = inner_lib.wrap(optimizer, "optimizer")
        replicas.check_strategy_supported()
        self._init_wrapper(inner, _to_loss_scale(loss_scale), name,
                           max_consecutive_skips, print_overflows,
                           stop_on_nonfinite_loss)

    @property
    def loss_scale(self) -> loss_scale_lib.LossScale:
        """The `LossScale` object; call it for the current scale tensor."""
        self._seen_losses.unscaling()  # Code may unscale by hand with it.
        return self._loss_scale

    def get_config(self) -> dict[str, Any]:
        """Returns the TF 2.4 config, or TF 2.3's for a custom loss scale.

        Returns:
            The TF 2.4 four-key config when the loss scale is a
            `FixedLossScale` or a `DynamicLossScale`; otherwise
            `{'optimizer', 'loss_scale'}` as TF 2.1-2.3 wrote it.
        """
        if settings_lib.describe(self._loss_scale) is None:
            return optimizer_config.tf23_config(
                self._inner.serialize(), self._loss_scale,
                self._optional_config())
        return super().get_config()

    @classmethod
    def from_config(
        cls, config: dict[str, Any], custom_objects: dict | None = None
    ) -> LossScaleOptimizerV1:
        """Creates an optimizer from a TF 2.4 or TF <= 2.3 config.

        Args:
            config: The output of `get_config()`.
            custom_objects: Optional dict of custom classes, for the inner
                optimizer and (TF <= 2.3 format) the loss scale.

        Returns:
            A new optimizer.

        Raises:
            TypeError: If `config` is not a dict, has unknown keys, or has a
                `dynamic` that is not a bool.
            ValueError: For values the constructor rejects, a missing
                optimizer, or a DynamicLossScale whose multiplier is not 2.
        """
        read_config = optimizer_config.read(config, cls.__name__,
                                            custom_objects)
        optimizer = inner_lib.deserialize(read_config.inner_optimizer,
                                          custom_objects)
        # Keywords, so that subclasses forwarding **kwargs round-trip.
        return cls(optimizer=optimizer,
                   loss_scale=read_config.as_loss_scale(),
                   **read_config.optional)
