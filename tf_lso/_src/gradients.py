"""Finite checks and (un)scaling of gradient structures.

These are the only places where tf_lso touches every gradient, so the
per-variable cost of loss scaling is decided here.
"""

import tensorflow as tf


def _dense_values(grad):
    """The tensor whose entries must be finite: `.values` for IndexedSlices."""
    if isinstance(grad, tf.IndexedSlices):
        return grad.values
    return grad


def present_tensors(grads):
    """Flattens any nest of gradients, dropping `None` entries."""
    flat = tf.nest.flatten(grads)
    return [_dense_values(g) for g in flat if g is not None]


def local_nonfinite(grads):
    """Returns a float32 scalar: 0 if every gradient is finite, else 1.

    `None` gradients are ignored and an empty structure counts as finite.
    Integer gradients raise `InvalidArgumentError`, as TF's loss scales did.
    """
    tensors = present_tensors(grads)
    if not tensors:
        return tf.constant(0.0)
    finite = [tf.reduce_all(tf.math.is_finite(t)) for t in tensors]
    all_finite = finite[0] if len(finite) == 1 else tf.reduce_all(finite)
    return 1.0 - tf.cast(all_finite, tf.float32)


def all_finite(grads):
    """Returns a bool scalar tensor: True iff every replica's grads are finite.

    Without a distribution strategy this is a local check. In a replica
    context the per-replica verdicts are summed with one scalar all-reduce, so
    every replica (and every worker) gets the same answer. In a cross-replica
    context `grads` may hold per-replica values; each replica is checked and
    the verdicts are reduced the same way.
    """
    if not tf.distribute.has_strategy():
        return tf.equal(local_nonfinite(grads), 0.0)
    if tf.distribute.in_cross_replica_context():
        strategy = tf.distribute.get_strategy()
        per_replica = strategy.extended.call_for_each_replica(
            local_nonfinite, args=(grads,)
        )
        total = strategy.reduce(
            tf.distribute.ReduceOp.SUM, per_replica, axis=None
        )
    else:
        context = tf.distribute.get_replica_context()
        total = context.all_reduce(
            tf.distribute.ReduceOp.SUM, local_nonfinite(grads)
        )
    return tf.equal(total, 0.0)


def scale_by(value, factor):
    """Multiplies a tensor (any float dtype) by `factor` cast to its dtype."""
    value = tf.convert_to_tensor(value)
    return value * tf.cast(factor, value.dtype)


def multiply_gradients(grads, factor):
    """Multiplies every gradient by the float32 `factor` cast to its dtype.

    `None` entries stay `None`; `IndexedSlices` stay `IndexedSlices` (values
    scaled, indices and dense shape kept). Returns a list.
    """
    result = []
    for g in grads:
        if g is None:
            result.append(None)
        elif isinstance(g, tf.IndexedSlices):
            values = g.values * tf.cast(factor, g.values.dtype)
            result.append(tf.IndexedSlices(values, g.indices, g.dense_shape))
        else:
            g = tf.convert_to_tensor(g)
            result.append(g * tf.cast(factor, g.dtype))
    return result
