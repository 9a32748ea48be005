"""`tf_lso.experimental.LossScaleOptimizer(optimizer, loss_scale)`."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import keras

from tf_lso._src.gradients import replicas
from tf_lso._src.inner import wrapping
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


_P = inspect.Parameter
# TF 2.1-2.3's arguments, then tf_lso's keywords. `__init__` binds calls to
# it, so that a call that does not fit names the public class.
_SIGNATURE = inspect.Signature([
    _P("optimizer", _P.POSITIONAL_OR_KEYWORD, annotation="Any"),
    _P("loss_scale", _P.POSITIONAL_OR_KEYWORD, annotation="Any"),
    _P("name", _P.KEYWORD_ONLY, default=None, annotation="str | None"),
    _P("max_consecutive_skips", _P.KEYWORD_ONLY, default=None,
       annotation="int | None"),
    _P("print_overflows", _P.KEYWORD_ONLY, default=False, annotation="bool"),
    _P("stop_on_nonfinite_loss", _P.KEYWORD_ONLY, default=False,
       annotation="bool"),
], return_annotation="None")


def _arguments(args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> dict[str, Any]:
    """Binds a call to `_SIGNATURE`; a misfit raises a TypeError that names
    the public class and what to pass."""
    try:
        bound = _SIGNATURE.bind_partial(*args, **kwargs)
    except TypeError as error:
        unknown = [key for key in kwargs if key not in _SIGNATURE.parameters]
        hint = "".join(
            f" Set `{key}` on the optimizer it wraps." for key in unknown
            if key in settings_lib.KERAS_BASE_DEFAULTS
            or key == "learning_rate")
        raise TypeError(
            f"LossScaleOptimizer.__init__() {error}: it takes "
            "tf_lso.experimental.LossScaleOptimizer(optimizer, loss_scale, *, "
            "name=None, max_consecutive_skips=None, print_overflows=False, "
            f"stop_on_nonfinite_loss=False).{hint}"
        ) from None
    missing = [f"'{key}'" for key in ("optimizer", "loss_scale")
               if key not in bound.arguments]
    if missing:
        raise TypeError(
            f"LossScaleOptimizer.__init__() missing {len(missing)} required "
            f"positional argument{'s' if len(missing) > 1 else ''}: "
            f"{' and '.join(missing)}. {_USAGE}")
    bound.apply_defaults()
    return dict(bound.arguments)


_USAGE = ("tf_lso.experimental.LossScaleOptimizer(optimizer, loss_scale) "
          'takes a loss scale: "dynamic" (recommended) or a number for a '
          "fixed one.")


@keras.saving.register_keras_serializable(package="tf_lso")
class LossScaleOptimizerV1(lso_lib.LossScaleOptimizer):
    """The TF 2.1-2.3 loss scale optimizer: a `tf_lso.LossScaleOptimizer`
    that takes a loss scale.

    Its `loss_scale` is that `LossScale` object: call it or use it as a
    tensor. A `DynamicLossScale` you pass in is used, not copied.

    Args:
        optimizer: The optimizer to wrap (see `tf_lso.LossScaleOptimizer`).
        loss_scale: `'dynamic'`, a positive number (a fixed scale), a
            `LossScale` (a `DynamicLossScale` needs multiplier 2), a dict
            from `serialize`, or a `tf.compat.v1.mixed_precision` loss scale.
        name: See `tf_lso.LossScaleOptimizer`.
        max_consecutive_skips: See `tf_lso.LossScaleOptimizer`.
        print_overflows: See `tf_lso.LossScaleOptimizer`.
        stop_on_nonfinite_loss: See `tf_lso.LossScaleOptimizer`.

    Raises:
        TypeError: If `optimizer` is not a supported optimizer.
        ValueError: For an invalid `loss_scale`, or an `optimizer` that
            another loss scale optimizer wraps already.

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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        arguments = _arguments(args, kwargs)
        inner = wrapping.wrap(arguments["optimizer"], "optimizer")
        replicas.check_strategy_supported()
        self._init_wrapper(inner, _to_loss_scale(arguments["loss_scale"]),
                           arguments["name"],
                           arguments["max_consecutive_skips"],
                           arguments["print_overflows"],
                           arguments["stop_on_nonfinite_loss"])

    # What `inspect.signature` and `help` show.
    __init__.__signature__ = _SIGNATURE.replace(  # type: ignore[attr-defined]
        parameters=[_P("self", _P.POSITIONAL_OR_KEYWORD),
                    *_SIGNATURE.parameters.values()])

    @property
    def loss_scale(self) -> loss_scale_lib.LossScale:
        """The `LossScale` object; call it for the current scale tensor."""
        self._seen_losses.unscaling()  # Code may unscale by hand with it.
        return self._loss_scale

    def get_config(self) -> dict[str, Any]:
        """Returns the TF 2.4 config, or TF 2.1-2.3's for a custom loss scale.

        Returns:
            TF 2.4's four keys for a `FixedLossScale` or `DynamicLossScale`;
            else `{'optimizer', 'loss_scale'}`, as TF 2.1-2.3 wrote it.
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

        Raises:
            TypeError: If `config` is not a dict, has unknown keys, or has a
                `dynamic` that is not a bool.
            ValueError: For values the constructor rejects, a missing
                optimizer, or a DynamicLossScale whose multiplier is not 2.
        """
        read_config = optimizer_config.read(config, cls.__name__,
                                            custom_objects)
        optimizer = wrapping.deserialize(read_config.inner_optimizer,
                                          custom_objects)
        # Keywords, so that subclasses forwarding **kwargs round-trip.
        return cls(optimizer=optimizer,
                   loss_scale=read_config.as_loss_scale(),
                   **read_config.optional)
