"""Tests for tf_lso._src.scaling.serialization: get, serialize, deserialize."""

import tensorflow as tf
from absl.testing import parameterized

from tf_lso import experimental
from tf_lso._src.scaling import serialization


class SerializationTest(tf.test.TestCase, parameterized.TestCase):
    def test_serialize_round_trip(self):
        for loss_scale in (experimental.FixedLossScale(2),
                           experimental.DynamicLossScale(2.0, 3)):
            config = experimental.serialize(loss_scale)
            self.assertEqual(config["class_name"], type(loss_scale).__name__)
            restored = experimental.deserialize(config)
            self.assertEqual(restored.get_config(), loss_scale.get_config())

    def test_serialize_format(self):
        self.assertEqual(
            experimental.serialize(experimental.DynamicLossScale(2.0, 3)),
            {"class_name": "DynamicLossScale",
             "config": {"initial_loss_scale": 2.0, "increment_period": 3,
                        "multiplier": 2.0}},
        )

    def test_deserialize_ignores_newer_keras_keys(self):
        restored = experimental.deserialize({
            "module": "keras.mixed_precision", "registered_name": None,
            "class_name": "FixedLossScale", "config": {"loss_scale_value": 3.0},
        })
        self.assertEqual(float(restored()), 3.0)

    @parameterized.named_parameters(
        ("not_a_dict", [1], "Improper config format"),
        ("missing_config", {"class_name": "FixedLossScale"},
         "Improper config format"),
        ("unknown", {"class_name": "Foo", "config": {}},
         "Unknown loss scale: Foo. Please ensure this object is passed to "
         "the `custom_objects` argument"),
    )
    def test_deserialize_errors(self, config, message):
        with self.assertRaisesRegex(ValueError, message):
            experimental.deserialize(config)

    def test_get(self):
        self.assertEqual(repr(experimental.get(123)), "FixedLossScale(123.0)")
        self.assertEqual(float(experimental.get(True)()), 1.0)
        dynamic = experimental.get("dynamic")
        self.assertEqual(
            (dynamic.initial_loss_scale, dynamic.increment_period,
             dynamic.multiplier),
            (32768.0, 2000, 2.0),
        )
        self.assertIs(experimental.get(dynamic), dynamic)
        self.assertIsNone(experimental.get(None))
        from_dict = experimental.get(
            {"class_name": "FixedLossScale", "config": {"loss_scale_value": 4.0}}
        )
        self.assertEqual(float(from_dict()), 4.0)
        converted = experimental.get(
            tf.compat.v1.mixed_precision.FixedLossScale(8.0)
        )
        self.assertIsInstance(converted, experimental.FixedLossScale)

    @parameterized.named_parameters(
        ("string", "static", ValueError, "Could not interpret loss scale"),
        ("below_one", 0.5, ValueError, "must be at least 1"),
    )
    def test_get_errors(self, identifier, error, message):
        with self.assertRaisesRegex(error, message):
            experimental.get(identifier)


class TensorFlowConversionTest(tf.test.TestCase):
    """TF's deprecated loss scales as tf_lso's (and tf_lso's are not TF's)."""

    def test_tf_loss_scales_convert_ours_stay(self):
        theirs = tf.compat.v1.mixed_precision.DynamicLossScale(8.0, 3, 4.0)
        theirs.update([tf.constant(float("inf"))])  # Scale 2, counter 0.
        theirs.update([tf.constant(1.0)])  # Counter 1.
        ours = experimental.get(theirs)
        self.assertIsInstance(ours, experimental.DynamicLossScale)
        self.assertEqual(ours.get_config(), {"initial_loss_scale": 8.0,
                                             "increment_period": 3,
                                             "multiplier": 4.0})
        self.assertEqual((float(ours()), int(ours.good_steps)), (2.0, 1))
        # tf_lso's own, although TF's classes count them as theirs, are
        # used as they are.
        self.assertFalse(serialization.is_tensorflow_loss_scale(ours))
        self.assertIs(experimental.get(ours), ours)


if __name__ == "__main__":
    tf.test.main()
