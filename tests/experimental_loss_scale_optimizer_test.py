"""Tests for tf_lso._src.optimizer.experimental_loss_scale_optimizer and configs."""

import copy

import keras
import tensorflow as tf
from absl.testing import parameterized

import tf_lso
from tf_lso.experimental import DynamicLossScale
from tf_lso.experimental import FixedLossScale
from tf_lso.experimental import LossScale

import test_util

NAN = float("nan")
Experimental = tf_lso.experimental.LossScaleOptimizer


# The three equivalences of the TF 2.4 docs: experimental arguments, and the
# TF 2.4 constructor's arguments that give an equal get_config().
TF24_EQUIVALENCES = parameterized.named_parameters(
    ("dynamic", ("dynamic",), {}),
    ("fixed", (123,), {"dynamic": False, "initial_scale": 123}),
    ("dynamic_object", (DynamicLossScale(2048, 500),),
     {"initial_scale": 2048, "dynamic_growth_steps": 500}),
)


def _sgd():
    return keras.optimizers.SGD(2.0, momentum=0.5, name="sgd")


# TF 2.3 wrote these configs; TF 2.4 and tf_lso read them.
TF23_FIXED = {
    "optimizer": {
        "class_name": "SGD",
        "config": {"learning_rate": 2.0, "momentum": 0.5, "decay": 0.0,
                   "nesterov": False, "name": "SGD"},
    },
    "loss_scale": {"class_name": "FixedLossScale",
                   "config": {"loss_scale_value": 2.0}},
}
TF23_DYNAMIC = {
    "optimizer": TF23_FIXED["optimizer"],
    "loss_scale": {
        "class_name": "DynamicLossScale",
        "config": {"initial_loss_scale": 2.0, "increment_period": 3,
                   "multiplier": 2.0},
    },
}


class ConstructorTest(tf.test.TestCase, parameterized.TestCase):
    def test_class_relations(self):
        opt = Experimental(_sgd(), "dynamic")
        self.assertIsInstance(opt, tf_lso.LossScaleOptimizer)
        self.assertIsInstance(opt, keras.optimizers.LossScaleOptimizer)
        self.assertIsInstance(opt, keras.optimizers.Optimizer)
        self.assertNotIsInstance(
            tf_lso.LossScaleOptimizer(_sgd()), Experimental
        )

    @parameterized.named_parameters(
        ("dynamic", "dynamic", True, 32768.0, 2000),
        ("int", 123, False, 123.0, None),
        ("float_below_one", 0.5, False, 0.5, None),
        ("fixed", FixedLossScale(4), False, 4.0, None),
        ("dynamic_object", DynamicLossScale(2048, 500), True, 2048.0, 500),
        ("dict", {"class_name": "FixedLossScale",
                  "config": {"loss_scale_value": 8.0}}, False, 8.0, None),
    )
    def test_loss_scale_values(self, loss_scale, dynamic, initial, growth):
        opt = Experimental(_sgd(), loss_scale)
        self.assertIsInstance(opt.loss_scale, LossScale)
        self.assertEqual(opt.dynamic, dynamic)
        self.assertEqual(opt.initial_scale, initial)
        self.assertEqual(opt.dynamic_growth_steps, growth)
        self.assertEqual(float(opt.loss_scale()), initial)
        self.assertEqual(float(opt.loss_scale), initial)

    @TF24_EQUIVALENCES
    def test_config_equals_tf24_equivalent(self, args, kwargs):
        experimental = Experimental(_sgd(), *args)
        plain = tf_lso.LossScaleOptimizer(_sgd(), **kwargs)
        self.assertEqual(experimental.get_config(), plain.get_config())

    @TF24_EQUIVALENCES
    def test_tf24_doc_examples_hold_verbatim(self, args, kwargs):
        # As the TF 2.4 docs wrote them: two separately built SGDs, whose
        # auto-generated names differ from Keras 3.15 on ("sgd", "sgd_1").
        experimental = Experimental(keras.optimizers.SGD(), *args)
        plain = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(), **kwargs)
        self.assertEqual(experimental.get_config(), plain.get_config())
        self.assertNotIn("name", plain.get_config()["inner_optimizer"]["config"])
        restored = tf_lso.LossScaleOptimizer.from_config(plain.get_config())
        self.assertEqual(restored.get_config(), plain.get_config())

    def test_a_chosen_inner_name_is_configuration(self):
        config = tf_lso.LossScaleOptimizer(
            keras.optimizers.SGD(name="encoder_sgd")).get_config()
        self.assertEqual(config["inner_optimizer"]["config"]["name"],
                         "encoder_sgd")
        restored = tf_lso.LossScaleOptimizer.from_config(config)
        self.assertEqual(restored.inner_optimizer.name, "encoder_sgd")
        self.assertNotEqual(
            tf_lso.LossScaleOptimizer(keras.optimizers.SGD(name="a")).get_config(),
            tf_lso.LossScaleOptimizer(keras.optimizers.SGD(name="b")).get_config(),
        )

    def test_dynamic_loss_scale_is_used_not_copied(self):
        loss_scale = DynamicLossScale(4, 1)
        loss_scale.current_loss_scale.assign(2.0)
        opt = Experimental(keras.optimizers.SGD(1.0), loss_scale)
        self.assertIs(opt.loss_scale, loss_scale)
        self.assertEqual(float(opt.loss_scale()), 2.0)
        self.assertIs(opt.dynamic_counter, loss_scale.good_steps)
        var = tf.Variable(1.0)
        opt.apply_gradients([(tf.constant(1.0), var)])
        self.assertEqual(float(loss_scale()), 4.0)

    @test_util.EAGER_AND_FUNCTION
    def test_custom_loss_scale_subclass(self, use_tf_function):
        class CountingLossScale(LossScale):
            def __init__(self):
                super().__init__()
                self.calls = tf.Variable(0)

            def __call__(self):
                return tf.constant(4.0)

            def update(self, grads):
                self.calls.assign_add(1)
                return None, True

            def get_config(self):
                return {}

        loss_scale = CountingLossScale()
        opt = Experimental(keras.optimizers.SGD(1.0), loss_scale)
        var = tf.Variable(1.0)
        test_util.maybe_function(
            lambda: opt.minimize(lambda: var * 2.0, [var]), use_tf_function
        )()
        self.assertEqual(float(var), -1.0)
        self.assertEqual(int(loss_scale.calls), 1)
        self.assertEqual(
            opt.get_config()["loss_scale"],
            {"class_name": "CountingLossScale", "config": {}},
        )
        restored = Experimental.from_config(
            opt.get_config(), custom_objects={"CountingLossScale": CountingLossScale}
        )
        self.assertIsInstance(restored.loss_scale, CountingLossScale)

    def test_custom_loss_scale_has_no_tf24_settings(self):
        # TF 2.4's arguments cannot describe it; tf_lso does not guess
        # (this one never changes, so `dynamic=True` would be wrong).
        opt = Experimental(_sgd(), _HalvingLossScale())
        self.assertIsNone(opt.dynamic)
        self.assertIsNone(opt.initial_scale)
        self.assertIsNone(opt.dynamic_growth_steps)
        self.assertIsNone(opt.dynamic_counter)
        self.assertEqual(float(opt.loss_scale()), 4.0)

    def test_tensorflow_loss_scales_are_converted(self):
        fixed = Experimental(
            _sgd(), tf.compat.v1.mixed_precision.FixedLossScale(16.0)
        )
        self.assertIsInstance(fixed.loss_scale, FixedLossScale)
        self.assertEqual(float(fixed.loss_scale()), 16.0)
        tf_dynamic = tf.compat.v1.mixed_precision.DynamicLossScale(64.0, 10)
        tf_dynamic.update([tf.constant(1.0)])
        dynamic = Experimental(_sgd(), tf_dynamic)
        self.assertIsInstance(dynamic.loss_scale, DynamicLossScale)
        self.assertEqual(float(dynamic.loss_scale()), 64.0)
        self.assertEqual(int(dynamic.dynamic_counter), 1)
        self.assertEqual(dynamic.dynamic_growth_steps, 10)

    @parameterized.named_parameters(
        ("none", None, "Invalid value passed to loss_scale"),
        ("unknown_string", "static", "Invalid value passed to loss_scale"),
        ("zero", 0, "positive and finite"),
        ("multiplier", DynamicLossScale(4, 1, 4),
         "DynamicLossScale.multiplier must be 2. Got: DynamicLossScale"),
        ("tf_multiplier",
         tf.compat.v1.mixed_precision.DynamicLossScale(4.0, 1, 3.0),
         "multiplier must be 2"),
    )
    def test_invalid_loss_scale(self, loss_scale, message):
        with self.assertRaisesRegex(ValueError, message):
            Experimental(_sgd(), loss_scale)

    def test_invalid_optimizer(self):
        with self.assertRaisesRegex(
            TypeError, '"optimizer" must be an instance of .* but got: 3'
        ):
            Experimental(3, "dynamic")


class ConfigTest(tf.test.TestCase, parameterized.TestCase):
    def _check_usable(self, opt, expected_var):
        var = tf.Variable(5.0)
        opt.minimize(lambda: var * 1.0, [var])
        self.assertEqual(float(var), expected_var)

    @parameterized.product(
        source=["v2", "v1", "tf2_3"], target=["v2", "v1"], dynamic=[False, True]
    )
    def test_config_combinations(self, source, target, dynamic):
        if source == "tf2_3":
            config = TF23_DYNAMIC if dynamic else TF23_FIXED
        elif source == "v1":
            config = Experimental(
                _sgd(), DynamicLossScale(2, 3) if dynamic else 2
            ).get_config()
        else:
            kwargs = ({"initial_scale": 2, "dynamic_growth_steps": 3}
                      if dynamic else {"dynamic": False, "initial_scale": 2})
            config = tf_lso.LossScaleOptimizer(_sgd(), **kwargs).get_config()
        cls = Experimental if target == "v1" else tf_lso.LossScaleOptimizer
        opt = cls.from_config(config)
        self.assertIs(type(opt), cls)
        self.assertEqual(test_util.num(opt.learning_rate), 2.0)
        self.assertEqual(opt.momentum, 0.5)
        self.assertEqual(float(opt.loss_scale), 2.0)
        self.assertEqual(opt.initial_scale, 2.0)
        self.assertEqual(opt.dynamic, dynamic)
        self.assertEqual(opt.dynamic_growth_steps, 3 if dynamic else None)
        self._check_usable(opt, 3.0)
        if dynamic:
            self.assertEqual(int(opt.dynamic_counter), 1)
        else:
            self.assertIsNone(opt.dynamic_counter)

    @parameterized.product(
        cls=[tf_lso.LossScaleOptimizer, Experimental],
        source=["keras", "tf_keras", "tf_keras_legacy", "tf2_3"],
    )
    def test_from_config_leaves_the_config_unchanged(self, cls, source):
        # Keras's deserialize functions lower-case the `class_name` of the
        # dict they are given; TF 2.4 passed them the caller's own.
        if source == "tf2_3":
            config = copy.deepcopy(TF23_DYNAMIC)
        else:
            inner = {
                "keras": _sgd,
                "tf_keras": lambda: test_util.tf_keras.optimizers.SGD(2.0),
                "tf_keras_legacy": lambda: (
                    test_util.tf_keras.optimizers.legacy.SGD(2.0)),
            }[source]()
            config = tf_lso.LossScaleOptimizer(inner).get_config()
        before = copy.deepcopy(config)
        opt = cls.from_config(config)
        self.assertEqual(config, before)
        self.assertEqual(opt.get_config()["dynamic"], True)

    @parameterized.product(
        cls=[tf_lso.LossScaleOptimizer, Experimental],
        source=["tf2_4", "tf2_3"], use_tf_function=[False, True],
    )
    def test_tf2_learning_rate_schedule(self, cls, source, use_tf_function):
        # TF 2.x wrote an inner optimizer's schedule as `{class_name,
        # config}`, with `name: None`; Keras 3 reads neither by itself.
        inner = copy.deepcopy(TF23_FIXED["optimizer"])
        inner["config"].update(momentum=0.0, learning_rate={
            "class_name": "ExponentialDecay",
            "config": {"initial_learning_rate": 0.5, "decay_steps": 2,
                       "decay_rate": 0.5, "staircase": True, "name": None},
        })
        if source == "tf2_3":
            config = {"optimizer": inner,
                      "loss_scale": TF23_DYNAMIC["loss_scale"]}
        else:
            config = {"inner_optimizer": inner, "dynamic": True,
                      "initial_scale": 2.0, "dynamic_growth_steps": 3}
        before = copy.deepcopy(config)
        opt = cls.from_config(config)
        self.assertEqual(config, before)
        self.assertIsInstance(opt.learning_rate.schedule,
                              keras.optimizers.schedules.ExponentialDecay)
        self.assertEqual(float(opt.learning_rate(2)), 0.25)
        var = tf.Variable(10.0)
        step = test_util.maybe_function(
            lambda: opt.apply_gradients([(tf.constant(1.0), var)]),
            use_tf_function)
        for _ in range(3):
            step()
        self.assertEqual(float(var), 10.0 - 0.5 - 0.5 - 0.25)
        self.assertEqual(float(opt.loss_scale), 4.0)

    def test_tf2_custom_learning_rate_schedule(self):
        class Halving(keras.optimizers.schedules.LearningRateSchedule):
            def __init__(self, rate):
                self.rate = rate

            def __call__(self, step):
                return self.rate / 2.0 ** tf.cast(step, tf.float32)

            def get_config(self):
                return {"rate": self.rate}

        config = {"inner_optimizer": {"class_name": "SGD", "config": {
            "learning_rate": {"class_name": "Halving",
                              "config": {"rate": 1.0}}}}}
        opt = tf_lso.LossScaleOptimizer.from_config(
            config, custom_objects={"Halving": Halving})
        var = tf.Variable(10.0)
        for _ in range(2):
            opt.apply_gradients([(tf.constant(1.0), var)])
        self.assertEqual(float(var), 10.0 - 1.0 - 0.5)

    @parameterized.named_parameters(("tf2_4", "tf2_4"), ("tf2_3", "tf2_3"))
    def test_serialized_by_tf2(self, source):
        # TF 2.x serialized its class as plain "LossScaleOptimizer", which
        # keras.optimizers.deserialize resolves to Keras 3's own class, even
        # with custom_objects (docs/migration.md).
        if source == "tf2_3":
            config = copy.deepcopy(TF23_DYNAMIC)
        else:
            config = {"inner_optimizer": copy.deepcopy(TF23_FIXED["optimizer"]),
                      "dynamic": True, "initial_scale": 2.0,
                      "dynamic_growth_steps": 3}
        serialized = {"class_name": "LossScaleOptimizer", "config": config}
        custom_objects = {"LossScaleOptimizer": tf_lso.LossScaleOptimizer}
        with self.assertRaises((TypeError, KeyError)):
            keras.optimizers.deserialize(copy.deepcopy(serialized),
                                         custom_objects=custom_objects)
        for opt in (
            keras.saving.deserialize_keras_object(
                copy.deepcopy(serialized), custom_objects=custom_objects),
            tf_lso.LossScaleOptimizer.from_config(serialized["config"]),
        ):
            self.assertIs(type(opt), tf_lso.LossScaleOptimizer)
            self.assertEqual((opt.initial_scale, opt.dynamic_growth_steps),
                             (2.0, 3))
            self._check_usable(opt, 3.0)

    def test_tf24_config_format(self):
        self.assertEqual(
            set(tf_lso.LossScaleOptimizer(_sgd()).get_config()),
            {"inner_optimizer", "dynamic", "initial_scale",
             "dynamic_growth_steps"},
        )
        fixed = tf_lso.LossScaleOptimizer(_sgd(), False, 5).get_config()
        self.assertEqual(
            (fixed["dynamic"], fixed["initial_scale"],
             fixed["dynamic_growth_steps"]),
            (False, 5.0, None),
        )

    @parameterized.named_parameters(
        ("v2", tf_lso.LossScaleOptimizer), ("v1", Experimental)
    )
    def test_from_config_invalid_multiplier(self, cls):
        config = copy.deepcopy(TF23_DYNAMIC)
        config["loss_scale"]["config"]["multiplier"] = 4.0
        with self.assertRaisesRegex(
            ValueError,
            "Cannot deserialize LossScaleOptimizer with a DynamicLossScale "
            r"whose multiplier is not 2. Got DynamicLossScale: DynamicLossScale\(",
        ):
            cls.from_config(config)

    def test_from_config_missing_keys_use_defaults(self):
        config = {"inner_optimizer": keras.optimizers.serialize(_sgd())}
        opt = tf_lso.LossScaleOptimizer.from_config(config)
        self.assertEqual((opt.initial_scale, opt.dynamic_growth_steps),
                         (32768.0, 2000))

    def test_from_keras3_config(self):
        keras_lso = keras.optimizers.LossScaleOptimizer(
            _sgd(), initial_scale=64.0, dynamic_growth_steps=10
        )
        opt = tf_lso.LossScaleOptimizer.from_config(keras_lso.get_config())
        self.assertEqual((opt.initial_scale, opt.dynamic_growth_steps),
                         (64.0, 10))

    @parameterized.named_parameters(
        ("v2", lambda: tf_lso.LossScaleOptimizer(_sgd(), initial_scale=2,
                                                 dynamic_growth_steps=3)),
        ("v1", lambda: Experimental(_sgd(), DynamicLossScale(2, 3))),
    )
    def test_keras_serialize_round_trip(self, make):
        opt = make()
        restored = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
        self.assertIs(type(restored), type(opt))
        self.assertEqual(restored.get_config(), opt.get_config())
        self._check_usable(restored, 3.0)
        self.assertEqual(int(restored.dynamic_counter), 1)

    def test_custom_inner_optimizer(self):
        class MySGD(keras.optimizers.SGD):
            def __init__(self, *args, my_attribute=123, **kwargs):
                super().__init__(*args, **kwargs)
                self.my_attribute = my_attribute

            def get_config(self):
                return {**super().get_config(), "my_attribute": self.my_attribute}

        opt = tf_lso.LossScaleOptimizer(MySGD(2.0, my_attribute=7))
        config = keras.optimizers.serialize(opt)
        restored = keras.optimizers.deserialize(
            config, custom_objects={"MySGD": MySGD}
        )
        self.assertIsInstance(restored.inner_optimizer, MySGD)
        self.assertEqual(restored.my_attribute, 7)


class FromConfigTest(tf.test.TestCase, parameterized.TestCase):
    """`from_config` of both classes: keywords, validation, clear errors."""

    @parameterized.named_parameters(
        ("v2", tf_lso.LossScaleOptimizer,
         lambda: tf_lso.LossScaleOptimizer(_sgd(), initial_scale=64,
                                           dynamic_growth_steps=3)),
        ("v1", Experimental,
         lambda: Experimental(_sgd(), DynamicLossScale(64, 3))),
        ("v1_fixed", Experimental, lambda: Experimental(_sgd(), 12)),
        ("v1_custom", Experimental,
         lambda: Experimental(_sgd(), _HalvingLossScale())),
    )
    def test_kwargs_forwarding_subclass_round_trips(self, base, make):
        # The pattern of Horovod-style wrappers: everything by keyword.
        forwarded = []

        class Wrapper(base):
            def __init__(self, **kwargs):
                forwarded.append(sorted(kwargs))
                super().__init__(**kwargs)

        original = make()
        restored = Wrapper.from_config(
            original.get_config(),
            custom_objects={"_HalvingLossScale": _HalvingLossScale},
        )
        self.assertIsInstance(restored, Wrapper)
        self.assertEqual(restored.get_config(), original.get_config())
        expected = (["loss_scale", "optimizer"] if base is Experimental
                    else ["dynamic", "dynamic_growth_steps", "initial_scale",
                          "inner_optimizer"])
        self.assertEqual(forwarded, [expected])

    @parameterized.named_parameters(
        ("zero_scale", {"initial_scale": 0}, ValueError, "positive and finite"),
        ("zero_growth", {"dynamic_growth_steps": 0}, ValueError,
         "must be an integer of at least 1"),
        ("string_dynamic", {"dynamic": "no"}, TypeError, "must be a bool"),
        ("huge_scale", {"initial_scale": 1e39}, ValueError, "float32"),
        ("fixed_without_scale", {"dynamic": False}, ValueError,
         "must be specified"),
        ("fixed_with_growth", {"dynamic": False, "initial_scale": 2,
                               "dynamic_growth_steps": 3}, ValueError,
         "must be None"),
    )
    def test_validates_like_the_constructor(self, settings, error, message):
        config = {"inner_optimizer": keras.optimizers.serialize(_sgd()),
                  **settings}
        for cls in (Experimental, tf_lso.LossScaleOptimizer):
            with self.assertRaisesRegex(error, message):
                cls.from_config(dict(config))
            with self.assertRaisesRegex(error, message):
                tf_lso.LossScaleOptimizer(_sgd(), **settings)

    def test_integral_float_growth_steps(self):
        config = {"inner_optimizer": keras.optimizers.serialize(_sgd()),
                  "dynamic_growth_steps": 4.0}
        for cls in (Experimental, tf_lso.LossScaleOptimizer):
            self.assertEqual(cls.from_config(dict(config)).dynamic_growth_steps, 4)

    @parameterized.named_parameters(
        ("list", [("inner_optimizer", {})], TypeError, "needs a dict"),
        ("string", "dynamic", TypeError, "needs a dict"),
        ("unknown_key", {"inner_optimizer": {}, "loss_scale_value": 2},
         TypeError, r"unknown keys \['loss_scale_value'\]"),
        ("mixed_formats", {"optimizer": {}, "loss_scale": "dynamic",
                           "dynamic": True},
         TypeError, r"unknown keys \['dynamic'\]"),
        ("no_optimizer", {"dynamic": True}, ValueError,
         r"needs the keys \['inner_optimizer'\]"),
        ("tf23_without_loss_scale", {"optimizer": {}}, ValueError,
         r"needs the keys \['loss_scale'\]"),
    )
    def test_clear_errors_for_malformed_configs(self, config, error, message):
        for cls in (Experimental, tf_lso.LossScaleOptimizer):
            with self.assertRaisesRegex(error, message):
                cls.from_config(config)


@keras.saving.register_keras_serializable(package="tf_lso_test")
class _HalvingLossScale(LossScale):
    """A custom loss scale (TF 2.3 config format)."""

    def __call__(self):
        return tf.constant(4.0)

    def update(self, grads):
        return None, True

    def get_config(self):
        return {}


if __name__ == "__main__":
    tf.test.main()
