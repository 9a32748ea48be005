"""Packing gradients: finite checks and (un)scaling of gradient lists.

Here tf_lso touches every gradient, so the per-variable cost of loss
scaling is decided here. Every collective is in `replicas`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import weakref
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import Optional
from typing import Union

import tensorflow as tf

from tf_lso._src import compat

# What a gradient can be, as `tape.gradient` returns it. Evaluated at import
# time, so no `X | Y` (Python 3.9, which setup.py accepts).
Gradient = Optional[Union[tf.Tensor, tf.IndexedSlices]]


def _dense_values(grad: Gradient) -> tf.Tensor | None:
    """The tensor whose entries must be finite: `.values` for IndexedSlices."""
    if isinstance(grad, tf.IndexedSlices):
        return grad.values
    return grad


def present_tensors(grads: Any) -> list[tf.Tensor]:
    """Flattens any nest of gradients, dropping `None` entries."""
    flat = tf.nest.flatten(grads)
    return [_dense_values(g) for g in flat if g is not None]


def local_nonfinite(grads: Any) -> tf.Tensor:
    """A float32 scalar: 1 if a gradient is not finite, else 0. `None`s are
    ignored. Integer gradients raise, as they did in TF's loss scales."""
    return nonfinite(pack(present_tensors(grads)).values)


def nonfinite(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """`local_nonfinite` of tensors that are packed already (`Packed.values`)."""
    if not tensors:
        return tf.constant(0.0)
    finite = [tf.reduce_all(tf.math.is_finite(t)) for t in tensors]
    all_finite = finite[0] if len(finite) == 1 else tf.reduce_all(finite)
    return 1.0 - tf.cast(all_finite, tf.float32)


def check_grads_and_vars(grads: Sequence[Gradient],
                         var_list: Sequence[tf.Variable]) -> None:
    """Raises, before any state changes, for pairs an apply would fail on."""
    if all(g is None for g in grads):
        names = [getattr(v, "name", repr(v)) for v in var_list]
        received = (
            f"{len(grads)} gradients, all None (variables: {names})" if grads
            else "no (gradient, variable) pairs"
        )
        raise ValueError(
            f"No gradients provided for any variable. Received: {received}. "
            "Check that the loss depends on the variables and is computed "
            "under the tape."
        )
    for i, (grad, var) in enumerate(zip(grads, var_list)):
        if not compat.is_variable(var):
            raise TypeError(
                "Each (gradient, variable) pair's variable must be a "
                f"variable. Received: a {type(var).__name__} at position {i}: "
                f"{var!r}. Pass the variable itself (e.g. `layer.kernel`), "
                "not a value computed from it."
            )
        if grad is None:
            continue
        shape = grad.values.shape if isinstance(grad, tf.IndexedSlices) else (
            tf.convert_to_tensor(grad).shape)
        var_shape = tf.TensorShape(var.shape)
        if isinstance(grad, tf.IndexedSlices):
            fits = shape[1:].is_compatible_with(var_shape[1:])
            shape = tf.TensorShape([None]).concatenate(shape[1:])
        else:
            fits = shape.is_compatible_with(var_shape)
        if not fits:
            raise ValueError(
                f"The gradient for variable {getattr(var, 'name', var)!r} has "
                f"shape {_shape(shape)}, but the variable has shape "
                f"{_shape(var_shape)}. Received: a mismatched pair at "
                f"position {i}. Pass each gradient with its own variable."
            )


def _shape(shape: Any) -> Any:
    return str(tuple(shape.as_list())) if shape.rank is not None else "unknown"


def scale_by(value: tf.Tensor, factor: Any) -> tf.Tensor:
    """Multiplies a tensor (any float dtype) by `factor` cast to its dtype."""
    value = tf.convert_to_tensor(value)
    return value * tf.cast(factor, value.dtype)


# Above this scale the float32 reciprocal 1/scale is subnormal, and CPU
# kernels flush subnormal operands to zero: multiplying by it would zero
# every gradient. A dynamic loss scale can grow up to the float32 maximum.
HUGE_SCALE = 2.0**126


class Identities:
    """Objects known by identity, weakly: nothing is kept alive, and a new
    object never inherits an old one's `id`."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[Any]] = {}

    def add(self, values: Sequence[Any]) -> None:
        """Remembers each value that is not None."""
        for value in values:
            if value is not None:
                key = id(value)
                self._refs[key] = weakref.ref(
                    value, functools.partial(self._forget, key))

    def _forget(self, key: int, ref: weakref.ref[Any]) -> None:
        if self._refs.get(key) is ref:
            del self._refs[key]

    def __contains__(self, value: Any) -> bool:
        ref = self._refs.get(id(value))
        return ref is not None and ref() is value


class HandedOut:
    """The gradients `get_unscaled_gradients` handed out, found by identity.

    They are never unscaled again (`issued`). In a graph, ops cost on every
    step, so the `Packed` behind each list is kept too. TF 2.x code passes
    that very list to `apply_gradients`, which takes it once (`take`)
    instead of packing it again. Any other list, even an equal one, is
    packed afresh.
    """

    _MAX_ENTRIES = 8  # Replica threads each trace their own; keep it small.

    def __init__(self) -> None:
        self._entries: dict[tuple[int, ...],
                            tuple[list[Gradient], Packed]] = {}
        self._issued = Identities()

    def remember(self, grads: list[Gradient],
                 packed: Packed | None = None) -> list[Gradient]:
        """Records `grads` as handed out (as `packed.unpack()`, if given)."""
        self._issued.add(grads)
        if packed is not None and not tf.executing_eagerly():
            if len(self._entries) >= self._MAX_ENTRIES:
                self._entries.clear()
            self._entries[tuple(map(id, grads))] = (grads, packed)
        return grads

    def issued(self, grad: Gradient) -> bool:
        """Whether `grad` is a gradient handed out, so unscaled already."""
        return grad is not None and grad in self._issued

    def take(self, grads: Sequence[Gradient]) -> Packed | None:
        """The `Packed` that `grads` was handed out from, or None."""
        entry = self._entries.pop(tuple(map(id, grads)), None)
        if entry is None or any(a is not b for a, b in zip(entry[0], grads)):
            return None
        return entry[1]


# Gradients with at most this many elements are stacked with others of the
# same shape, so that one op checks or scales all of them: for small tensors
# the per-op launch cost dominates. Bigger ones are handled one by one, which
# costs no more than the copy stacking would make.
PACK_MAX_ELEMENTS = 2**14


def _stackable(grad: Gradient) -> bool:
    return (
        isinstance(grad, tf.Tensor)
        and grad.shape.is_fully_defined()
        and grad.shape.num_elements() <= PACK_MAX_ELEMENTS
    )


def overwrites(variable: Any) -> bool:
    """Whether `variable`'s "gradient" is its next value: Keras 3's
    `overwrite_with_gradient` (float8 layers' scales). Keras 3 optimizers
    assign it, and neither unscale it nor sum it over replicas."""
    return bool(getattr(variable, "overwrite_with_gradient", False))


@dataclasses.dataclass(frozen=True)
class Stacked:
    """Where a gradient is in a `Packed`: member `position` of stack `index`."""

    index: int
    position: int


@dataclasses.dataclass(frozen=True)
class Sparse:
    """An `IndexedSlices`: values `values[index]`, indices and dense shape
    `aux[aux_index]`."""

    index: int
    aux_index: int


@dataclasses.dataclass(frozen=True)
class Dense:
    """A dense gradient kept as it is, at `values[index]`."""

    index: int


# One entry per gradient: where `Packed.unpack` finds it (None for None).
PlanEntry = Optional[Union[Stacked, Sparse, Dense]]


class Packed:
    """A flat list of gradients, with small same-shaped ones stacked.

    `values` are the float tensors to check or scale: one stack per group of
    two or more small dense gradients of the same shape and dtype, every
    other dense gradient, and each `IndexedSlices`' values. `aux` holds the
    `IndexedSlices`' indices and dense shapes. `raw` indexes the values that
    are new variable values (`overwrites`): checked, never scaled or summed.
    `unpack` rebuilds the list; an elementwise transform of `values` gives
    bit-identical results to applying it per gradient.
    """

    def __init__(self, values: list[tf.Tensor],
                 aux: list[tuple[tf.Tensor, tf.Tensor]],
                 plan: list[PlanEntry],
                 raw: frozenset[int] = frozenset()) -> None:
        self.values = values
        self.aux = aux
        self._plan = plan
        self.raw = raw

    def _with_values(self, values: list[tf.Tensor],
                     aux: list[tuple[tf.Tensor, tf.Tensor]] | None = None
                     ) -> Packed:
        return Packed(values, self.aux if aux is None else aux, self._plan,
                      self.raw)

    def scaled(self, factor: Any) -> Packed:
        """A Packed with its values, but the `raw` ones, times `factor`."""
        return self._with_values([
            v if i in self.raw else scale_by(v, factor)
            for i, v in enumerate(self.values)
        ])

    def unscaled(self, scale: Any) -> Packed:
        """A Packed whose values are divided by the positive `scale`.

        Up to `HUGE_SCALE` (every ordinary scale), they are multiplied by
        the float32 reciprocal, as in TF. Above it, they are divided in
        float64. A cond picks if `scale` is not known while tracing.
        """
        scale = tf.convert_to_tensor(scale, tf.float32)

        def ordinary() -> list[tf.Tensor]:
            return self.scaled(1.0 / scale).values

        static = tf.get_static_value(scale)

        def huge() -> list[tf.Tensor]:
            reciprocal = 1.0 / tf.cast(scale, tf.float64)
            if static is not None and math.frexp(float(static))[0] == 0.5:
                # 1/scale is then a float32 subnormal, and XLA would turn the
                # float64 product back into a float32 one by that constant.
                # A nudge far below half a float32 ulp prevents that without
                # changing any rounded result.
                reciprocal *= 1.0 + 2.0**-30
            return [
                v if i in self.raw
                else tf.cast(tf.cast(v, tf.float64) * reciprocal, v.dtype)
                for i, v in enumerate(self.values)
            ]

        if not self.values:
            values = []
        elif static is not None:
            values = huge() if static > HUGE_SCALE else ordinary()
        else:
            values = tf.cond(scale > HUGE_SCALE, huge, ordinary)
        return self._with_values(list(values))

    def _sparse_aux(self) -> dict[int, int]:
        """{index of an IndexedSlices' values: index of its aux}."""
        return {entry.index: entry.aux_index for entry in self._plan
                if isinstance(entry, Sparse)}

    def summands(self) -> list[tf.Tensor]:
        """What a sum over replicas adds up: the values but the `raw` ones,
        `IndexedSlices` whole (so they stay sparse)."""
        sparse = self._sparse_aux()
        return [
            tf.IndexedSlices(value, *self.aux[sparse[i]]) if i in sparse
            else value
            for i, value in enumerate(self.values) if i not in self.raw
        ]

    def with_sums(self, sums: Sequence[tf.Tensor]) -> Packed:
        """A Packed whose `summands()` are replaced by `sums` (same order)."""
        sparse = self._sparse_aux()
        summed = [i for i in range(len(self.values)) if i not in self.raw]
        aux = list(self.aux)
        values = list(self.values)
        for i, value in zip(summed, sums):
            if i in sparse:
                aux[sparse[i]] = (value.indices, value.dense_shape)
                value = value.values
            values[i] = value
        return self._with_values(values, aux)

    def nonfinite_per_gradient(
            self, values: Sequence[tf.Tensor] | None = None) -> tf.Tensor:
        """An int32 vector, one entry per gradient: 1 where it has an Inf/NaN,
        0 for `None`. `values` stand for `self.values`."""
        def flags(rows: tf.Tensor) -> tf.Tensor:
            finite = tf.reduce_all(tf.math.is_finite(rows), axis=1)
            return 1 - tf.cast(finite, tf.int32)

        return self._per_row(flags, tf.zeros([1], tf.int32), values)

    def per_gradient(self, reduce_fn: Callable[[tf.Tensor], tf.Tensor],
                     missing: Any,
                     values: Sequence[tf.Tensor] | None = None) -> tf.Tensor:
        """A float32 matrix of `reduce_fn`'s numbers, one row per gradient.

        `reduce_fn` maps a float32 matrix, one flattened gradient per row
        (an `IndexedSlices`' values), to one row of numbers per gradient.
        `missing` is the row for a `None`. `values` stand for `self.values`.
        """
        return self._per_row(
            lambda rows: reduce_fn(tf.cast(rows, tf.float32)),
            tf.constant([missing], tf.float32), values)

    def _per_row(self, reduce_rows: Callable[[tf.Tensor], tf.Tensor],
                 missing: tf.Tensor,
                 values: Sequence[tf.Tensor] | None) -> tf.Tensor:
        """`reduce_rows` of every packed value, rows in gradient order.

        Each stack is reduced once for all its members. One gather puts the
        rows in order (`missing` for `None`s). The op count thus does not
        grow with the number of gradients.
        """
        values = self.values if values is None else values
        stacks = {entry.index for entry in self._plan
                  if isinstance(entry, Stacked)}
        results, starts, size = [], [], 0
        for index, value in enumerate(values):
            rows = value.shape[0] if index in stacks else 1
            results.append(reduce_rows(tf.reshape(value, [rows, -1])))
            starts.append(size)
            size += rows
        results.append(missing)  # At `size`: for `None`s.
        order = [
            size if entry is None
            else starts[entry.index] + (
                entry.position if isinstance(entry, Stacked) else 0)
            for entry in self._plan
        ]
        return tf.gather(tf.concat(results, 0), tf.constant(order, tf.int32))

    def unpack(self, values: Sequence[tf.Tensor] | None = None,
               aux: Sequence[tuple[tf.Tensor, tf.Tensor]] | None = None
               ) -> list[Gradient]:
        """The gradient list, `None`s kept, rebuilt from `values` and `aux`
        (default: our own; e.g. a replica's copies in `strategy.run`)."""
        values = self.values if values is None else values
        aux = self.aux if aux is None else aux
        unstacked: dict[int, list[tf.Tensor]] = {}
        grads: list[Gradient] = []
        for entry in self._plan:
            if entry is None:
                grads.append(None)
            elif isinstance(entry, Stacked):
                if entry.index not in unstacked:
                    unstacked[entry.index] = tf.unstack(values[entry.index])
                grads.append(unstacked[entry.index][entry.position])
            elif isinstance(entry, Sparse):
                indices, dense_shape = aux[entry.aux_index]
                grads.append(
                    tf.IndexedSlices(values[entry.index], indices, dense_shape)
                )
            else:
                grads.append(values[entry.index])
        return grads


def pack(grads: Sequence[Gradient],
         var_list: Sequence[Any] | None = None) -> Packed:
    """Groups a flat list of gradients into a `Packed`. Given their
    variables, those that `overwrites` give `raw` values."""
    grads = [
        g if g is None or isinstance(g, tf.IndexedSlices)
        else tf.convert_to_tensor(g)
        for g in grads
    ]
    is_raw = [False] * len(grads) if var_list is None else [
        overwrites(v) for v in var_list]
    groups: dict[tuple[Any, tuple[Any, ...]], list[int]] = {}
    for i, g in enumerate(grads):
        if g is not None and _stackable(g) and not is_raw[i]:
            groups.setdefault((g.dtype, tuple(g.shape)), []).append(i)
    values: list[tf.Tensor] = []
    aux: list[tuple[tf.Tensor, tf.Tensor]] = []
    plan: list[PlanEntry] = [None] * len(grads)
    for members in groups.values():
        if len(members) > 1:
            for position, i in enumerate(members):
                plan[i] = Stacked(len(values), position)
            values.append(tf.stack([grads[i] for i in members]))
    for i, g in enumerate(grads):
        if g is None or plan[i] is not None:
            continue
        if isinstance(g, tf.IndexedSlices):
            plan[i] = Sparse(len(values), len(aux))
            values.append(g.values)
            aux.append((g.indices, g.dense_shape))
        else:
            plan[i] = Dense(len(values))
            values.append(g)
    raw = frozenset(entry.index for entry, raw_grad in zip(plan, is_raw)
                    if raw_grad and entry is not None)
    return Packed(values, aux, plan, raw)
