"""tf_lso's loss scale optimizers as tf_keras's `Model.compile` takes them.

On the legacy-Keras route (`TF_USE_LEGACY_KERAS=1`) `tf.keras` is tf_keras
2.x, whose `compile` accepts only tf_keras optimizer classes. tf_lso's
optimizers are Keras 3 classes; around a tf_keras optimizer they already
train it in custom loops (the tf_keras kinds). For `compile` and `fit`, a
`TfKerasLossScaleOptimizer` *face* stands in front of one: a tf_keras
optimizer (and a tf_keras `LossScaleOptimizer`, so that `compile` never
wraps it again) that forwards every call to the tf_lso optimizer behind it.
The rules stay in one place: the face holds no state and decides nothing.
Like `checkpointing.LayoutCheckpointing`, it answers TensorFlow's Trackable
protocol itself (`tf.__internal__.tracking.DelegatingTrackableMixin`, as
tf_keras's own loss scale optimizers do, and slot restores), by handing it
to the tf_lso optimizer: a checkpoint sees TF 2.4's layout.

While the compile hook is enabled (`tf_lso.install()`, `set_policy`),
tf_keras's `Model.compile`

* puts a face in front of a tf_lso optimizer passed to it, so that
  `model.optimizer` and the user's optimizer share everything;
* under a `tf_lso.experimental.Policy` with a loss scale (TF 2.1-2.3), wraps
  a plain tf_keras optimizer in `tf_lso.experimental.LossScaleOptimizer`
  with that loss scale, as TF 2.1-2.3's `compile` did (a policy whose loss
  scale is None: a fixed scale of 1, which scales nothing, so that
  tf_keras's own `compile` does not wrap it in a dynamic one).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from tf_lso._src import compat
from tf_lso._src.inner import inner_optimizer as inner_lib
from tf_lso._src.optimizer import config as optimizer_config
from tf_lso._src.optimizer import experimental_loss_scale_optimizer as v1
from tf_lso._src.optimizer import loss_scale_optimizer as v2
from tf_lso._src.scaling import loss_scale as loss_scale_lib

# The tf_lso optimizer class behind a face, by the name its config keeps.
_CORES: dict[str, type[v2.LossScaleOptimizer]] = {
    "LossScaleOptimizer": v2.LossScaleOptimizer,
    "LossScaleOptimizerV1": v1.LossScaleOptimizerV1}


@functools.cache
def face_class() -> type[Any]:
    """The face class, made (and registered with tf_keras) on first use.

    tf_keras is optional and imported only by users who chose it.
    """

    tf_keras = compat.tf_keras_module() or importlib.import_module("tf_keras")
    base = tf_keras.mixed_precision.LossScaleOptimizer
    legacy = tf_keras.optimizers.legacy.Optimizer

    # Bases known only at run time: mypy takes the class as of unknown bases.
    @tf_keras.saving.register_keras_serializable(package="tf_lso")
    class TfKerasLossScaleOptimizer(
        compat.DelegatingTrackableMixin,
        legacy, base,  # type: ignore[valid-type, misc]
    ):
        """A tf_lso loss scale optimizer, as tf_keras's `compile` takes it.

        Everything is the tf_lso optimizer's (`core`): the loss scale, the
        inner optimizer, `iterations`, checkpoints (the same TF 2.4 layout),
        tf_lso's additions (`skipped_steps`, `last_overflow`, ...).

        Args:
            core: A `tf_lso.LossScaleOptimizer` or
                `tf_lso.experimental.LossScaleOptimizer` around a tf_keras
                optimizer.
        """

        def __init__(self, core: v2.LossScaleOptimizer) -> None:
            # As tf_keras's own loss scale optimizers, without the optimizer
            # base's __init__: the state is the core's.
            object.__setattr__(self, "_core", core)
            compat.DelegatingTrackableMixin.__init__(self, core)

        @property
        def core(self) -> v2.LossScaleOptimizer:
            """The tf_lso optimizer behind this face."""
            return self._core

        def __getattr__(self, name: str) -> Any:
            if name.startswith("_"):
                raise AttributeError(name)
            return getattr(self._core, name)

        def __setattr__(self, name: str, value: Any) -> None:
            # Not OptimizerV2's, which looks for hyperparameters the face
            # does not have; `lr`, `learning_rate` and `iterations` reach
            # the core through their property setters.
            object.__setattr__(self, name, value)

        def __dir__(self) -> list[str]:
            return sorted(set(super().__dir__()) | set(dir(self._core)))

        def __repr__(self) -> str:
            return f"<TfKerasLossScaleOptimizer of {self._core!r}>"

        # tf_keras's LossScaleOptimizer API (its stubs raise otherwise).
        dynamic = property(lambda self: self._core.dynamic)
        loss_scale = property(lambda self: self._core.loss_scale)
        dynamic_counter = property(lambda self: self._core.dynamic_counter)
        initial_scale = property(lambda self: self._core.initial_scale)
        dynamic_growth_steps = property(
            lambda self: self._core.dynamic_growth_steps)
        inner_optimizer = property(lambda self: self._core.inner_optimizer)

        def get_scaled_loss(self, loss: Any) -> Any:
            return self._core.get_scaled_loss(loss)

        def get_unscaled_gradients(self, grads: Any) -> Any:
            return self._core.get_unscaled_gradients(grads)

        # What tf_keras's fit, callbacks and saving call.
        def minimize(self, loss: Any, var_list: Any, grad_loss: Any = None,
                     name: str | None = None, tape: Any = None) -> Any:
            return self._core.minimize(loss, var_list, grad_loss=grad_loss,
                                       name=name, tape=tape)

        def apply_gradients(
                self, grads_and_vars: Any, name: str | None = None,
                experimental_aggregate_gradients: bool = True) -> Any:
            return self._core.apply_gradients(
                grads_and_vars, name=name,
                experimental_aggregate_gradients=(
                    experimental_aggregate_gradients))

        def get_gradients(self, loss: Any, params: Any) -> Any:
            return self._core.get_gradients(loss, params)

        @property
        def iterations(self) -> Any:
            return self._core.iterations

        @iterations.setter
        def iterations(self, value: Any) -> None:
            self._core.iterations = value

        @property
        def learning_rate(self) -> Any:
            return self._core.learning_rate

        @learning_rate.setter
        def learning_rate(self, value: Any) -> None:
            self._core.learning_rate = value

        lr = learning_rate

        def _inner(self) -> Any:
            return self._core.inner_optimizer

        @property
        def weights(self) -> list[Any]:
            inner = self._inner()
            if isinstance(inner, legacy):
                return inner.weights
            return list(inner.variables)

        def variables(self) -> list[Any]:
            return self.weights

        def get_weights(self) -> list[Any]:
            return [w.numpy() for w in self.weights]

        def set_weights(self, weights: Any) -> Any:
            inner = self._inner()
            if isinstance(inner, legacy):
                return inner.set_weights(weights)
            for variable, value in zip(inner.variables, weights):
                variable.assign(value)
            return None

        def _create_all_weights(self, var_list: Any) -> None:
            self._core.build(var_list)

        def get_slot_names(self) -> list[str]:
            # Only legacy (OptimizerV2) inner optimizers have slot names.
            return getattr(self._inner(), "get_slot_names", list)()

        def get_slot(self, var: Any, slot_name: str) -> Any:
            return self._inner().get_slot(var, slot_name)

        # Slot restores reach the face (the optimizer in the object graph):
        # the core's checkpointing handles them, as for the core itself.
        def _create_or_restore_slot_variable(self, *args: Any,
                                             **kwargs: Any) -> Any:
            return self._core._create_or_restore_slot_variable(
                *args, **kwargs)

        def finalize_variable_values(self, var_list: Any) -> None:
            self._core.finalize_variable_values(var_list)

        def get_config(self) -> dict[str, Any]:
            """The tf_lso optimizer's config, with its class's name."""
            return {"core_class": type(self._core).__name__,
                    **self._core.get_config()}

        @classmethod
        def from_config(cls, config: dict[str, Any],
                        custom_objects: dict[str, Any] | None = None) -> Any:
            """A face in front of a new tf_lso optimizer from `config`."""
            config = dict(config)
            core_class = _CORES[config.pop("core_class",
                                           "LossScaleOptimizer")]
            key = optimizer_config.inner_optimizer_key(config)
            inner = config.get(key)
            if isinstance(inner, dict) and "module" not in inner:
                # tf_keras's legacy serialization (SavedModel metadata)
                # drops the module: the inner optimizer is tf_keras's.
                config[key] = tf_keras.optimizers.deserialize(
                    inner, custom_objects=custom_objects)
            return cls(core_class.from_config(config,
                                              custom_objects=custom_objects))

    return TfKerasLossScaleOptimizer


def is_face(optimizer: Any) -> bool:
    """Whether `optimizer` is a face (only if one was ever made)."""
    return (face_class.cache_info().currsize > 0
            and isinstance(optimizer, face_class()))


def compile_optimizer(model: Any, optimizer: Any, policy: Any = None) -> Any:
    """The optimizer tf_keras's `model.compile` should get.

    Args:
        model: The tf_keras model being compiled.
        optimizer: What was passed to `compile`.
        policy: The global TF 2.1-2.3 `Policy` (one with a `loss_scale`), or
            None. It applies to a model whose dtype policy has its name.

    Returns:
        A face in front of a tf_lso optimizer, or `optimizer` unchanged.

    Raises:
        TypeError: For a tf_lso optimizer around a Keras 3 optimizer, which
            a tf_keras model cannot train.
    """
    if isinstance(optimizer, v2.LossScaleOptimizer):
        if not _is_tf_keras_kind(inner_lib.kind_of(optimizer.inner_optimizer)):
            inner = type(optimizer.inner_optimizer)
            raise TypeError(
                "A tf_keras model (tf.keras is tf_keras here: "
                "TF_USE_LEGACY_KERAS=1) cannot be trained by a Keras 3 "
                f"optimizer. Received: optimizer={optimizer!r} around a "
                f"{inner.__module__}.{inner.__name__}. Wrap a tf.keras "
                "optimizer instead, e.g. "
                "tf_lso.LossScaleOptimizer(tf.keras.optimizers.SGD(...))."
            )
        return face_class()(optimizer)
    model_policy = getattr(model, "dtype_policy", None)
    if policy is None or model_policy is None or (
            model_policy.name != policy.name):
        return optimizer
    loss_scale = policy.loss_scale
    if loss_scale is None and policy.name != "mixed_float16":
        return optimizer
    tf_keras = compat.tf_keras_module()
    assert tf_keras is not None  # Its compile calls this.
    optimizer = tf_keras.optimizers.get(optimizer)
    if isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer):
        return optimizer
    previous: Any = getattr(model, "optimizer", None)
    if is_face(previous) and previous.core.inner_optimizer is optimizer:
        return previous  # A recompile with the same optimizer.
    if loss_scale is None:
        # TF 2.1-2.3: no loss scaling. A fixed scale of 1 changes nothing
        # (x * 1 and x / 1 are exact) and keeps tf_keras's compile from
        # wrapping the optimizer in a dynamic one under 'mixed_float16'.
        loss_scale = loss_scale_lib.FixedLossScale(1)
    elif isinstance(loss_scale, loss_scale_lib.LossScale):
        # Each model its own loss scale state (TF 2.1-2.3 shared one).
        loss_scale = type(loss_scale).from_config(loss_scale.get_config())
    return face_class()(v1.LossScaleOptimizerV1(optimizer, loss_scale))


def _is_tf_keras_kind(kind: type | None) -> bool:
    # Imported here: the kinds' modules register their kinds when imported,
    # and `inner_optimizer.kinds()` imports them first, in a set order
    # (which the messages that list kinds follow).
    from tf_lso._src.inner.kinds import tf_keras as tf_keras_kinds

    return kind is not None and issubclass(kind, tf_keras_kinds.TfKerasKind)


def is_tf_keras_kind(inner: inner_lib.InnerOptimizer) -> bool:
    """Whether an `InnerOptimizer` wraps a tf_keras optimizer."""
    return _is_tf_keras_kind(type(inner))
