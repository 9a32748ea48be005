"""Which kind an optimizer is of, and the one place that wraps it.

`KINDS` lists every kind of inner optimizer, in one ordered tuple: an
optimizer (a serialized config) is of the first kind that accepts (reads)
it, and a config that no kind reads is a Keras 3 optimizer's (Keras 3 reads
TF 2.x's configs too). The built-in kinds take disjoint sets of optimizers,
so their order only decides how messages list them; a kind for a subclass
of another kind's optimizers goes before that kind. Adding a kind is a
module in `kinds/` and its entry here.

`LossScaleOptimizer` never asks which kind it holds: `wrap` and
`deserialize` choose, here and nowhere else.
"""

from __future__ import annotations

import typing
import weakref

import keras
import tensorflow as tf

from tf_lso._src import compat
from tf_lso._src.gradients import replicas
from tf_lso._src.inner import inner_optimizer
from tf_lso._src.inner.kinds import keras_optimizer
from tf_lso._src.inner.kinds import tf_keras as tf_keras_kinds

Kind = type[inner_optimizer.InnerOptimizer]

KINDS: tuple[Kind, ...] = (
    keras_optimizer.KerasInner,
    tf_keras_kinds.TfKerasInner,
    tf_keras_kinds.TfKerasLegacyInner,
)

# The optimizers that a loss scale optimizer wraps (see `claim`); an entry
# goes with its optimizer.
_claimed: weakref.WeakSet[typing.Any] = weakref.WeakSet()


def kind_of(optimizer: typing.Any) -> Kind | None:
    """The first of `KINDS` that accepts `optimizer`, or None."""
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
    """Whether `optimizer` is of a kind a loss scale optimizer can wrap."""
    return (not is_loss_scale_optimizer(optimizer)
            and kind_of(optimizer) is not None)


def wrapper_class(wrapper: type, optimizer: typing.Any) -> type:
    """The class a loss scale optimizer of class `wrapper` around
    `optimizer` is made of: the kind's `wrapper_class(wrapper)`; `wrapper`
    itself for anything `wrap` refuses (its constructor says why)."""
    kind = kind_of(optimizer)
    if kind is None or is_loss_scale_optimizer(optimizer):
        return wrapper
    return kind.wrapper_class(wrapper)


def _described(kind: Kind, noun_first: bool = False) -> str:
    """`"class (noun)"` (or `"noun (class)"`), or the kind's class name.

    Only what the kind sets itself: a subclass of a kind describes itself
    by its name until it says what it accepts.
    """
    optimizer_class = vars(kind).get("optimizer_class")
    if optimizer_class is None:
        return kind.__name__
    if noun_first:
        return f"{kind.noun} ({optimizer_class})"
    return f"{optimizer_class} ({kind.noun})"


def _or(items: list[str]) -> str:
    """`"a, b or c"` (each item once)."""
    items = list(dict.fromkeys(items))
    if len(items) < 2:
        return "".join(items)
    return f"{', '.join(items[:-1])} or {items[-1]}"


def describe_kinds() -> str:
    """Every kind's description, for messages: `"A, B or C"`."""
    return _or([_described(kind) for kind in KINDS])


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
    kind = kind_of(optimizer)
    if kind is None:
        raise TypeError(
            f'"{argument_name}" must be an instance of {describe_kinds()}, '
            f"but got: {optimizer!r} of type {type(optimizer).__name__}."
        )
    # Only optimizers are looked up: not every object is hashable.
    if optimizer in _claimed:
        # TF 2.6+'s error: the two would share the step counter and slots,
        # and a checkpoint could not hold both.
        raise ValueError(
            '"inner_optimizer" is already wrapped by a LossScaleOptimizer. '
            "An optimizer can only be wrapped by a single LossScaleOptimizer. "
            f"Received: {argument_name}={optimizer!r}. Use the loss scale "
            "optimizer that wraps it (after `model.compile`: "
            "`model.optimizer`), or wrap a new optimizer."
        )
    return kind(optimizer)


def claim(inner: inner_optimizer.InnerOptimizer) -> None:
    """Marks `inner`'s optimizer as wrapped; `wrap` refuses it from now on.

    Called once a loss scale optimizer is fully constructed, so a failed
    construction leaves the optimizer free (TF 2.6 marked it first).
    """
    _claimed.add(inner.optimizer)


def check_graph(inner: inner_optimizer.InnerOptimizer) -> None:
    """Raises RuntimeError where `inner`'s optimizer cannot run a step.

    In a `tf.compat.v1` graph (run by a Session), only the kinds that set
    `runs_in_v1_graph` update variables (OptimizerV2, the optimizer TF 2.4
    wrapped); then the kind's own `check_graph`.
    """
    if not inner.runs_in_v1_graph and replicas.in_v1_graph():
        # E.g. "a tf_keras legacy optimizer (`tf_keras.optimizers.legacy.
        # Optimizer`)", TF 2.x's OptimizerV2, as TF 2.4 wrapped.
        wanted = _or([_described(kind, noun_first=True) for kind in KINDS
                      if kind.runs_in_v1_graph]) or "no kind here"
        raise RuntimeError(
            "In a tf.compat.v1 graph (run by a Session), the inner "
            f"optimizer must be {wanted}: other optimizers do not update "
            f"variables there. Received: inner_optimizer={inner.optimizer!r}."
            " Use one, or train eagerly or in a tf.function."
        )
    inner.check_graph()


def deserialize(config: typing.Any,
                custom_objects: dict | None = None) -> typing.Any:
    """Creates an optimizer from a serialized inner optimizer.

    The first of `KINDS` that reads the config builds it; a config none of
    them reads is a Keras 3 optimizer's (TF 2.x's configs included).

    Args:
        config: A serialized optimizer dict, or an optimizer instance
            (returned as it is).
        custom_objects: Optional dict of custom classes.

    Returns:
        An optimizer.
    """
    if not isinstance(config, dict):
        return config
    # Keras's deserialize functions edit the dict they are given (they
    # lower-case `class_name`); the caller's config stays as it was: new
    # dicts and lists all the way down, the same values.
    config = tf.nest.map_structure(lambda value: value, config)
    kind = next((kind for kind in KINDS if kind.reads_config(config)),
                keras_optimizer.KerasInner)
    return kind.deserialize(config, custom_objects)
