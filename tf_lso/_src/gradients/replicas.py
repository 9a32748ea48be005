"""Every collective, and the `tf.distribute` rules of loss scaling.

Everything tf_lso communicates between replicas goes through here: the one
cross-replica sum (`summed`: the finite verdict, the offending variables of
a skipped step), the one all-reduce of gradients (`all_reduced`), the skip
cond that every replica takes alike, and the state variables that every
replica writes alike. Also which strategies are supported.
"""

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
    """Raises ValueError if the current strategy cannot do loss scaling.

    Loss scaling needs one variable copy per compute replica, so that each
    replica's gradients are unscaled once: true for the default strategy,
    `OneDeviceStrategy`, `MirroredStrategy` and `MultiWorkerMirroredStrategy`.
    """
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
    """Calls `fn(*args)` once, outside any replica and any `tf.function`.

    For creating optimizer variables on the first step: created lazily inside
    `strategy.run` in a `tf.function`, Keras optimizer slots fail at run time
    ("You must feed a value for placeholder tensor"). A `merge_call` plus
    `tf.init_scope` creates them eagerly as proper mirrored variables.
    """
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
    """`fn(*args)` summed over every replica: the one cross-replica sum.

    Without a strategy just `fn(*args)`. In a replica context, one
    all-reduce of this replica's `fn(*args)`. In a cross-replica context
    `args` hold per-replica values (as `false_fn`'s arguments in
    `cond_on_all_replicas` do): `fn` runs for each replica, and the results
    are reduced.
    """
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
    """Returns a bool scalar tensor: True iff every replica's grads are finite.

    Without a distribution strategy this is a local check. In a replica
    context the per-replica verdicts are summed with one scalar all-reduce, so
    every replica (and every worker) gets the same answer. In a cross-replica
    context `grads` may hold per-replica values; each replica is checked and
    the verdicts are reduced the same way.

    Args:
        grads: A nest of gradients, or a `packing.Packed` (checked without
            packing it again).
    """
    if isinstance(grads, packing.Packed):
        return tf.equal(summed(packing.nonfinite, grads.values), 0.0)
    return tf.equal(summed(packing.local_nonfinite, grads), 0.0)


def all_reduced(packed: packing.Packed) -> packing.Packed:
    """Returns a `Packed` whose values are summed over all replicas.

    Must be called in a replica context. One `all_reduce` carries every
    value (stacks included) but the `raw` ones, which each replica keeps;
    `IndexedSlices` stay sparse.
    """
    context = tf.distribute.get_replica_context()
    return packed.with_sums(
        context.all_reduce(tf.distribute.ReduceOp.SUM, packed.summands()))


def in_cross_replica_context(fn: Callable[..., Any], *args: Any) -> Any:
    """Calls `fn(*args)` once, in a cross-replica context.

    From a replica context through `merge_call`: every replica waits for
    the others, and `args` arrive as per-replica values (see
    `first_replica`). For what a replica may not do itself, such as a cond
    around `strategy.extended.update` (a `merge_call` inside a cond fails in
    a `tf.function` under MirroredStrategy). Must not be called inside a
    cond in a replica context.
    """
    if tf.distribute.has_strategy() and (
        not tf.distribute.in_cross_replica_context()
    ):
        return tf.distribute.get_replica_context().merge_call(
            lambda _, *args: fn(*args), args=args)
    return fn(*args)


def first_replica(value: Any) -> Any:
    """The first replica's copy of `value` in a cross-replica context.

    For values that every replica computes alike (the loss scale), passed
    to `false_fn` in `cond_on_all_replicas`; elsewhere `value` itself.
    """
    if tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context():
        return tf.distribute.get_strategy().experimental_local_results(
            value)[0]
    return value


def in_v1_graph() -> bool:
    """Whether ops are being added to a `tf.compat.v1` graph (a Session's).

    There only what a fetched op depends on runs, and nothing orders
    stateful ops (no eager execution, no automatic control dependencies as
    in a `tf.function`). Ask before building a cond: its branches are
    functions.
    """
    return not tf.executing_eagerly() and not tf.inside_function()


def cond_on_all_replicas(pred: bool | tf.Tensor, true_fn: Callable[..., Any],
                         false_fn: Callable[..., Any], args: Sequence[Any],
                         false_args: Sequence[Any] = ()) -> Any:
    """Runs `true_fn(*args)` on every replica if `pred`, else `false_fn`.

    `pred` must have the same value on every replica (`all_finite`
    guarantees that), so every replica issues the same collectives. A Python
    bool needs no cond at all.

    Under a strategy, the cond is built in a cross-replica context (via
    `merge_call`), because a branch that calls `merge_call` itself (as an
    optimizer's `apply_gradients` does) is not allowed inside a cond in a
    replica context. `false_fn(*false_args)` then runs once, in the
    cross-replica context, with per-replica `false_args` (see `summed`).

    Returns:
        In a `tf.compat.v1` graph, what runs the chosen branch: a branch
        must return every op it wants run there. Elsewhere, for a Python
        bool, what the branch returned; otherwise None.
    """
    if isinstance(pred, bool):
        return true_fn(*args) if pred else false_fn(*false_args)
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
    """`tf.cond`, lowered to Switch/Merge ops in a graph, as TF 2.4's was.

    Lowered, the apply branch is part of the step's graph, so Grappler
    rewrites the inner optimizer's update exactly as it rewrites a bare
    optimizer's, and a kept step is bit-equal to the bare step. Kept as one
    If op (tried for speed, docs/performance.md), the branch was a separate
    function that Grappler rewrote differently: Adagrad, Ftrl and RMSprop
    updates came out a few ulps apart. XLA never lowers a cond.

    In a `tf.compat.v1` graph each branch returns its ops, grouped, and the
    cond's output runs them; elsewhere the branches return nothing.
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

    Every replica computes the same values. A state variable made in the
    strategy's scope takes the first replica's write. One made outside it
    (a loss scale optimizer made before `strategy.scope()`) is a single
    variable that every replica shares: in a replica context it is written
    once, in a cross-replica context, as TF 2.4 updated its loss scales.

    Args:
        assignments: `(variable, value)` pairs.

    Returns:
        The assign ops (None entries eagerly).
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
    # Every replica computes the same new value (the finite check is reduced
    # across replicas first), so the first replica's write is everyone's.
    # That lets `update` assign in a replica context, which TF's NONE
    # aggregation forbade.
    return tf.Variable(
        initial_value,
        dtype=dtype,
        name=name,
        trainable=False,
        synchronization=tf.VariableSynchronization.ON_WRITE,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )
