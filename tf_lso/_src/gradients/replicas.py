"""Every collective, and the `tf.distribute` rules of loss scaling: all
that replicas exchange goes through here."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_lso._src.gradients import packing

_SUPPORTED_STRATEGIES = (
    tf.distribute.MirroredStrategy,
    tf.distribute.OneDeviceStrategy,
    tf.distribute.MultiWorkerMirroredStrategy,
    tf.distribute.experimental.MultiWorkerMirroredStrategy,
    tf.compat.v1.distribute.MirroredStrategy,
    tf.compat.v1.distribute.OneDeviceStrategy,
    tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy,
)
_TPU_STRATEGIES = (
    tf.distribute.TPUStrategy,
    tf.distribute.experimental.TPUStrategy,
    tf.compat.v1.distribute.experimental.TPUStrategy,
)


def check_strategy_supported() -> None:
    """Raises ValueError if the current strategy cannot do loss scaling: it
    needs one variable copy per compute replica, so that each replica's
    gradients are unscaled once."""
    if not tf.distribute.has_strategy():
        return
    strategy = tf.distribute.get_strategy()
    if isinstance(strategy, _SUPPORTED_STRATEGIES):
        return
    if isinstance(strategy, _TPU_STRATEGIES):
        raise ValueError(
            "Loss scaling is not supported with TPUStrategy. Loss scaling is "
            "unnecessary with TPUs, since they support bfloat16 instead of "
            "float16 and bfloat16 does not require loss scaling. You should "
            "remove the use of the LossScaleOptimizer when TPUs are used."
        )
    raise ValueError(
        "Loss scaling is not supported with the tf.distribute.Strategy: "
        f"{type(strategy).__name__}. Try using a different Strategy, e.g. a "
        "MirroredStrategy or a MultiWorkerMirroredStrategy."
    )


def check_replica_context(method_name: str) -> None:
    """Raises ValueError when called in a cross-replica context."""
    if tf.distribute.in_cross_replica_context():
        raise ValueError(
            f"{method_name}() must be called in a replica context. Call it "
            "inside the function you pass to `strategy.run`."
        )


def replicas_in_sync() -> int:
    """How many replicas share each step (1 without a strategy)."""
    if not tf.distribute.has_strategy():
        return 1
    return tf.distribute.get_strategy().num_replicas_in_sync


def create_variables(fn: Callable[..., Any], *args: Any) -> Any:
    """Calls `fn(*args)` once, outside any replica and `tf.function`, to create
    optimizer variables on the first step: slots created inside `strategy.run`
    in a `tf.function` fail at run time."""
    if tf.distribute.has_strategy() and (
        not tf.distribute.in_cross_replica_context()
    ):

        def merge_fn(strategy: Any, *args: Any) -> Any:
            with tf.init_scope():
                return fn(*args)

        return tf.distribute.get_replica_context().merge_call(
            merge_fn, args=args
        )
    return fn(*args)


def summed(fn: Callable[..., tf.Tensor], *args: Any) -> tf.Tensor:
    """`fn(*args)` summed over every replica: the one cross-replica sum. In a
    cross-replica context `args` hold per-replica values and `fn` runs for
    each."""
    if not tf.distribute.has_strategy():
        return fn(*args)
    if tf.distribute.in_cross_replica_context():
        strategy = tf.distribute.get_strategy()
        per_replica = strategy.extended.call_for_each_replica(fn, args=args)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                               axis=None)
    context = tf.distribute.get_replica_context()
    return context.all_reduce(tf.distribute.ReduceOp.SUM, fn(*args))


def all_finite(grads: Any) -> tf.Tensor:
    """A bool scalar tensor, True iff every replica's `grads` (a nest or a
    `packing.Packed`) are finite; every replica gets the same answer."""
    if isinstance(grads, packing.Packed):
        return tf.equal(summed(packing.nonfinite, grads.values), 0.0)
    return tf.equal(summed(packing.local_nonfinite, grads), 0.0)


def all_reduced(packed: packing.Packed) -> packing.Packed:
    """A `Packed` whose values but the `raw` ones are summed over all replicas,
    in one `all_reduce` (call it in a replica context)."""
    context = tf.distribute.get_replica_context()
    return packed.with_sums(
        context.all_reduce(tf.distribute.ReduceOp.SUM, packed.summands()))


def in_cross_replica_context(fn: Callable[..., Any], *args: Any) -> Any:
    """Calls `fn(*args)` once, in a cross-replica context.

    From a replica context it goes through `merge_call`, so `args` arrive per
    replica (see `first_replica`). It does what a replica may not, such as a
    cond around `strategy.extended.update`. Do not call it inside a cond in a
    replica context.
    """
    if tf.distribute.has_strategy() and (
        not tf.distribute.in_cross_replica_context()
    ):
        return tf.distribute.get_replica_context().merge_call(
            lambda _, *args: fn(*args), args=args)
    return fn(*args)


def first_replica(value: Any) -> Any:
    """The first replica's copy of `value` in a cross-replica context
    (for values every replica computes alike); elsewhere `value`."""
    if tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context():
        return tf.distribute.get_strategy().experimental_local_results(
            value)[0]
    return value


def in_v1_graph() -> bool:
    """Whether ops go into a `tf.compat.v1` graph (a Session's), where only
    what a fetched op depends on runs, and nothing orders stateful ops."""
    return not tf.executing_eagerly() and not tf.inside_function()


def cond_on_all_replicas(pred: bool | tf.Tensor, true_fn: Callable[..., Any],
                         false_fn: Callable[..., Any], args: Sequence[Any],
                         false_args: Sequence[Any] = ()) -> Any:
    """Runs `true_fn(*args)` on every replica if `pred`, else `false_fn`.

    `pred` must be the same on every replica (`all_finite` makes it so), so
    that all replicas issue the same collectives. Under a strategy the cond
    is built in a cross-replica context, because a branch that calls
    `merge_call` (as `apply_gradients` does) may not sit in a replica
    context's cond. `false_fn(*false_args)` then runs once, with per-replica
    `false_args`, for a Python False too.

    Returns:
        For a Python bool, what the branch returned. In a `tf.compat.v1`
        graph, the op that runs the chosen branch's returned ops. Else None.
    """
    if pred is True:
        return true_fn(*args)
    if pred is False:
        return in_cross_replica_context(false_fn, *false_args)
    if not tf.distribute.has_strategy():
        return _lowered_cond(pred, lambda: true_fn(*args),
                             lambda: false_fn(*false_args))
    split = len(args)

    def merge_fn(strategy: Any, pred: Any, *all_args: Any) -> Any:
        pred = strategy.experimental_local_results(pred)[0]
        return _lowered_cond(
            pred,
            lambda: strategy.experimental_local_results(
                strategy.extended.call_for_each_replica(
                    true_fn, args=all_args[:split])),
            lambda: false_fn(*all_args[split:]),
        )

    return tf.distribute.get_replica_context().merge_call(
        merge_fn, args=(pred,) + tuple(args) + tuple(false_args)
    )


def _lowered_cond(pred: tf.Tensor, true_fn: Callable[[], Any],
                  false_fn: Callable[[], Any]) -> Any:
    """`tf.cond`, lowered to Switch/Merge ops in a graph; its output runs
    the branch's ops in a `tf.compat.v1` graph, else it is None.

    Lowered, the apply branch is part of the step's graph, so Grappler
    rewrites the update as it rewrites a bare optimizer's, and a kept step
    is bit-equal to the bare step. As one If op, Adagrad, Ftrl and RMSprop
    came out a few ulps apart (docs/performance.md).
    """
    if not in_v1_graph():
        tf.cond(pred, lambda: _none(true_fn()), lambda: _none(false_fn()))
        return None
    return tf.cond(pred, lambda: grouped(true_fn()),
                   lambda: grouped(false_fn()))


def _none(_: Any) -> None:
    return None


def grouped(result: Any) -> tf.Operation:
    """One op that runs every op or tensor in `result` (None entries skipped)."""
    return tf.group(*[t for t in tf.nest.flatten(result) if t is not None])


def assign_state(assignments: Sequence[tuple[tf.Variable, Any]]) -> list[Any]:
    """Assigns each value to its `state_variable`, once per step.

    Every replica computes the same values. A variable made in the
    strategy's scope takes the first replica's write. One made outside it
    is shared by all replicas, so it is written once, in a cross-replica
    context. Returns the assign ops (None entries eagerly).
    """

    def assign(*values: Any) -> list[Any]:
        return [variable.assign(first_replica(value), read_value=False)
                for (variable, _), value in zip(assignments, values)]

    values = [value for _, value in assignments]
    if tf.distribute.has_strategy() and not all(
            tf.distribute.get_strategy().extended.variable_created_in_scope(
                variable) for variable, _ in assignments):
        return in_cross_replica_context(assign, *values)
    return assign(*values)


def state_variable(initial_value: Any, dtype: tf.DType,
                   name: str) -> tf.Variable:
    """A non-trainable variable that every replica sets to the same value."""
    # Every replica computes the same value (the finite check is reduced
    # first), so the first replica's write is everyone's. This aggregation,
    # unlike NONE, allows assigning in a replica context.
    return tf.Variable(
        initial_value,
        dtype=dtype,
        name=name,
        trainable=False,
        synchronization=tf.VariableSynchronization.ON_WRITE,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )
