"""`Model.compile` wraps a plain optimizer in a loss scale optimizer.

TF 2.1-2.3 wrapped the optimizer given to `compile` when the model's dtype
policy carried a loss scale, TF 2.4 when the policy was `'mixed_float16'`.
Keras 3 wraps in its own `LossScaleOptimizer`. While the hook is enabled,
`keras.Model.compile` first asks `compile_optimizer` which optimizer to use.
The hook sits on the class that defines `compile` (Keras's `Trainer`), so
that `load_model` still sees an ordinary `compile` and compiles the models it
loads (with their optimizer state). On the legacy-Keras route
(`TF_USE_LEGACY_KERAS=1`) tf_keras's `Model.compile` is hooked too
(`tf_keras_compile_optimizer`). Both routes make the wrapper, and reuse it
on a recompile, by one rule: `_wrapper`.

Two switches, both explicit, both held by the hook itself (so that they
live exactly as long as it):

* `enable()` / `disable()` install and remove the hook. `set_policy`
  enables it (a tf_lso `Policy` needs it); `tf_lso.install()` enables it and
  `tf_lso.uninstall()` disables it unless a tf_lso `Policy` is global.
* `wrap_mixed_float16` (an argument of `enable`): whether a plain Keras
  `'mixed_float16'` policy wraps in `tf_lso.LossScaleOptimizer` (TF 2.4)
  instead of Keras 3's class; `tf_lso.install()` turns it on.

A tf_lso loss scale optimizer around a tf_keras optimizer is an instance of
a class that is also tf_keras's `LossScaleOptimizer`
(`kinds/tf_keras.py`, `tf_keras_wrapper_class`), so tf_keras's `compile`
keeps it (`model.optimizer is opt`, as TF 2.1-2.4 gave).
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable
from typing import Any

import keras

from tf_lso._src import compat
from tf_lso._src.inner import wrapping
from tf_lso._src.inner.kinds import tf_keras as tf_keras_kinds
from tf_lso._src.optimizer import experimental_loss_scale_optimizer as v1
from tf_lso._src.optimizer import loss_scale_optimizer as v2
from tf_lso._src.scaling import loss_scale as loss_scale_lib


class LossScalePolicy(abc.ABC):
    """A dtype policy that carries a loss scale (TF 2.1-2.3's `Policy`).

    `compile` wraps the optimizer of a model whose policy is one.
    `tf_lso.experimental.Policy` is registered as one (policy.py), so the
    dependency runs one way: policy -> compile_hook.
    """

    @property
    @abc.abstractmethod
    def loss_scale(self) -> loss_scale_lib.LossScale | None:
        """The `LossScale` that `compile` uses, or None."""


def enable(*, wrap_mixed_float16: bool | None = None) -> None:
    """Makes `keras.Model.compile` apply `compile_optimizer` (idempotent).

    On the legacy-Keras route tf_keras's `Model.compile` is hooked too.

    Args:
        wrap_mixed_float16: If not None, sets whether a plain
            `'mixed_float16'` Keras policy wraps in `tf_lso.LossScaleOptimizer`;
            None keeps the current setting (off if the hook was not enabled).
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
            # TF 2.1-2.3: a policy without a loss scale means no scaling.
            kwargs.setdefault("auto_scale_loss", False)
        optimizer = compile_optimizer(
            self, optimizer, kwargs.get("auto_scale_loss", True),
            wrap_mixed_float16=wrap)
        return original(self, optimizer, *args, **kwargs)

    _mark(hooked, original, wrap_mixed_float16=wrap)
    owner.compile = hooked


def _mark(hook: Callable[..., Any], original: Callable[..., Any],
          wrap_mixed_float16: bool = False) -> None:
    """Marks a `compile` as tf_lso's hook, keeping the one it replaces."""
    hook._tf_lso_original = original  # type: ignore[attr-defined]
    hook._tf_lso_wraps_mixed_float16 = (  # type: ignore[attr-defined]
        wrap_mixed_float16)


def _original_of(compile: Any) -> Callable[..., Any] | None:
    """The `compile` a hook replaced; None if `compile` is no hook."""
    return getattr(compile, "_tf_lso_original", None)


def _wraps_mixed_float16(hook: Any) -> bool:
    """Whether the hook wraps under a plain `'mixed_float16'` policy."""
    return hook._tf_lso_wraps_mixed_float16


def _enable_tf_keras() -> None:
    tf_keras = compat.tf_keras_module()
    assert tf_keras is not None  # tf.keras is tf_keras.
    # Registered with tf_keras (by their classes' names): load_model finds
    # tf_lso's optimizers in files.
    for cls in (v2.LossScaleOptimizer, v1.LossScaleOptimizerV1):
        for legacy in (False, True):
            tf_keras_kinds.tf_keras_wrapper_class(cls, legacy=legacy)
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


def is_enabled() -> bool:
    """Whether `keras.Model.compile` is the hook."""
    owner = compat.keras_compile_owner()
    return _original_of(vars(owner)["compile"]) is not None


def compile_optimizer(model: Any, optimizer: Any,
                      auto_scale_loss: bool = True, *,
                      wrap_mixed_float16: bool = False) -> Any:
    """The optimizer Keras 3's `model.compile` should use (TF 2.x's rules).

    Under a `Policy` with a loss scale, a plain optimizer is wrapped in a
    `tf_lso.experimental.LossScaleOptimizer` with a fresh copy of that loss
    scale. With `wrap_mixed_float16`, a plain `'mixed_float16'` Keras
    policy wraps it in `tf_lso.LossScaleOptimizer` (TF 2.4). See `_wrapper`
    for loss scale optimizers and recompiles.

    Args:
        model: The model being compiled.
        optimizer: What was passed to `compile` (an optimizer or a name).
        auto_scale_loss: `compile`'s argument of that name.
        wrap_mixed_float16: The hook's switch.

    Returns:
        The optimizer to compile with.
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
    """The optimizer tf_keras's `model.compile` should get.

    Under a global TF 2.1-2.3 `Policy` with a loss scale, whose name the
    model's dtype policy has, a plain tf_keras optimizer is wrapped in
    `tf_lso.experimental.LossScaleOptimizer` as `compile_optimizer` wraps a
    Keras 3 one. A policy whose loss scale is None gives a fixed scale of 1
    under `'mixed_float16'`, which scales nothing, so that tf_keras's own
    `compile` does not wrap the optimizer in a dynamic one.

    Args:
        model: The tf_keras model being compiled.
        optimizer: What was passed to `compile`.
        policy: The global TF 2.1-2.3 `Policy` (one with a `loss_scale`), or
            None.

    Returns:
        The optimizer to compile with.

    Raises:
        TypeError: For a tf_lso optimizer around a Keras 3 optimizer, which
            a tf_keras model cannot train (tf_keras's own message would be
            "Could not interpret optimizer identifier").
    """
    if isinstance(optimizer, v2.LossScaleOptimizer):
        kind = wrapping.kind_of(optimizer.inner_optimizer)
        if kind is None or not issubclass(kind, tf_keras_kinds.TfKerasKind):
            inner = type(optimizer.inner_optimizer)
            raise TypeError(
                "A tf_keras model (tf.keras is tf_keras here: "
                "TF_USE_LEGACY_KERAS=1) cannot be trained by a Keras 3 "
                f"optimizer. Received: optimizer={optimizer!r} around a "
                f"{inner.__module__}.{inner.__name__}. Wrap a tf.keras "
                "optimizer instead, e.g. "
                "tf_lso.LossScaleOptimizer(tf.keras.optimizers.SGD(...))."
            )
        return optimizer
    model_policy = getattr(model, "dtype_policy", None)
    if policy is None or model_policy is None or (
            model_policy.name != policy.name):
        return optimizer
    loss_scale = policy.loss_scale
    if loss_scale is None:
        if policy.name != "mixed_float16":
            return optimizer
        # x * 1 and x / 1 are exact: TF 2.1-2.3's "no loss scaling".
        loss_scale = loss_scale_lib.FixedLossScale(1)
    tf_keras = compat.tf_keras_module()
    assert tf_keras is not None  # Its compile calls this.
    return _wrapper(model, tf_keras.optimizers.get(optimizer), loss_scale)


def _wrapper(model: Any, optimizer: Any,
             loss_scale: loss_scale_lib.LossScale | None) -> Any:
    """The loss scale optimizer `compile` uses around `optimizer`.

    `loss_scale` None means TF 2.4's class with its defaults
    (`tf_lso.LossScaleOptimizer`), else TF 2.1-2.3's around a fresh copy of
    `loss_scale` (TF 2.1-2.3 shared one between models). A loss scale
    optimizer is used as it is. A recompile with the same plain optimizer
    keeps the model's loss scale optimizer if it is the one this rule
    makes (TF 2.4 and tf_keras wrapped it a second time, which raised).
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
