"""The three kinds of inner optimizer, and the one place that picks among them.

An optimizer is of the kind in `KINDS` that accepts it, and a config is of
the kind that reads it. The kinds take disjoint sets of optimizers, so their
order only sets how messages list them. A config that no kind reads is a
Keras 3 optimizer's, since Keras 3 also reads TF 2.x's configs.
"""

from __future__ import annotations

import typing
import weakref

import keras
import tensorflow as tf

from tf_lso._src import compat
from tf_lso._src.inner import inner_optimizer
from tf_lso._src.inner.kinds import keras_optimizer
from tf_lso._src.inner.kinds import tf_keras as tf_keras_kinds

Kind = type[inner_optimizer.InnerOptimizer]

KINDS: tuple[Kind, ...] = (
    keras_optimizer.KerasInner,
    tf_keras_kinds.TfKerasInner,
    tf_keras_kinds.TfKerasLegacyInner,
)

# The optimizers that a loss scale optimizer wraps. An entry lives as long
# as its optimizer.
_claimed: weakref.WeakSet[typing.Any] = weakref.WeakSet()


def _kind_of(optimizer: typing.Any) -> Kind | None:
    return next((kind for kind in KINDS if kind.accepts(optimizer)), None)


def is_loss_scale_optimizer(optimizer: typing.Any) -> bool:
    """Whether `optimizer` is a Keras 3 or tf_keras loss scale optimizer."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return True
    tf_keras = compat.tf_keras_module()
    return tf_keras is not None and isinstance(
        optimizer, tf_keras.mixed_precision.LossScaleOptimizer
    )


def is_supported(optimizer: typing.Any) -> bool:
    """Whether `optimizer` is of a kind that a loss scale optimizer wraps."""
    return (not is_loss_scale_optimizer(optimizer)
            and _kind_of(optimizer) is not None)


def wrapper_class(wrapper: type, optimizer: typing.Any) -> type:
    """The class of a `wrapper` around `optimizer`: the kind decides.

    It is `wrapper` itself for an optimizer that `wrap` refuses, so that the
    constructor can say why.
    """
    kind = _kind_of(optimizer)
    if kind is None or is_loss_scale_optimizer(optimizer):
        return wrapper
    return kind.wrapper_class(wrapper)


def register_with_tf_keras(*wrappers: type) -> None:
    """Lets tf_keras's `load_model` find `wrappers` in files."""
    for wrapper in wrappers:
        tf_keras_kinds.register(wrapper)


def _or(items: list[str]) -> str:
    """`"a, b or c"`."""
    *rest, last = items
    return f"{', '.join(rest)} or {last}" if rest else last


def describe_kinds() -> str:
    """What every kind wraps, for messages: `"A, B or C"`."""
    return _or([f"{kind.optimizer_class} ({kind.noun})" for kind in KINDS])


def wrap(optimizer: typing.Any, argument_name: str) -> inner_optimizer.InnerOptimizer:
    """Returns the `InnerOptimizer` for `optimizer`, or raises.

    Args:
        optimizer: The optimizer to wrap.
        argument_name: The constructor argument it came from, for messages.

    Raises:
        TypeError: If `optimizer` is a loss scale optimizer, or not an
            optimizer of a supported kind.
        ValueError: If it scales the loss itself (Keras 3's
            `loss_scale_factor`), or another loss scale optimizer wraps it.
    """
    if is_loss_scale_optimizer(optimizer):
        raise TypeError(
            "LossScaleOptimizer cannot wrap another LossScaleOptimizer, but "
            f"got: {optimizer!r}. Wrap its inner optimizer instead (e.g. "
            f"`{argument_name}=opt.inner_optimizer`)."
        )
    factor = getattr(optimizer, "loss_scale_factor", None)
    if factor is not None:
        raise ValueError(
            "The inner optimizer already scales the loss: it has "
            f"loss_scale_factor={factor}. Set `loss_scale_factor=None` on "
            "it, or use LossScaleOptimizer(opt, dynamic=False, "
            "initial_scale=...)."
        )
    kind = _kind_of(optimizer)
    if kind is None:
        raise TypeError(
            f'"{argument_name}" must be an instance of {describe_kinds()}, '
            f"but got: {optimizer!r} of type {type(optimizer).__name__}."
        )
    # Only optimizers are looked up: not every object is hashable.
    if optimizer in _claimed:
        # Two wrappers would share the step counter and the slots, and one
        # checkpoint could not hold both.
        raise ValueError(
            '"inner_optimizer" is already wrapped by a LossScaleOptimizer. '
            "An optimizer can only be wrapped by a single LossScaleOptimizer. "
            f"Received: {argument_name}={optimizer!r}. Use the loss scale "
            "optimizer that wraps it (after `model.compile`: "
            "`model.optimizer`), or wrap a new optimizer."
        )
    return kind(optimizer)


def claim(inner: inner_optimizer.InnerOptimizer) -> None:
    """Marks `inner`'s optimizer as wrapped, so that `wrap` refuses it.

    The constructor calls it last: a failed construction leaves the
    optimizer free.
    """
    _claimed.add(inner.optimizer)


def v1_graph_error(inner: inner_optimizer.InnerOptimizer) -> RuntimeError:
    """The error for `inner` in a `tf.compat.v1` graph run by a Session,
    where only some kinds update variables (`runs_in_v1_graph`)."""
    wanted = _or([f"{kind.noun} ({kind.optimizer_class})"
                  for kind in KINDS if kind.runs_in_v1_graph])
    return RuntimeError(
        "In a tf.compat.v1 graph (run by a Session), the inner "
        f"optimizer must be {wanted}: other optimizers do not update "
        f"variables there. Received: inner_optimizer={inner.optimizer!r}."
        " Use one, or train eagerly or in a tf.function."
    )


def deserialize(config: typing.Any,
                custom_objects: dict | None = None) -> typing.Any:
    """Creates an optimizer from a serialized inner optimizer.

    Args:
        config: A serialized optimizer dict, or an optimizer instance
            (returned as it is).
        custom_objects: Optional dict of custom classes.

    Returns:
        An optimizer.
    """
    if not isinstance(config, dict):
        return config
    # Keras's deserialize functions edit the dict they get (they lower-case
    # `class_name`). The caller's config stays as it was: this copies every
    # dict and list, and keeps the values.
    config = tf.nest.map_structure(lambda value: value, config)
    kind = next((kind for kind in KINDS if kind.reads_config(config)),
                keras_optimizer.KerasInner)
    return kind.deserialize(config, custom_objects)
