"""Tests for tf_lso._src.inner.inner_optimizer and its kinds: what can be wrapped."""

import abc
import inspect
import pathlib
import re
import sys
from unittest import mock

import keras
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import tf_lso
from tf_lso._src.inner import inner_optimizer as inner_lib
from tf_lso._src.inner import wrapping
from tf_lso._src.inner.kinds import tf_keras as tf_keras_kinds
from tf_lso._src.scaling import loss_scale as loss_scale_lib
from tf_lso._src.scaling import tensor_like

import inner_kinds
import test_util

tf_keras = test_util.tf_keras

NAN = float("nan")


class InterfaceTest(tf.test.TestCase, parameterized.TestCase):
    def test_inner_optimizers_and_loss_scales_are_abstract_base_classes(self):
        # One interface style for both hierarchies: abstract methods that a
        # kind (a loss scale) must implement, defaults it inherits.
        for base in (inner_lib.InnerOptimizer, loss_scale_lib.LossScale,
                     tensor_like.TensorLike):
            self.assertIsInstance(base, abc.ABCMeta)
            self.assertTrue(base.__abstractmethods__, base)
        for kind in wrapping.KINDS:
            self.assertFalse(kind.__abstractmethods__, kind)

    @parameterized.named_parameters(
        (row.name, row.sgd, row.kind) for row in inner_kinds.KINDS
    )
    def test_each_kind_holds_its_optimizer(self, make, kind):
        optimizer = make()
        inner = wrapping.wrap(optimizer, "inner_optimizer")
        self.assertIsInstance(inner, kind)
        self.assertIs(inner.optimizer, optimizer)
        self.assertIn("learning_rate", inner.hyperparameter_names())


class WrappingTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(
        ("tf_lso", lambda: tf_lso.LossScaleOptimizer(keras.optimizers.SGD())),
        ("keras3", lambda: keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD())),
        ("tf_keras", lambda: tf_keras.mixed_precision.LossScaleOptimizer(
            tf_keras.optimizers.legacy.SGD())),
    )
    def test_nesting_is_a_type_error(self, make):
        with self.assertRaisesRegex(
            TypeError, "cannot wrap another LossScaleOptimizer"
        ):
            tf_lso.LossScaleOptimizer(make())
        with self.assertRaisesRegex(
            TypeError, "cannot wrap another LossScaleOptimizer"
        ):
            tf_lso.experimental.LossScaleOptimizer(make(), "dynamic")

    @parameterized.named_parameters(
        (row.name, row.sgd) for row in inner_kinds.KINDS
    )
    def test_wrapping_one_optimizer_twice_is_a_value_error(self, make):
        # TF 2.6+ and tf_keras: two wrappers would share the step counter
        # and slots, and a checkpoint of both fails (legacy slots).
        makers = (
            lambda inner: tf_lso.LossScaleOptimizer(inner),
            lambda inner: tf_lso.experimental.LossScaleOptimizer(inner, 8),
        )
        for first in makers:
            for second in makers:
                inner = make()
                first(inner)
                with self.assertRaisesRegex(
                    ValueError,
                    '"inner_optimizer" is already wrapped by a '
                    "LossScaleOptimizer. .*Received: (inner_)?optimizer=.*SGD",
                ):
                    second(inner)

    def test_a_failed_construction_does_not_claim_the_optimizer(self):
        # TF 2.6 marked the inner optimizer before validating the scale, so
        # correcting the arguments then failed with "already wrapped".
        inner = keras.optimizers.SGD()
        with self.assertRaisesRegex(ValueError, "must be specified"):
            tf_lso.LossScaleOptimizer(inner, dynamic=False)
        with self.assertRaisesRegex(ValueError, "positive and finite"):
            tf_lso.experimental.LossScaleOptimizer(inner, 0)
        opt = tf_lso.LossScaleOptimizer(inner, dynamic=False, initial_scale=8)
        self.assertIs(opt.inner_optimizer, inner)

    @parameterized.named_parameters(
        ("int", 3), ("string", "sgd"),
        ("tf1", tf.compat.v1.train.GradientDescentOptimizer(1.0)),
        ("unhashable", tf.Variable(1.0)),
    )
    def test_non_optimizer_is_a_type_error(self, value):
        with self.assertRaisesRegex(
            TypeError, '"inner_optimizer" must be an instance of .*but got: '
        ):
            tf_lso.LossScaleOptimizer(value)

    def test_dynamic_must_be_bool(self):
        with self.assertRaisesRegex(
            TypeError, "must be a bool, but got: 'dynamic'"
        ):
            tf_lso.LossScaleOptimizer(keras.optimizers.SGD(), "dynamic")

    @parameterized.named_parameters(
        ("fixed_without_scale", {"dynamic": False}, ValueError,
         '"initial_scale" must be specified'),
        ("fixed_with_growth", {"dynamic": False, "initial_scale": 2,
                               "dynamic_growth_steps": 2}, ValueError,
         '"dynamic_growth_steps" must be None if "dynamic" is False, but got: 2'),
        ("zero_scale", {"initial_scale": 0}, ValueError, "positive and finite"),
        ("string_scale", {"initial_scale": "3"}, TypeError, "must be a number"),
        ("zero_growth", {"dynamic_growth_steps": 0}, ValueError, "at least 1"),
        ("float_growth", {"dynamic_growth_steps": 2.5}, ValueError,
         "must be an integer"),
        ("nan_growth", {"dynamic_growth_steps": float("nan")}, ValueError,
         "`dynamic_growth_steps` must be an integer"),
        ("huge_scale", {"initial_scale": 1e39}, ValueError, "float32"),
    )
    def test_invalid_arguments(self, kwargs, error, message):
        with self.assertRaisesRegex(error, message):
            tf_lso.LossScaleOptimizer(keras.optimizers.SGD(), **kwargs)

    def test_inner_loss_scale_factor_is_rejected(self):
        with self.assertRaisesRegex(ValueError, "loss_scale_factor=4"):
            tf_lso.LossScaleOptimizer(keras.optimizers.SGD(loss_scale_factor=4))

    def test_defaults_and_fixed_attributes(self):
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD())
        self.assertEqual((opt.initial_scale, opt.dynamic_growth_steps),
                         (32768.0, 2000))
        self.assertEqual(float(opt.loss_scale), 32768.0)
        self.assertEqual(int(opt.dynamic_counter), 0)
        fixed = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(), False, 8)
        self.assertFalse(fixed.dynamic)
        self.assertIsNone(fixed.dynamic_counter)
        self.assertIsNone(fixed.dynamic_growth_steps)


class TfKerasLegacyInnerTest(tf.test.TestCase, parameterized.TestCase):
    @test_util.EAGER_AND_FUNCTION
    def test_apply_skip_and_slots(self, use_tf_function):
        inner = tf_keras.optimizers.legacy.SGD(1.0, momentum=1.0)
        opt = tf_lso.LossScaleOptimizer(
            inner, initial_scale=2, dynamic_growth_steps=1
        )
        var = tf.Variable([1.0, 2.0])
        step = test_util.maybe_function(
            lambda g: opt.apply_gradients([(g, var)]), use_tf_function
        )
        step(tf.constant([1.0, 1.0]))
        self.assertAllEqual(var, [0.0, 1.0])
        self.assertEqual(opt.get_slot_names(), ["momentum"])
        self.assertAllEqual(opt.get_slot(var, "momentum"), [-1.0, -1.0])
        step(tf.constant([NAN, 1.0]))
        self.assertAllEqual(var, [0.0, 1.0])
        self.assertAllEqual(opt.get_slot(var, "momentum"), [-1.0, -1.0])
        self.assertEqual(int(opt.iterations), 2)
        self.assertEqual(float(opt.loss_scale), 2.0)
        step(tf.constant([1.0, 1.0]))
        self.assertAllEqual(var, [-2.0, -1.0])
        self.assertEqual(float(opt.loss_scale), 4.0)

    @test_util.EAGER_AND_FUNCTION
    def test_variable_names_are_the_bare_optimizers(self, use_tf_function):
        # OptimizerV2 creates its variables under its name ("Adam/iter:0",
        # "Adam/w/m:0"), wrapped (TF 2.4, tf_keras) or not.
        def names_after_a_step(opt, inner):
            var = tf.Variable([1.0, 2.0], name="w")

            def step():
                opt.apply_gradients([(tf.constant([1.0, 1.0]), var)])

            test_util.maybe_function(step, use_tf_function)()
            return [v.name for v in inner.variables()]

        bare = tf_keras.optimizers.legacy.Adam()
        inner = tf_keras.optimizers.legacy.Adam()
        expected = ["Adam/iter:0", "Adam/w/m:0", "Adam/w/v:0"]
        self.assertEqual(names_after_a_step(bare, bare), expected)
        self.assertEqual(
            names_after_a_step(tf_lso.LossScaleOptimizer(inner), inner),
            expected,
        )

    def test_hyperparameters_and_attributes(self):
        inner = tf_keras.optimizers.legacy.Adam(1.0)
        opt = tf_lso.LossScaleOptimizer(inner)
        self.assertEqual(float(opt.learning_rate), 1.0)
        opt.lr = 0.5
        self.assertEqual(float(inner.learning_rate), 0.5)
        opt.beta_1 = 0.25
        self.assertEqual(float(inner.beta_1), 0.25)
        opt.iterations = 3
        self.assertEqual(int(inner.iterations), 3)
        var = tf.Variable(1.0)
        opt.add_slot(var, "extra", initializer="ones")
        self.assertEqual(float(opt.get_slot(var, "extra")), 1.0)
        self.assertEqual(opt.variables(), inner.variables())

    def test_hyperparameters_first_read_inside_tf_function(self):
        # The forwarded names come from get_config(), which reads variables:
        # a first read while tracing must not lose them.
        opt = tf_lso.LossScaleOptimizer(tf_keras.optimizers.legacy.Adam(1.0))
        var = tf.Variable(1.0)

        @tf.function
        def step():
            opt.apply_gradients([(tf.constant(1.0), var)])
            return opt.beta_1 * 2.0

        self.assertAllClose(step(), 1.8)
        self.assertAllClose(opt.beta_1, 0.9)

    def test_config_round_trip(self):
        opt = tf_lso.LossScaleOptimizer(
            tf_keras.optimizers.legacy.SGD(2.0, momentum=0.5), initial_scale=4
        )
        restored = tf_lso.LossScaleOptimizer.from_config(opt.get_config())
        self.assertIsInstance(
            restored.inner_optimizer, tf_keras.optimizers.legacy.SGD
        )
        self.assertEqual(float(restored.momentum), 0.5)
        self.assertEqual(restored.initial_scale, 4.0)

    def test_mirrored_skip(self):
        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            var = tf.Variable(1.0)
            opt = tf_lso.LossScaleOptimizer(
                tf_keras.optimizers.legacy.SGD(1.0), initial_scale=8
            )

        @tf.function
        def step():
            def replica_fn():
                grad = test_util.value_on_replica_0(1.0, NAN)
                opt.apply_gradients([(grad, var)])

            strategy.run(replica_fn)

        step()
        self.assertEqual(test_util.num(var), 1.0)
        self.assertEqual(float(opt.loss_scale), 4.0)


class TfKerasInnerTest(tf.test.TestCase, parameterized.TestCase):
    @test_util.EAGER_AND_FUNCTION
    def test_apply_and_skip(self, use_tf_function):
        inner = tf_keras.optimizers.SGD(1.0)
        opt = tf_lso.LossScaleOptimizer(
            inner, initial_scale=2, dynamic_growth_steps=1
        )
        var = tf.Variable(5.0)
        step = test_util.maybe_function(
            lambda g: opt.apply_gradients([(g, var)]), use_tf_function
        )
        step(tf.constant(1.0))
        step(tf.constant(NAN))
        self.assertEqual(float(var), 4.0)
        self.assertEqual(int(opt.iterations), 2)
        self.assertEqual(float(opt.loss_scale), 2.0)

    @test_util.EAGER_AND_FUNCTION
    def test_apply_gradients_override_without_name(self, use_tf_function):
        # tf_keras's own wrapper passes no `name`, so overrides often take
        # none; a name is passed on only when one was given.
        class Logged(tf_keras.optimizers.SGD):
            def apply_gradients(self, grads_and_vars,
                                skip_gradients_aggregation=False):
                self.calls = getattr(self, "calls", 0) + 1
                return super().apply_gradients(
                    grads_and_vars,
                    skip_gradients_aggregation=skip_gradients_aggregation)

        opt = tf_lso.LossScaleOptimizer(Logged(1.0), initial_scale=2)
        var = tf.Variable(5.0)
        step = test_util.maybe_function(
            lambda: opt.apply_gradients([(tf.constant(1.0), var)]),
            use_tf_function)
        step()
        self.assertEqual(float(var), 4.0)
        self.assertGreater(opt.inner_optimizer.calls, 0)  # Per trace.
        # Its second place is the flag passed by keyword: a name given is
        # dropped, not passed there too.
        test_util.maybe_function(
            lambda: opt.apply_gradients([(tf.constant(1.0), var)], "named"),
            use_tf_function)()
        self.assertEqual(float(var), 3.0)


def _clipping(kind, with_kwargs=True):
    """TensorSpeech/TensorFlowTTS's AdamWeightDecay, as SGD of `kind`: its
    `apply_gradients` takes a clip norm where TF's takes `name` (with
    `**kwargs`, as later versions; without, as its first)."""
    base = type(inner_kinds.sgd(kind))

    class ClippingSGD(base):
        def apply_gradients(self, grads_and_vars, clip_norm=0.5, **kwargs):
            grads, variables = zip(*grads_and_vars)
            grads, _ = tf.clip_by_global_norm(grads, clip_norm)
            return super().apply_gradients(zip(grads, variables), **kwargs)

    class FirstClippingSGD(base):
        def apply_gradients(self, grads_and_vars, clip_norm=0.5, name=None):
            grads, variables = zip(*grads_and_vars)
            grads, _ = tf.clip_by_global_norm(grads, clip_norm)
            return super().apply_gradients(zip(grads, variables))

    return (ClippingSGD if with_kwargs else FirstClippingSGD)(1.0)


class TfKerasClassTest(tf.test.TestCase, parameterized.TestCase):
    """Around a tf_keras optimizer the wrapper is a tf_keras one too."""

    @parameterized.product(kind=inner_kinds.TF_KERAS_NAMES,
                           experimental=[False, True])
    def test_what_users_read_names_the_class_they_made(self, kind,
                                                        experimental):
        inner = inner_kinds.sgd(kind, 1.0)
        if experimental:
            public = tf_lso.experimental.LossScaleOptimizer
            name = "tf_lso.experimental.LossScaleOptimizer"
            opt = public(inner, "dynamic")
        else:
            public, name = tf_lso.LossScaleOptimizer, "tf_lso.LossScaleOptimizer"
            opt = public(inner)
        self.assertIsInstance(opt, public)
        self.assertIsInstance(opt, tf_keras.mixed_precision.LossScaleOptimizer)
        self.assertEqual(repr(type(opt)), repr(public))
        self.assertTrue(repr(opt).startswith(f"<{name} object at "),
                        repr(opt))
        with self.assertRaisesRegex(
                AttributeError,
                f"^'{re.escape(name)}' object has no attribute 'nesterov'"):
            opt.nesterov  # noqa: B018 - the attribute read is the test.

    @parameterized.product(legacy=[False, True], experimental=[False, True])
    def test_it_resolves_every_name_as_the_class_called(self, legacy,
                                                         experimental):
        # tf_keras's classes sit before Keras 3's base classes in the method
        # order; what they would hide is taken back. Only the class's own
        # bookkeeping differs, and pickling (as the class called).
        called = (tf_lso.experimental.LossScaleOptimizer if experimental
                  else tf_lso.LossScaleOptimizer)
        made = tf_keras_kinds.tf_keras_class(called, legacy=legacy)
        differ = {name for name in dir(called)
                  if inspect.getattr_static(made, name)
                  is not inspect.getattr_static(called, name)}
        self.assertEqual(
            differ - {"__annotations__", "__dict__", "__weakref__"},
            {"__reduce__"})

    @test_util.EAGER_AND_FUNCTION
    def test_compute_gradients_scales_the_loss_as_tf_keras_does(
            self, use_tf_function):
        # tf_keras's own loss scale optimizer scales the loss in
        # `compute_gradients`; an unscaled one would underflow in float16.
        # 2**126 * 8 overflows float32: only a scaled loss's gradient is inf.
        var = tf.Variable(1.0)
        ours = tf_lso.LossScaleOptimizer(tf_keras.optimizers.SGD(1.0),
                                         initial_scale=8)
        theirs = tf_keras.mixed_precision.LossScaleOptimizer(
            tf_keras.optimizers.SGD(1.0), dynamic=False, initial_scale=8)

        def grads(opt, factor):
            pairs = opt.compute_gradients(lambda: var * factor, [var])
            return [grad for grad, _ in pairs]

        grads = test_util.maybe_function(grads, use_tf_function)
        for factor in (3.0, 2.0**126):
            expected = self.evaluate(grads(theirs, factor))
            self.assertAllEqual(self.evaluate(grads(ours, factor)), expected)
        self.assertAllEqual(expected, [np.inf])

    @test_util.EAGER_AND_FUNCTION
    def test_compute_gradients_then_apply_on_replicas_as_tf_keras_does(
            self, use_tf_function):
        # The step TF 2.x code writes with compute_gradients, on two
        # replicas: the overflowing step is skipped and the scale halves.
        strategy = test_util.mirrored_strategy()

        def train(make):
            with strategy.scope():
                var = tf.Variable(1.0)
                opt = make(tf_keras.optimizers.SGD(0.1))

            def step(factor):
                def replica_step():
                    pairs = opt.compute_gradients(lambda: var * factor, [var])
                    opt.apply_gradients(pairs)

                strategy.run(replica_step)

            step = test_util.maybe_function(step, use_tf_function)
            for factor in (3.0, 2.0**126, 1.0):
                step(tf.constant(factor))
            return (test_util.local_values(strategy, var),
                    float(opt.loss_scale))

        ours = train(lambda inner: tf_lso.LossScaleOptimizer(
            inner, initial_scale=8))
        theirs = train(lambda inner: tf_keras.mixed_precision.
                       LossScaleOptimizer(inner, initial_scale=8))
        self.assertEqual(ours, theirs)
        self.assertEqual(ours[1], 4.0)

    @parameterized.parameters(*inner_kinds.NAMES)
    def test_an_unregistered_subclass_reads_back_by_its_name(self, kind):
        class MyLossScaleOptimizer(tf_lso.LossScaleOptimizer):
            """An unregistered subclass, found by `custom_objects`."""

        opt = MyLossScaleOptimizer(inner_kinds.sgd(kind, 1.0),
                                   initial_scale=8)
        custom_objects = {"MyLossScaleOptimizer": MyLossScaleOptimizer}
        framework = keras if kind == "keras" else tf_keras
        config = framework.optimizers.serialize(opt)
        self.assertEqual(config["class_name"], "MyLossScaleOptimizer")
        restored = framework.optimizers.deserialize(
            config, custom_objects=custom_objects)
        self.assertIsInstance(restored, MyLossScaleOptimizer)
        self.assertIs(type(restored), type(opt))
        self.assertEqual(float(restored.loss_scale), 8.0)

    @parameterized.parameters(False, True)
    def test_an_unknown_class_layout_is_an_error_naming_the_version(
            self, legacy):
        # A tf_keras release that put another package's class between its
        # optimizer classes: Keras 3's attributes could not all be put
        # first, and the wrapper would silently be a different optimizer.
        optimizers = tf_keras.optimizers.legacy if legacy else (
            tf_keras.optimizers)

        class Foreign(optimizers.Optimizer):
            """Not tf_keras's own."""

        version = sys.modules["tf_keras"].__version__
        make = tf_keras_kinds.tf_keras_class.__wrapped__  # Not the cache.
        with mock.patch.object(optimizers, "Optimizer", Foreign):
            with self.assertRaisesRegex(
                    RuntimeError,
                    f"tf_keras {re.escape(version)} lays out"):
                make(tf_lso.LossScaleOptimizer, legacy=legacy)


class NameArgumentTest(tf.test.TestCase, parameterized.TestCase):
    """TF 2.2-2.4 passed `apply_gradients`' `name` to the inner optimizer's
    as its second positional argument, and each replica's gradients
    (issue 59)."""

    # After each step: the variable, from 5.0. Each replica's gradient is
    # 2.0 / replicas; TF 2.4 clipped each replica's gradient, then summed.
    EXPECTED = {"default": [4.0, 3.5, 3.25], "mirrored": [3.0, 2.0, 1.5]}

    # (strategy, use_tf_function, the override takes **kwargs)
    PLACES = [("default", False, True), ("default", True, True),
              ("mirrored", True, True), ("default", True, False),
              ("mirrored", False, False)]

    @parameterized.product(kind=inner_kinds.NAMES, cls=["v1", "v2"],
                           place=PLACES)
    def test_a_subclass_gets_it_in_the_place_of_name(self, kind, cls,
                                                     place):
        strategy, use_tf_function, with_kwargs = place
        expected = self.EXPECTED[strategy]
        strategy = test_util.STRATEGIES[strategy]()
        replicas = strategy.num_replicas_in_sync
        with strategy.scope():
            var = tf.Variable(5.0)
            inner = _clipping(kind, with_kwargs)
            opt = (tf_lso.experimental.LossScaleOptimizer(
                inner, tf_lso.experimental.DynamicLossScale(4.0)) if
                   cls == "v1" else
                   tf_lso.LossScaleOptimizer(inner, initial_scale=4))

        def step(clip_norm, minimize, bad=False):
            def replica_step():
                if minimize:
                    return opt.minimize(lambda: var * 2.0, [var],
                                        name=clip_norm)
                grad = 2.0 / strategy.num_replicas_in_sync
                last = test_util.replica_id() == replicas - 1
                grads = [tf.where(bad & last, float("nan"), grad)]
                return opt.apply_gradients(zip(grads, [var]), clip_norm)

            return strategy.run(replica_step)

        step = test_util.maybe_function(step, use_tf_function)
        step(1.0, False)  # Clipped at 1.0.
        self.assertEqual(test_util.local_values(strategy, var),
                         [expected[0]] * replicas)
        step(None, False)  # No name: the override's default, 0.5.
        self.assertEqual(test_util.local_values(strategy, var),
                         [expected[1]] * replicas)
        step(0.25, True)  # `minimize(..., name=...)` passes it on too.
        self.assertAllClose(test_util.local_values(strategy, var),
                            [expected[2]] * replicas)
        # A NaN on one replica skips the step on every replica.
        step(1.0, False, bad=True)
        self.assertAllClose(test_util.local_values(strategy, var),
                            [expected[2]] * replicas)
        self.assertEqual(test_util.num(opt.skipped_steps), 1)

    @parameterized.product(kind=inner_kinds.NAMES,
                           use_tf_function=[False, True])
    def test_an_optimizer_that_takes_no_name_gets_none(self, kind,
                                                       use_tf_function):
        # Keras 3's apply_gradients takes no name: it is dropped there.
        var = tf.Variable(5.0)
        opt = tf_lso.LossScaleOptimizer(inner_kinds.sgd(kind, 1.0),
                                        initial_scale=4)
        test_util.maybe_function(
            lambda: opt.apply_gradients([(tf.constant(1.0), var)], "step"),
            use_tf_function)()
        self.assertEqual(float(var), 4.0)

    @parameterized.product(kind=inner_kinds.NAMES,
                           use_tf_function=[False, True])
    def test_an_override_that_passes_its_arguments_on(self, kind,
                                                      use_tf_function):
        # A Horovod-style wrapper: `apply_gradients(self, *args, **kwargs)`
        # passes them to its base, which takes a name only on tf_keras.
        class Passthrough(type(inner_kinds.sgd(kind))):
            def apply_gradients(self, *args, **kwargs):
                self.arguments = args[1:]
                return super().apply_gradients(*args, **kwargs)

        var = tf.Variable(5.0)
        opt = tf_lso.LossScaleOptimizer(Passthrough(1.0), initial_scale=4)
        test_util.maybe_function(
            lambda: opt.minimize(lambda: var * 1.0, [var], name="train"),
            use_tf_function)()
        self.assertEqual(float(var), 4.0)
        self.assertEqual(opt.inner_optimizer.arguments,
                         () if kind == "keras" else ("train",))


class ToyOptimizer(tf.Module):
    """An optimizer of no supported kind: plain SGD on a tf.Module."""

    def __init__(self, learning_rate):
        super().__init__(name="toy")
        self.learning_rate = learning_rate
        self.iterations = tf.Variable(0, dtype=tf.int64, name="iterations")

    def apply_gradients(self, grads_and_vars):
        # The op that runs the whole update (in a tf.compat.v1 graph,
        # nothing runs that a fetched op does not depend on).
        updates = [var.assign_sub(self.learning_rate * grad)
                   for grad, var in grads_and_vars]
        with tf.control_dependencies(updates):
            return self.iterations.assign_add(1)

    def get_config(self):
        return {"learning_rate": self.learning_rate}


class ToyKind(inner_lib.InnerOptimizer):
    """A whole kind in one class, as a new module in kinds/ would hold it."""

    optimizer_class = "ToyOptimizer"
    noun = "a toy optimizer"
    # Its `apply` returns the op that runs the update (see `apply`).
    runs_in_v1_graph = True

    @classmethod
    def accepts(cls, optimizer):
        return isinstance(optimizer, ToyOptimizer)

    @classmethod
    def reads_config(cls, config):
        return config.get("class_name") == "ToyOptimizer"

    @classmethod
    def deserialize(cls, config, custom_objects=None):
        return ToyOptimizer(**config["config"])

    def build(self, var_list):
        del var_list  # No slots.

    def check_variables(self, var_list):
        del var_list  # Updates any variable.

    def aggregated(self, packed, var_list):
        del var_list
        return packed, True  # Tested without a strategy.

    def apply(self, grads_and_vars, name, aggregate, skipped_steps):
        del name, aggregate, skipped_steps
        return self.optimizer.apply_gradients(grads_and_vars)

    def serialize(self):
        return {"class_name": "ToyOptimizer",
                "config": self.optimizer.get_config()}


def test_every_kind_has_a_row_in_the_architecture_page():
    page = (pathlib.Path(__file__).parents[1] / "docs"
            / "architecture.md").read_text()
    for kind in wrapping.KINDS:
        module = kind.__module__.replace("tf_lso._src.", "").replace(".", "/")
        assert f"| `{kind.__name__}` | `{module}.py` |" in page, kind


def test_the_kinds_table_is_the_registry():
    # tests/inner_kinds.py is the one list of kinds the tests run with.
    registered = set(wrapping.KINDS)
    tabled = [row.kind for row in inner_kinds.KINDS]
    assert len(tabled) == len(set(tabled)), tabled
    assert registered - set(tabled) == set(), "registered, not in the table"
    assert set(tabled) - registered == set(), "in the table, not registered"


def _kinds(kinds):
    """`wrapping.KINDS` is `kinds` in the block."""
    return mock.patch.object(wrapping, "KINDS", tuple(kinds))


class NewKindTest(tf.test.TestCase, parameterized.TestCase):
    """A kind added to `wrapping.KINDS`: one class, nothing else to touch."""

    def setUp(self):
        super().setUp()
        kinds = _kinds((*wrapping.KINDS, ToyKind))
        kinds.start()
        self.addCleanup(kinds.stop)

    def test_unregistered_it_is_refused_and_registered_it_is_listed(self):
        with _kinds(wrapping.KINDS[:-1]):
            with self.assertRaisesRegex(TypeError, "must be an instance of"):
                tf_lso.LossScaleOptimizer(ToyOptimizer(0.5))
        with self.assertRaisesRegex(TypeError, r"legacy optimizer\) or "
                                    r"ToyOptimizer \(a toy optimizer\), "
                                    r"but got: 1 of type int"):
            tf_lso.LossScaleOptimizer(1)

    def test_messages_that_list_kinds_list_it(self):
        with self.assertRaisesRegex(ValueError, r"and wraps .*legacy "
                                    r"optimizer\) or ToyOptimizer \(a toy "
                                    r"optimizer\)\."):
            tf_lso.experimental.enable_mixed_precision_graph_rewrite(1)
        with tf.Graph().as_default():
            opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD())
            with self.assertRaisesRegex(
                    RuntimeError, r"must be a tf_keras legacy optimizer "
                    r"\(`tf_keras.optimizers.legacy.Optimizer`\) or a toy "
                    r"optimizer \(ToyOptimizer\): "):
                opt.apply_gradients([(tf.constant(1.0), tf.Variable(1.0))])

    @test_util.EAGER_AND_FUNCTION
    def test_trains_skips_and_round_trips(self, use_tf_function):
        opt = tf_lso.LossScaleOptimizer(ToyOptimizer(0.5), initial_scale=4,
                                        dynamic_growth_steps=10)
        self.assertIsInstance(opt._inner, ToyKind)
        var = tf.Variable(1.0)

        def step(grad):
            with tf.GradientTape() as tape:
                loss = opt.get_scaled_loss(var * grad)
            grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
            opt.apply_gradients(zip(grads, [var]))

        step = test_util.maybe_function(step, use_tf_function)
        step(tf.constant(2.0))
        self.assertEqual(float(var.numpy()), 0.0)  # 1 - 0.5 * 2
        step(tf.constant(NAN))
        self.assertEqual(float(var.numpy()), 0.0)  # Skipped.
        self.assertEqual(float(opt.loss_scale), 2.0)
        self.assertEqual(int(opt.iterations.numpy()), 2)
        self.assertEqual(int(opt.skipped_steps.numpy()), 1)

        config = opt.get_config()
        self.assertEqual(config["inner_optimizer"], {
            "class_name": "ToyOptimizer", "config": {"learning_rate": 0.5}})
        restored = tf_lso.LossScaleOptimizer.from_config(config)
        self.assertIsInstance(restored.inner_optimizer, ToyOptimizer)
        self.assertEqual(restored.inner_optimizer.learning_rate, 0.5)
        self.assertEqual(restored.initial_scale, 4.0)
        self.assertEqual(restored.dynamic_growth_steps, 10)

    def test_checkpoint_holds_its_state(self):
        opt = tf_lso.LossScaleOptimizer(ToyOptimizer(0.5), initial_scale=4)
        opt.iterations.assign(3)
        path = tf.train.Checkpoint(optimizer=opt).save(
            self.create_tempdir().full_path + "/ckpt")
        fresh = tf_lso.LossScaleOptimizer(ToyOptimizer(0.5), initial_scale=4)
        tf.train.Checkpoint(optimizer=fresh).restore(path).assert_consumed()
        self.assertEqual(int(fresh.iterations.numpy()), 3)

    def _model(self):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(
            tf_lso.LossScaleOptimizer(ToyOptimizer(0.125), initial_scale=4,
                                      dynamic_growth_steps=10), "mse")
        return model

    def test_trains_in_fit(self):
        model = self._model()
        before = [w.numpy() for w in model.trainable_weights]
        x, y = np.ones((8, 2), np.float32), np.zeros((8, 1), np.float32)
        model.fit(x, y, batch_size=4, epochs=2, verbose=0)
        opt = model.optimizer
        self.assertIsInstance(opt._inner, ToyKind)
        self.assertEqual(int(opt.iterations.numpy()), 4)
        self.assertEqual(int(opt.skipped_steps.numpy()), 0)
        for old, new in zip(before, model.trainable_weights):
            self.assertNotAllClose(old, new.numpy())
        # A NaN batch is skipped: the weights stay, the scale halves.
        trained = [w.numpy() for w in model.trainable_weights]
        model.fit(np.full((4, 2), np.nan, np.float32), y[:4], verbose=0)
        self.assertEqual(int(opt.skipped_steps.numpy()), 1)
        self.assertEqual(float(opt.loss_scale), 2.0)
        for old, new in zip(trained, model.trainable_weights):
            self.assertAllEqual(old, new.numpy())

    def test_keras_file_round_trip(self):
        model = self._model()
        x, y = np.ones((8, 2), np.float32), np.zeros((8, 1), np.float32)
        model.fit(x, y, batch_size=4, verbose=0)
        path = self.create_tempdir().full_path + "/toy.keras"
        model.save(path)
        loaded = keras.models.load_model(path)
        opt = loaded.optimizer
        self.assertIsInstance(opt, tf_lso.LossScaleOptimizer)
        self.assertIsInstance(opt._inner, ToyKind)
        self.assertEqual(opt.inner_optimizer.learning_rate, 0.125)
        self.assertEqual((opt.initial_scale, opt.dynamic_growth_steps),
                         (4.0, 10))
        self.assertEqual(int(opt.dynamic_counter), 2)  # The wrapper's state.
        for saved, read in zip(model.weights, loaded.weights):
            self.assertAllEqual(saved.numpy(), read.numpy())
        # Both go on alike (the toy's update does not read its counter).
        model.fit(x, y, batch_size=4, verbose=0)
        loaded.fit(x, y, batch_size=4, verbose=0)
        for theirs, ours in zip(model.weights, loaded.weights):
            self.assertAllEqual(theirs.numpy(), ours.numpy())

    def test_keras_file_holds_its_optimizers_state(self):
        # Keras saves a Keras 3 inner optimizer itself (it walks the
        # `inner_optimizer` attribute); the variables of one it does not
        # save (this toy, a tf.Module: `saved_by_keras` is False) are in
        # the wrapper's own entry (optimizer/checkpointing.py).
        model = self._model()
        model.fit(np.ones((8, 2), np.float32), np.zeros((8, 1), np.float32),
                  batch_size=4, verbose=0)
        path = self.create_tempdir().full_path + "/toy.keras"
        model.save(path)
        loaded = keras.models.load_model(path)
        self.assertEqual(int(loaded.optimizer.iterations.numpy()), 2)

    def test_v1_graph_run_by_a_session(self):
        with tf.Graph().as_default():
            var = tf.Variable([1.0, 2.0])
            opt = tf_lso.LossScaleOptimizer(ToyOptimizer(0.5),
                                            initial_scale=4,
                                            dynamic_growth_steps=10)
            grad = tf.compat.v1.placeholder(tf.float32, [2])
            train_op = opt.apply_gradients([(grad, var)])
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                session.run(train_op, {grad: [2.0, 2.0]})
                self.assertAllEqual(session.run(var), [0.0, 1.0])
                session.run(train_op, {grad: [np.nan, 2.0]})  # Skipped.
                self.assertAllEqual(session.run(var), [0.0, 1.0])
                self.assertEqual(session.run(opt.loss_scale), 2.0)
                self.assertEqual(session.run(opt.iterations), 2)
                self.assertEqual(session.run(opt.skipped_steps), 1)


if __name__ == "__main__":
    tf.test.main()
