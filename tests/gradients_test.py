"""Tests for tf_lso._src.gradients: finite checks and (un)scaling."""

import tensorflow as tf
from absl.testing import parameterized

from tf_lso._src import gradients

import test_util

NAN = float("nan")


class GradientsTest(tf.test.TestCase, parameterized.TestCase):
    @test_util.EAGER_AND_FUNCTION
    def test_all_finite(self, use_tf_function):
        check = test_util.maybe_function(gradients.all_finite, use_tf_function)
        self.assertTrue(bool(check([tf.constant([1.0, 2.0]), None])))
        self.assertTrue(bool(check([])))
        self.assertFalse(bool(check([tf.constant([1.0, NAN])])))
        self.assertFalse(bool(check({"x": tf.constant(float("inf"), tf.float16)})))
        self.assertTrue(bool(check(tf.constant(3.0))))

    def test_all_finite_agrees_across_replicas(self):
        strategy = test_util.mirrored_strategy()

        @tf.function
        def run():
            return strategy.run(
                lambda: gradients.all_finite(
                    [test_util.value_on_replica_0(1.0, NAN)]
                )
            )

        results = strategy.experimental_local_results(run())
        self.assertEqual([bool(r) for r in results], [False, False])

    def test_multiply_gradients_keeps_structure(self):
        sparse = tf.IndexedSlices(tf.constant([[2.0]]), tf.constant([0]))
        result = gradients.multiply_gradients(
            [tf.constant(4.0, tf.float16), None, sparse], tf.constant(0.5)
        )
        self.assertEqual(result[0].dtype, tf.float16)
        self.assertEqual(float(result[0]), 2.0)
        self.assertIsNone(result[1])
        self.assertIsInstance(result[2], tf.IndexedSlices)
        self.assertAllEqual(result[2].values, [[1.0]])


if __name__ == "__main__":
    tf.test.main()
