"""`Model.compile` wraps a plain optimizer in a loss scale optimizer.

While the hook is enabled, `keras.Model.compile` first asks
`compile_optimizer` which optimizer to use. The hook sits on Keras's
`Trainer`, so that `load_model` still compiles the models it loads
(`compat.keras_compile_owner`). On the legacy-Keras route
(`TF_USE_LEGACY_KERAS=1`), tf_keras's `Model.compile` is hooked too
(`tf_keras_compile_optimizer`). Both routes choose the wrapper by one rule,
`_wrapper`.

The hook holds both of its switches, so they live exactly as long as it:

* `enable()` and `disable()` install and remove the hook. `set_policy` and
  `tf_lso.install()` enable it. `tf_lso.uninstall()` disables it unless a
  tf_lso `Policy` is global.
* `wrap_mixed_float16` (see `enable`) picks the class that a plain
  `'mixed_float16'` policy wraps in. `tf_lso.install()` turns it on.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable
from typing import Any

import keras

from tf_lso._src import compat
from tf_lso._src.inner import wrapping
from tf_lso._src.optimizer import experimental_loss_scale_optimizer as v1
from tf_lso._src.optimizer import loss_scale_optimizer as v2
from tf_lso._src.scaling import loss_scale as loss_scale_lib


class LossScalePolicy(abc.ABC):
    """A dtype policy with a loss scale, as TF 2.1-2.3's `Policy` was.
    `compile` wraps the optimizer of a model whose policy is one. `Policy`
    registers as one, so that policy.py imports this module and not the
    other way round."""

    @property
    @abc.abstractmethod
    def loss_scale(self) -> loss_scale_lib.LossScale | None:
        """The `LossScale` that `compile` uses, or None."""


def enable(*, wrap_mixed_float16: bool | None = None) -> None:
    """Makes `keras.Model.compile` apply `compile_optimizer` (idempotent).

    Args:
        wrap_mixed_float16: Whether a plain `'mixed_float16'` policy wraps
            in `tf_lso.LossScaleOptimizer` instead of Keras 3's class. None
            keeps the current setting (off if the hook was not enabled).
    """
    if compat.tf_keras_is_tf_keras():
        _enable_tf_keras()
    owner = compat.keras_compile_owner()
    compile = vars(owner)["compile"]
    original = _original_of(compile)
    if original is None:
        original = compile
    elif wrap_mixed_float16 in (None, _wraps_mixed_float16(compile)):
        return
    wrap = bool(wrap_mixed_float16)

    @functools.wraps(original)
    def hooked(self: Any, optimizer: Any = "rmsprop", *args: Any,
               **kwargs: Any) -> Any:
        policy = _tf_lso_policy(self)
        if policy is not None and policy.loss_scale is None:
            # A TF 2.1-2.3 policy without a loss scale scales nothing.
            kwargs.setdefault("auto_scale_loss", False)
        optimizer = compile_optimizer(
            self, optimizer, kwargs.get("auto_scale_loss", True),
            wrap_mixed_float16=wrap)
        return original(self, optimizer, *args, **kwargs)

    _mark(hooked, original, wrap_mixed_float16=wrap)
    owner.compile = hooked


def _mark(hook: Callable[..., Any], original: Callable[..., Any],
          wrap_mixed_float16: bool = False) -> None:
    """Marks `hook` as tf_lso's, and keeps the `compile` it replaces."""
    hook._tf_lso_original = original  # type: ignore[attr-defined]
    hook._tf_lso_wraps_mixed_float16 = (  # type: ignore[attr-defined]
        wrap_mixed_float16)


def _original_of(compile: Any) -> Callable[..., Any] | None:
    """The `compile` that a hook replaced, or None if `compile` is no hook."""
    return getattr(compile, "_tf_lso_original", None)


def _wraps_mixed_float16(hook: Any) -> bool:
    return hook._tf_lso_wraps_mixed_float16


def _enable_tf_keras() -> None:
    tf_keras = compat.tf_keras_module()
    assert tf_keras is not None  # tf.keras is tf_keras.
    # So that load_model finds tf_lso's optimizers in files.
    wrapping.register_with_tf_keras(v2.LossScaleOptimizer,
                                    v1.LossScaleOptimizerV1)
    model_class = tf_keras.Model
    original = vars(model_class).get("compile")
    if original is None or _original_of(original):
        return

    @functools.wraps(original)
    def compile(self: Any, optimizer: Any = "rmsprop", *args: Any,
                **kwargs: Any) -> Any:
        policy = keras.mixed_precision.global_policy()
        if not isinstance(policy, LossScalePolicy):
            policy = None
        optimizer = tf_keras_compile_optimizer(self, optimizer, policy)
        return original(self, optimizer, *args, **kwargs)

    _mark(compile, original)
    model_class.compile = compile


def _disable_tf_keras() -> None:
    tf_keras = compat.tf_keras_module()
    if tf_keras is None:
        return
    hooked = vars(tf_keras.Model).get("compile")
    original = _original_of(hooked)
    if original is not None:
        tf_keras.Model.compile = original


def disable() -> None:
    """Restores `keras.Model.compile` as Keras defines it; wrapping stops."""
    _disable_tf_keras()
    owner = compat.keras_compile_owner()
    original = _original_of(vars(owner)["compile"])
    if original is not None:
        owner.compile = original


def compile_optimizer(model: Any, optimizer: Any,
                      auto_scale_loss: bool = True, *,
                      wrap_mixed_float16: bool = False) -> Any:
    """The optimizer that Keras 3's `model.compile` should use.

    It is wrapped (see `_wrapper`) under a `Policy` with a loss scale. With
    the hook's `wrap_mixed_float16` switch, it is wrapped under a plain
    `'mixed_float16'` policy too.
    """
    policy: Any = getattr(model, "dtype_policy", None)
    tf_lso_policy = _tf_lso_policy(model)
    if tf_lso_policy is not None and tf_lso_policy.loss_scale is not None:
        return _wrapper(model, keras.optimizers.get(optimizer),
                        tf_lso_policy.loss_scale)
    if (wrap_mixed_float16 and auto_scale_loss and policy is not None
            and policy.name == "mixed_float16"):
        return _wrapper(model, keras.optimizers.get(optimizer), None)
    return optimizer


def tf_keras_compile_optimizer(model: Any, optimizer: Any,
                               policy: Any = None) -> Any:
    """The optimizer that tf_keras's `model.compile` should get.

    The global TF 2.1-2.3 `policy` (one with a `loss_scale`, or None)
    applies if the model's policy has its name. Then a plain tf_keras
    optimizer is wrapped as `compile_optimizer` wraps a Keras 3 one. Under
    `'mixed_float16'`, a policy without a loss scale gives a fixed scale of
    1, which scales nothing. Otherwise tf_keras's own `compile` would wrap
    the optimizer in a dynamic one.
    """
    tf_keras = compat.tf_keras_module()
    assert tf_keras is not None  # Its compile calls this.
    if isinstance(optimizer, v2.LossScaleOptimizer):
        _check_tf_keras_can_train(optimizer, tf_keras)
        return optimizer
    model_policy = getattr(model, "dtype_policy", None)
    if policy is None or model_policy is None or (
            model_policy.name != policy.name):
        return optimizer
    loss_scale = policy.loss_scale
    if loss_scale is None:
        if policy.name != "mixed_float16":
            return optimizer
        # x * 1 and x / 1 are exact.
        loss_scale = loss_scale_lib.FixedLossScale(1)
    return _wrapper(model, tf_keras.optimizers.get(optimizer), loss_scale)


def _check_tf_keras_can_train(optimizer: Any, tf_keras: Any) -> None:
    """Raises TypeError for a tf_lso optimizer that tf_keras cannot train.
    Around a tf_keras optimizer, it is a tf_keras optimizer too."""
    if isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer):
        return
    inner = type(optimizer.inner_optimizer)
    raise TypeError(
        "A tf_keras model (tf.keras is tf_keras here: "
        "TF_USE_LEGACY_KERAS=1) cannot be trained by a Keras 3 "
        f"optimizer. Received: optimizer={optimizer!r} around a "
        f"{inner.__module__}.{inner.__name__}. Wrap a tf.keras "
        "optimizer instead, e.g. "
        "tf_lso.LossScaleOptimizer(tf.keras.optimizers.SGD(...))."
    )


def _wrapper(model: Any, optimizer: Any,
             loss_scale: loss_scale_lib.LossScale | None) -> Any:
    """The loss scale optimizer that `compile` uses around `optimizer`.

    A loss scale optimizer is used as it is. Otherwise, with `loss_scale`
    None, it is `tf_lso.LossScaleOptimizer` with its defaults. Else it is
    `tf_lso.experimental.LossScaleOptimizer` around a copy of `loss_scale`,
    so that models do not share one. A recompile with the same optimizer
    keeps the model's wrapper if this rule would make the same one.
    """
    if wrapping.is_loss_scale_optimizer(optimizer):
        return optimizer
    previous: Any = getattr(model, "optimizer", None)
    if not (isinstance(previous, v2.LossScaleOptimizer)
            and previous.inner_optimizer is optimizer):
        previous = None
    if loss_scale is None:
        if previous is not None and not isinstance(
                previous, v1.LossScaleOptimizerV1) and (
                previous.dynamic, previous.initial_scale,
                previous.dynamic_growth_steps,
        ) == (True, loss_scale_lib.DEFAULT_INITIAL_SCALE,
              loss_scale_lib.DEFAULT_GROWTH_STEPS):
            return previous
        # Named as Keras 3's compile names its own wrapper.
        return v2.LossScaleOptimizer(optimizer, name="loss_scale_optimizer")
    if isinstance(previous, v1.LossScaleOptimizerV1) and (
            _described(previous.loss_scale) == _described(loss_scale)):
        return previous
    if isinstance(loss_scale, loss_scale_lib.LossScale):
        loss_scale = type(loss_scale).from_config(loss_scale.get_config())
    return v1.LossScaleOptimizerV1(optimizer, loss_scale)


def _described(
        loss_scale: loss_scale_lib.LossScale) -> tuple[type, dict[str, Any]]:
    return type(loss_scale), loss_scale.get_config()


def _tf_lso_policy(model: Any) -> LossScalePolicy | None:
    """The model's dtype policy if it is a `LossScalePolicy`, else None."""
    policy = getattr(model, "dtype_policy", None)
    return policy if isinstance(policy, LossScalePolicy) else None
