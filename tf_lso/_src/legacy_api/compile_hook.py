"""`Model.compile` wraps a plain optimizer in a loss scale optimizer.

TF 2.1-2.3 wrapped the optimizer given to `compile` when the model's dtype
policy carried a loss scale, TF 2.4 when the policy was `'mixed_float16'`.
Keras 3 wraps in its own `LossScaleOptimizer`. While the hook is enabled,
`keras.Model.compile` first asks `compile_optimizer` which optimizer to use.
The hook sits on the class that defines `compile` (Keras's `Trainer`), so
that `load_model` still sees an ordinary `compile` and compiles the models it
loads (with their optimizer state).

Two switches, both explicit:

* `enable()` / `disable()` install and remove the hook. `set_policy`
  enables it (a tf_lso `Policy` needs it); `tf_lso.install()` enables it and
  `tf_lso.uninstall()` disables it unless a tf_lso `Policy` is global.
* `wrap_mixed_float16` (an argument of `enable`): whether a plain Keras
  `'mixed_float16'` policy wraps in `tf_lso.LossScaleOptimizer` (TF 2.4)
  instead of Keras 3's class; `tf_lso.install()` turns it on.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable
from typing import Any

import keras

from tf_lso._src import compat
from tf_lso._src.legacy_api import tf_keras_face
from tf_lso._src.optimizer import experimental_loss_scale_optimizer as v1
from tf_lso._src.optimizer import loss_scale_optimizer as v2
from tf_lso._src.scaling import loss_scale as loss_scale_lib

_switch = {"wrap_mixed_float16": False}


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

    On the legacy-Keras route tf_keras's `Model.compile` is hooked too
    (`tf_keras_face.compile_optimizer`).

    Args:
        wrap_mixed_float16: If not None, sets whether a plain
            `'mixed_float16'` Keras policy wraps in `tf_lso.LossScaleOptimizer`.
    """
    if wrap_mixed_float16 is not None:
        _switch["wrap_mixed_float16"] = bool(wrap_mixed_float16)
    if compat.tf_keras_is_tf_keras():
        _enable_tf_keras()
    owner = compat.keras_compile_owner()
    original = vars(owner)["compile"]
    if _original_of(original) is not None:
        return

    @functools.wraps(original)
    def compile(self: Any, optimizer: Any = "rmsprop", *args: Any,
                **kwargs: Any) -> Any:
        policy = _tf_lso_policy(self)
        if policy is not None and policy.loss_scale is None:
            # TF 2.1-2.3: a policy without a loss scale means no scaling.
            kwargs.setdefault("auto_scale_loss", False)
        optimizer = compile_optimizer(
            self, optimizer, kwargs.get("auto_scale_loss", True)
        )
        return original(self, optimizer, *args, **kwargs)

    _mark(compile, original)
    owner.compile = compile


def _mark(hook: Callable[..., Any], original: Callable[..., Any]) -> None:
    """Marks a `compile` as tf_lso's hook, keeping the one it replaces."""
    hook._tf_lso_original = original  # type: ignore[attr-defined]


def _original_of(compile: Any) -> Callable[..., Any] | None:
    """The `compile` a hook replaced; None if `compile` is no hook."""
    return getattr(compile, "_tf_lso_original", None)


def _enable_tf_keras() -> None:
    tf_keras = compat.tf_keras_module()
    assert tf_keras is not None  # tf.keras is tf_keras.
    # Registered with tf_keras (by their classes' names): load_model finds
    # tf_lso's optimizers in files.
    from tf_lso._src.inner.kinds import tf_keras as tf_keras_kinds

    for cls in (v2.LossScaleOptimizer, v1.LossScaleOptimizerV1):
        for legacy in (False, True):
            tf_keras_kinds.tf_keras_wrapper_class(cls, legacy)
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
        optimizer = tf_keras_face.compile_optimizer(self, optimizer, policy)
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
    _switch["wrap_mixed_float16"] = False
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
                      auto_scale_loss: bool = True) -> Any:
    """The optimizer `model.compile` should use under TF 2.x's rules.

    Under a `Policy` with a loss scale, a plain optimizer is wrapped in a
    `tf_lso.experimental.LossScaleOptimizer` with a fresh copy of that loss
    scale. With `wrap_mixed_float16` on, a plain `'mixed_float16'` Keras
    policy wraps it in `tf_lso.LossScaleOptimizer` (TF 2.4). Loss scale
    optimizers are left alone, and so is a recompile with the same plain
    optimizer: the model keeps the loss scale optimizer that wraps it if
    that is the one these rules make (TF 2.4 and tf_keras wrapped it a
    second time, which raised).

    Args:
        model: The model being compiled.
        optimizer: What was passed to `compile` (an optimizer or a name).
        auto_scale_loss: `compile`'s argument of that name.

    Returns:
        The optimizer to compile with.
    """
    policy: Any = getattr(model, "dtype_policy", None)
    tf_lso_policy = _tf_lso_policy(model)
    wrap_v1 = tf_lso_policy is not None and tf_lso_policy.loss_scale is not None
    wrap_v2 = (
        not wrap_v1 and _switch["wrap_mixed_float16"] and auto_scale_loss
        and policy is not None and policy.name == "mixed_float16"
    )
    if not (wrap_v1 or wrap_v2):
        return optimizer
    optimizer = keras.optimizers.get(optimizer)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer
    previous: Any = getattr(model, "optimizer", None)
    if wrap_v2:
        if _wraps(previous, optimizer, v2.LossScaleOptimizer) and (
            previous.dynamic, previous.initial_scale,
            previous.dynamic_growth_steps,
        ) == (True, loss_scale_lib.DEFAULT_INITIAL_SCALE,
              loss_scale_lib.DEFAULT_GROWTH_STEPS):
            return previous
        # Named as Keras 3's compile names its own wrapper.
        return v2.LossScaleOptimizer(optimizer, name="loss_scale_optimizer")
    if _wraps(previous, optimizer, v1.LossScaleOptimizerV1) and (
        _describe(previous.loss_scale) == _describe(policy.loss_scale)
    ):
        return previous
    return v1.LossScaleOptimizerV1(optimizer, _fresh(policy.loss_scale))


def _wraps(previous: Any, optimizer: Any, cls: type[Any]) -> bool:
    return type(previous) is cls and previous.inner_optimizer is optimizer


def _describe(
        loss_scale: loss_scale_lib.LossScale) -> tuple[type, dict[str, Any]]:
    return type(loss_scale), loss_scale.get_config()


def _tf_lso_policy(model: Any) -> LossScalePolicy | None:
    """The model's dtype policy if it is a `LossScalePolicy`, else None."""
    policy = getattr(model, "dtype_policy", None)
    return policy if isinstance(policy, LossScalePolicy) else None


def _fresh(loss_scale: Any) -> Any:
    # Each model gets its own loss scale state (TF 2.1-2.3 shared one).
    if isinstance(loss_scale, loss_scale_lib.LossScale):
        return type(loss_scale).from_config(loss_scale.get_config())
    return loss_scale
