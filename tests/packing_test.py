"""Tests for tf_lso._src.gradients.packing: finite checks and (un)scaling."""

import numpy as np
import tensorflow as tf
from absl.testing import parameterized
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from tf_lso._src.gradients import packing as gradients

import test_util

NAN = float("nan")


class GradientsTest(tf.test.TestCase, parameterized.TestCase):
    def test_multiply_gradients_keeps_structure(self):
        sparse = tf.IndexedSlices(tf.constant([[2.0]]), tf.constant([0]))
        result = gradients.pack(
            [tf.constant(4.0, tf.float16), None, sparse]
        ).scaled(tf.constant(0.5)).unpack()
        self.assertEqual(result[0].dtype, tf.float16)
        self.assertEqual(float(result[0]), 2.0)
        self.assertIsNone(result[1])
        self.assertIsInstance(result[2], tf.IndexedSlices)
        self.assertAllEqual(result[2].values, [[1.0]])


class PackTest(tf.test.TestCase, parameterized.TestCase):
    """Stacked gradients give bit-identical results to per-tensor ops."""

    def _grads(self):
        rng = np.random.default_rng(0)
        big = gradients.PACK_MAX_ELEMENTS + 1
        return [
            tf.constant(rng.normal(size=(3, 4)), tf.float32),
            None,
            tf.constant(rng.normal(size=(3, 4)), tf.float32),
            tf.constant(rng.normal(size=(3, 4)), tf.float16),
            tf.constant(rng.normal(size=(big,)), tf.float32),
            tf.IndexedSlices(tf.constant(rng.normal(size=(2, 4)), tf.float32),
                             tf.constant([0, 5]), tf.constant([6, 4])),
            tf.constant(rng.normal(size=(3, 4)), tf.float32),
            tf.constant(1.5),
        ]

    @test_util.EAGER_AND_FUNCTION
    def test_multiply_is_bit_identical_to_per_tensor(self, use_tf_function):
        grads = self._grads()
        factor = tf.constant(1.0 / 3.0)

        def both(grads):
            return (gradients.pack(grads).scaled(factor).unpack(),
                    [None if g is None else _per_tensor(g, factor)
                     for g in grads])

        fast, plain = test_util.maybe_function(both, use_tf_function)(grads)
        for f, p, g in zip(fast, plain, grads):
            if g is None:
                self.assertIsNone(f)
                continue
            self.assertIsInstance(f, type(p))
            if isinstance(g, tf.IndexedSlices):
                self.assertAllEqual(f.indices, g.indices)
                f, p = f.values, p.values
            self.assertEqual(f.dtype, g.dtype if not isinstance(
                g, tf.IndexedSlices) else g.values.dtype)
            self.assertAllEqual(f, p)

    def test_small_same_shaped_gradients_share_one_stack(self):
        packed = gradients.pack(self._grads())
        shapes = [tuple(v.shape) for v in packed.values]
        # Three float32 (3, 4) stacked; float16 (3, 4), the big vector, the
        # IndexedSlices values and the scalar alone.
        self.assertCountEqual(shapes, [(3, 3, 4), (3, 4), (16385,), (2, 4),
                                       ()])

    @test_util.EAGER_AND_FUNCTION
    def test_one_non_finite_entry_anywhere_is_found(self, use_tf_function):
        check = test_util.maybe_function(gradients.local_nonfinite,
                                         use_tf_function)
        self.assertEqual(float(check(self._grads())), 0.0)
        for index in (0, 2, 3, 4, 5, 6, 7):
            grads = self._grads()
            g = grads[index]
            values = g.values if isinstance(g, tf.IndexedSlices) else g
            bad = tf.tensor_scatter_nd_update(
                tf.reshape(values, [-1]), [[0]],
                tf.constant([float("inf")], values.dtype),
            )
            bad = tf.reshape(bad, tf.shape(values))
            grads[index] = (tf.IndexedSlices(bad, g.indices, g.dense_shape)
                            if isinstance(g, tf.IndexedSlices) else bad)
            self.assertEqual(float(check(grads)), 1.0, msg=index)


def _per_tensor(grad, factor):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * tf.cast(factor, grad.dtype),
                                grad.indices, grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


_shapes = st.sampled_from([(), (2,), (3,), (2, 2), (1, 3)])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(_shapes, st.booleans()), max_size=8),
       st.floats(1e-3, 1e3))
def test_pack_unpack_round_trip_any_mix(entries, factor):
    rng = np.random.default_rng(len(entries))
    grads = [None if missing else tf.constant(rng.normal(size=shape),
                                              tf.float32)
             for shape, missing in entries]
    packed = gradients.pack(grads)
    for original, restored in zip(grads, packed.unpack()):
        if original is None:
            assert restored is None
        else:
            np.testing.assert_array_equal(restored, original)
    factor = tf.constant(factor)
    for g, scaled in zip(grads, gradients.pack(grads).scaled(factor).unpack()):
        if g is not None:
            np.testing.assert_array_equal(scaled, g * factor)


F32_MAX = float(np.finfo(np.float32).max)


class NonfinitePerGradientTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(("eager", False), ("tf_function", True),
                                    ("jit", "jit"))
    def test_matches_a_per_gradient_check(self, mode):
        rng = np.random.default_rng(0)
        grads = [tf.constant(rng.normal(size=shape), tf.float32)
                 for shape in [(3, 2), (3, 2), (), (3, 2), (), (5,)]]
        grads += [None, tf.constant(rng.normal(size=(2, 4)), tf.float16),
                  tf.constant(rng.normal(size=(200, 100)), tf.float32)]
        bad = {1: np.inf, 4: np.nan, 7: np.inf, 8: np.nan}
        for i, value in bad.items():
            array = np.array(grads[i].numpy())
            array.flat[-1] = value
            grads[i] = tf.constant(array)
        sparse = tf.IndexedSlices(tf.constant([[1.0, np.inf]]),
                                  tf.constant([0]), tf.constant([4, 2]))
        grads.append(sparse)
        expected = [0 if g is None else int(not np.all(np.isfinite(
            gradients._dense_values(g).numpy()))) for g in grads]
        self.assertEqual(expected, [0, 1, 0, 0, 1, 0, 0, 1, 1, 1])

        def flags(values):
            return gradients.pack(grads).nonfinite_per_gradient(values)

        packed = gradients.pack(grads)
        self.assertLess(len(packed.values), len(grads))  # Some are stacked.
        if mode:
            flags = tf.function(flags, jit_compile=mode == "jit")
        self.assertAllEqual(flags(packed.values), expected)

    def test_no_gradients(self):
        self.assertAllEqual(
            gradients.pack([None]).nonfinite_per_gradient(), [0])
        self.assertEqual(gradients.pack([]).nonfinite_per_gradient().shape,
                         (0,))


class UnscaleTest(tf.test.TestCase, parameterized.TestCase):
    """Unscaling by the loss scale, for every scale a loss scale can reach."""

    @parameterized.product(
        scale=[2.0**126 * 1.5, 2.0**127, F32_MAX],
        mode=["eager", "tf_function", "jit"],
        static=[False, True],
    )
    def test_huge_scales_do_not_flush_to_zero(self, scale, mode, static):
        # 1/scale is a float32 subnormal here: multiplied in, CPU kernels
        # flush it to zero and every gradient became 0.
        grads = [tf.constant([1.0, -0.5]) * scale, None,
                 tf.constant(0.25 * scale, tf.float64),
                 tf.IndexedSlices(tf.constant([[scale]]), tf.constant([1]))]

        variable = tf.Variable(scale)

        def unscale(grads):
            value = tf.constant(scale) if static else variable.read_value()
            return gradients.pack(grads).unscaled(value).unpack()

        if mode != "eager":
            unscale = tf.function(unscale, jit_compile=mode == "jit")
        result = unscale(grads)
        self.assertAllEqual(result[0], [1.0, -0.5])
        self.assertIsNone(result[1])
        self.assertEqual(result[2].dtype, tf.float64)
        self.assertAllClose(result[2], 0.25, rtol=1e-7)
        self.assertAllEqual(result[3].values, [[1.0]])

    @test_util.EAGER_AND_FUNCTION
    def test_ordinary_scales_multiply_by_the_float32_reciprocal(
        self, use_tf_function
    ):
        rng = np.random.default_rng(1)
        grads = [tf.constant(rng.normal(size=(5,)), tf.float32),
                 tf.constant(rng.normal(size=(3,)), tf.float16)]
        for scale in (1000.0, 3.0, 2.0**126, 0.5):
            unscale = test_util.maybe_function(
                lambda g, s: gradients.pack(g).unscaled(s).unpack(),
                use_tf_function,
            )
            result = unscale(grads, tf.constant(scale))
            reciprocal = tf.constant(1.0) / tf.constant(scale)
            for g, r in zip(grads, result):
                self.assertAllEqual(r, g * tf.cast(reciprocal, g.dtype))


class HandedOutTest(tf.test.TestCase):
    def test_finds_the_packed_gradients_by_identity_once(self):
        seen = []

        @tf.function
        def probe():
            handed_out = gradients.HandedOut()
            grads = [tf.ones([2]), None, tf.zeros([2])]
            packed = gradients.pack(grads)
            unpacked = handed_out.remember(packed.unpack(), packed)
            again = handed_out.remember(packed.unpack(), packed)
            equal_values = [None if g is None else tf.identity(g)
                            for g in unpacked]
            seen.extend([handed_out.take(list(unpacked)) is packed,
                         handed_out.take(list(unpacked)) is None,  # Used up.
                         handed_out.take(equal_values) is None,
                         handed_out.take(again) is packed])

        probe.get_concrete_function()  # Tracing runs it.
        self.assertEqual(seen, [True, True, True, True])

    def test_keeps_nothing_eagerly(self):
        handed_out = gradients.HandedOut()
        grads = [tf.ones([2]), tf.zeros([2])]
        packed = gradients.pack(grads)
        unpacked = handed_out.remember(packed.unpack(), packed)
        self.assertIsNone(handed_out.take(unpacked))


if __name__ == "__main__":
    tf.test.main()
