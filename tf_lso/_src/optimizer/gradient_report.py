"""The opt-in underflow and headroom report: `GradientReport`.

`opt.gradient_report(...)` computes one at once. `LossScaleMonitor(
gradient_report_freq=N)` asks the step for one (`GradientReportRecord`),
which stores it on device.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

import tensorflow as tf

from tf_lso._src.gradients import replicas

if TYPE_CHECKING:
    from tf_lso._src.gradients import packing

# float16's smallest normal number and its largest finite one.
FLOAT16_MIN_NORMAL = 2.0**-14
FLOAT16_MAX = 65504.0
# FLOAT16_MIN_NORMAL (2**-14) as a float32's bits: (127 - 14) << 23.
_FLOAT16_MIN_NORMAL_BITS = (127 - 14) << 23


class GradientReport(collections.namedtuple(
        "GradientReport",
        "loss_scale variables zero_share below_normal_share headroom size")):
    """How a step's gradients sit in float16's range at the loss scale.

    What `opt.gradient_report(...)` returns and
    `LossScaleMonitor(gradient_report_freq=N)` keeps. Per variable, in the
    order given, of the gradient times the loss scale, as the float16
    backward pass holds it (of an `IndexedSlices`, the rows it holds). A
    `None` gradient has NaN shares and headroom, and size 0. The fields are
    NumPy arrays eagerly, tensors in a `tf.function`.

    Attributes:
        loss_scale: The loss scale the shares are computed at.
        variables: The variables' names (Keras `path`, else `name`).
        zero_share: The share of elements that are exactly 0, which carry
            no gradient (a true 0, or one that underflowed).
        below_normal_share: The share of elements below float16's smallest
            normal, 2**-14, zeros included: fewer significant bits.
        headroom: How many times the largest element can still double
            before it passes float16's maximum (65504):
            `floor(log2(65504 / max|g * scale|))`. Negative past it, `-inf`
            for an Inf or a NaN, `inf` for an all-zero gradient.
        size: The number of elements the shares are over.

    >>> report = tf_lso.GradientReport(
    ...     1024.0, ("w", "b"), np.array([0.5, 0.0]), np.array([0.75, 0.0]),
    ...     np.array([3.0, 10.0]), np.array([3, 1]))
    >>> float(report.total_zero_share), float(report.min_headroom)
    (0.375, 3.0)
    """

    @property
    def total_zero_share(self) -> tf.Tensor:
        """`zero_share` over every element of every gradient."""
        return _weighted(self.zero_share, self.size)

    @property
    def total_below_normal_share(self) -> tf.Tensor:
        """`below_normal_share` over every element of every gradient."""
        return _weighted(self.below_normal_share, self.size)

    @property
    def min_headroom(self) -> tf.Tensor:
        """The headroom of the largest scaled gradient element of all."""
        headroom = tf.cast(self.headroom, tf.float32)
        return tf.reduce_min(tf.where(tf.math.is_nan(headroom),
                                      tf.constant(float("inf")), headroom))


def _weighted(shares: Any, sizes: Any) -> tf.Tensor:
    shares = tf.cast(shares, tf.float32)
    sizes = tf.cast(sizes, tf.float32)
    present = sizes > 0
    total = tf.reduce_sum(tf.where(present, shares * sizes, 0.0))
    return total / tf.reduce_sum(sizes)


def gradient_statistics(
    packed: packing.Packed, scale: tf.Tensor | float,
    values: Sequence[tf.Tensor] | None = None,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """`(zero_share, below_normal_share, headroom, size)` of the unscaled
    `packed` at `scale`, as float32 vectors. `values` stand for
    `packed.values`, e.g. a replica's."""
    scale = tf.cast(scale, tf.float32)
    nan = float("nan")

    def reduce(rows: tf.Tensor) -> tf.Tensor:
        # One pass per packed value: every number from the same |g * s|.
        product = rows * scale
        # Zero and below-normal from the float32 bits of |g * s|: XLA on
        # TensorFlow 2.16 folds a float comparison back into float16, where
        # it took a float16 subnormal for a normal number.
        magnitude_bits = tf.bitwise.bitwise_and(
            tf.bitcast(product, tf.int32), 0x7FFFFFFF)
        count = tf.cast(tf.shape(rows)[1], tf.float32)
        zero = tf.reduce_sum(
            tf.cast(tf.equal(magnitude_bits, 0), tf.float32), 1)
        below = tf.reduce_sum(
            tf.cast(magnitude_bits < _FLOAT16_MIN_NORMAL_BITS, tf.float32), 1)
        # An Inf or a NaN leaves no headroom (the step overflowed): inf,
        # whether or not the maximum passes a NaN on.
        largest = tf.where(
            tf.reduce_all(tf.math.is_finite(product), axis=1),
            tf.reduce_max(tf.abs(product), axis=1), float("inf"))
        return tf.stack([zero / count, below / count, largest,
                         tf.fill(tf.shape(largest), count)], axis=1)

    zero, below, largest, size = tf.unstack(
        packed.per_gradient(reduce, [nan, nan, nan, 0.0], values), axis=1)
    headroom = tf.floor(tf.math.log(FLOAT16_MAX / largest) / math.log(2.0))
    return zero, below, headroom, size


def host_report(
    scale: tf.Tensor | float, names: Iterable[str],
    statistics: tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor],
) -> GradientReport:
    """A `GradientReport` of NumPy values (eagerly), else of tensors."""
    zero, below, headroom, size = statistics
    if tf.executing_eagerly():
        return GradientReport(
            float(scale), tuple(names), zero.numpy(), below.numpy(),
            headroom.numpy(), size.numpy().astype("int64"))
    return GradientReport(scale, tuple(names), zero, below, headroom,
                          tf.cast(size, tf.int64))


class GradientReportRecord(tf.Module):
    """The on-device `GradientReport` of a requested step (opt-in).

    Off (`enabled` False) it adds nothing to the step. On, a step whose
    `requested` flag is set stores the report of its summed, unscaled
    gradients and clears the flag, in a cond every replica takes alike.
    """

    def __init__(self) -> None:
        super().__init__(name="gradient_report")
        self.enabled = False
        self.requested = replicas.state_variable(
            False, tf.bool, "gradient_report_requested")
        self.step = replicas.state_variable(-1, tf.int64,
                                            "gradient_report_step")
        self.scale = replicas.state_variable(0.0, tf.float32,
                                             "gradient_report_scale")
        self.names_id = replicas.state_variable(-1, tf.int64,
                                                "gradient_report_names_id")
        # {names_id: a float32 variable of shape [4, number of variables]}
        self._fields: dict[int, tf.Variable] = {}

    def build(self, names_id: int, size: int) -> None:
        """Creates the storage for one `apply_gradients` list, once."""
        if names_id not in self._fields:
            with tf.init_scope():
                self._fields[names_id] = replicas.state_variable(
                    tf.zeros([4, size]), tf.float32,
                    f"gradient_report_{names_id}")

    def record(self, packed: packing.Packed, scale: tf.Tensor,
               step: tf.Tensor, names_id: int) -> None:
        """Stores the report of `packed` (unscaled, summed) if requested.
        In a replica context; `names_id` is `OverflowRecord.names_id_for`'s.
        """
        fields = self._fields[names_id]

        def store(values: Sequence[tf.Tensor], scale: tf.Tensor,
                  step: tf.Tensor) -> None:
            values = [replicas.first_replica(v) for v in values]
            scale = replicas.first_replica(scale)
            fields.assign(tf.stack(gradient_statistics(packed, scale,
                                                       values)))
            self.scale.assign(scale)
            self.step.assign(tf.cast(replicas.first_replica(step), tf.int64))
            self.names_id.assign(tf.constant(names_id, tf.int64))
            self.requested.assign(False)

        replicas.cond_on_all_replicas(
            tf.logical_not(self.requested), lambda: None, store, args=(),
            false_args=(packed.values, scale, tf.identity(step)))

    def last(self, names: Sequence[tuple[str, ...]]) -> GradientReport | None:
        """The last stored report, or None. Eager only. `names[names_id]`
        are the variable names."""
        names_id = int(self.names_id.numpy())
        if names_id < 0:
            return None
        zero, below, headroom, size = self._fields[names_id].numpy()
        return GradientReport(float(self.scale.numpy()), names[names_id],
                              zero, below, headroom, size.astype("int64"))
