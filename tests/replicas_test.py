"""Tests for tf_lso._src.gradients.replicas: one skip decision for every replica.

Custom loops and `fit` under MirroredStrategy (two logical CPUs) and
OneDeviceStrategy; multi-worker runs are in multi_worker_test.py.
"""

import contextlib

import keras
import numpy as np
import pytest
import tensorflow as tf
from absl.testing import parameterized

import tf_lso
from tf_lso._src.gradients import packing as gradients
from tf_lso._src.gradients import replicas
from tf_lso._src.legacy_api import compile_hook

import test_util

INF = float("inf")
NAN = float("nan")


def _inner(kind, learning_rate):
    if kind == "keras":
        return keras.optimizers.SGD(learning_rate)
    tf_keras = pytest.importorskip("tf_keras")
    if kind == "tf_keras":
        return tf_keras.optimizers.SGD(learning_rate)
    return tf_keras.optimizers.legacy.SGD(learning_rate)


class AggregationTest(tf.test.TestCase, parameterized.TestCase):
    """`experimental_aggregate_gradients`, for every kind of inner optimizer."""

    @parameterized.product(
        kind=["keras", "tf_keras", "tf_keras_legacy"],
        use_tf_function=[False, True],
    )
    def test_reduced_once(self, kind, use_tf_function):
        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            summed = tf.Variable(1.0)
            reduced_by_user = tf.Variable(1.0)
            opt = tf_lso.LossScaleOptimizer(_inner(kind, 1.0), initial_scale=4)
            user_opt = tf_lso.LossScaleOptimizer(_inner(kind, 1.0),
                                                 initial_scale=4)

        def step(bad):
            # Replica 0 contributes 1 and replica 1 contributes 2 (or inf).
            grad = tf.cast(test_util.replica_id() + 1, tf.float32)
            grad = tf.where(bad & (grad > 1.0), INF, grad)
            opt.apply_gradients([(grad, summed)])
            context = tf.distribute.get_replica_context()
            total = context.all_reduce(tf.distribute.ReduceOp.SUM, grad)
            user_opt.apply_gradients(
                [(total, reduced_by_user)],
                experimental_aggregate_gradients=False,
            )

        run = test_util.maybe_function(
            lambda bad: strategy.run(step, args=(bad,)), use_tf_function
        )
        run(tf.constant(False))
        # Summed once: 1 - (1 + 2), not 1 - 2 * (1 + 2).
        self.assertEqual(test_util.local_values(strategy, summed), [-2.0, -2.0])
        self.assertEqual(test_util.local_values(strategy, reduced_by_user),
                         [-2.0, -2.0])
        run(tf.constant(True))
        self.assertEqual(test_util.local_values(strategy, summed), [-2.0, -2.0])
        self.assertEqual(test_util.local_values(strategy, reduced_by_user),
                         [-2.0, -2.0])
        for optimizer in (opt, user_opt):
            self.assertEqual(float(optimizer.loss_scale), 2.0)
            self.assertEqual(test_util.num(optimizer.skipped_steps), 1)
            self.assertEqual(test_util.num(optimizer.iterations), 2)

    @parameterized.product(
        kind=["keras", "tf_keras", "tf_keras_legacy"],
        use_tf_function=[False, True],
    )
    def test_a_sum_that_overflows_is_skipped(self, kind, use_tf_function):
        # Each replica's gradient is finite; their sum over replicas, which
        # is what the inner optimizer would apply, is not.
        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            var = tf.Variable(1.0)
            opt = tf_lso.LossScaleOptimizer(_inner(kind, 1.0), initial_scale=4)

        def step(grad):
            # The same value on each replica, computed there.
            grad += tf.cast(test_util.replica_id(), tf.float32) * 0.0
            opt.apply_gradients([(grad, var)])

        run = test_util.maybe_function(
            lambda g: strategy.run(step, args=(g,)), use_tf_function)
        run(tf.constant(3e38))
        self.assertEqual(test_util.local_values(strategy, var), [1.0, 1.0])
        self.assertEqual(float(opt.loss_scale), 2.0)
        self.assertEqual(test_util.num(opt.skipped_steps), 1)
        run(tf.constant(0.25))
        self.assertEqual(test_util.local_values(strategy, var), [0.5, 0.5])

    @parameterized.product(
        kind=["keras", "tf_keras", "tf_keras_legacy"],
        use_tf_function=[False, True],
    )
    def test_inner_apply_gradients_gets_plain_tensors(self, kind,
                                                      use_tf_function):
        # TF's testApplyGradientsGetsUnwrappedTensors: an inner optimizer
        # that overrides apply_gradients is called, on each replica, with
        # tensors, not PerReplica values.
        received = []

        class Recording(type(_inner(kind, 1.0))):
            def apply_gradients(self, grads_and_vars, *args, **kwargs):
                grads_and_vars = list(grads_and_vars)
                received.extend(type(g) for g, _ in grads_and_vars)
                return super().apply_gradients(grads_and_vars, *args,
                                               **kwargs)

        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            var = tf.Variable([5.0])
            opt = tf_lso.LossScaleOptimizer(Recording(learning_rate=1.0),
                                            dynamic=False, initial_scale=1)
        run = test_util.maybe_function(
            lambda: strategy.run(
                lambda: opt.minimize(lambda: var * 2.0, [var])),
            use_tf_function)
        run()
        # Once per replica (per trace: a tf.function whose first trace
        # creates variables is traced again).
        self.assertNotEmpty(received)
        self.assertEqual(len(received) % 2, 0)
        for grad_type in received:
            self.assertTrue(issubclass(grad_type, tf.Tensor), grad_type)
        self.assertEqual(test_util.local_values(strategy, var), [[1.0], [1.0]])

    def test_without_replicas_nothing_to_aggregate(self):
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0), False, 1)
        var = tf.Variable(1.0)
        opt.apply_gradients([(tf.constant(1.0), var)],
                            experimental_aggregate_gradients=False)
        self.assertEqual(float(var), 0.0)


class ReplicaOverflowTest(tf.test.TestCase, parameterized.TestCase):
    """A non-finite gradient on one replica skips the step on all of them."""

    @parameterized.product(bad_replica=[0, 1], use_tf_function=[False, True])
    def test_every_copy_stays_identical(self, bad_replica, use_tf_function):
        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            var = tf.Variable([1.0, -1.0])
            opt = tf_lso.LossScaleOptimizer(
                keras.optimizers.Adam(0.1), initial_scale=64,
                dynamic_growth_steps=2,
            )

        def step(bad):
            grad = tf.constant([0.5, 0.25])
            on_bad = tf.equal(test_util.replica_id(), bad_replica) & bad
            opt.apply_gradients([(tf.where(on_bad, INF, grad), var)])

        run = test_util.maybe_function(
            lambda bad: strategy.run(step, args=(bad,)), use_tf_function
        )
        run(tf.constant(False))
        scale_state = list(opt._loss_scale.variables)  # scale, good steps
        model_state = [var] + [v for v in opt.variables
                               if v is not opt.iterations]
        before = [test_util.local_values(strategy, v) for v in model_state]
        run(tf.constant(True))
        for variable, old in zip(model_state, before):
            new = test_util.local_values(strategy, variable)
            self.assertAllEqual(new[0], new[1], msg=variable.name)
            self.assertAllEqual(new[0], old[0], msg=variable.name)
        for variable, expected in zip(
            scale_state + [opt.iterations, opt.skipped_steps], [32, 0, 2, 1]
        ):
            self.assertEqual(test_util.local_values(strategy, variable),
                             [expected, expected], msg=variable.name)

    @parameterized.product(inner=["adam", "sgd", "rmsprop"],
                           use_tf_function=[False, True])
    def test_matches_tf_keras(self, inner, use_tf_function):
        # tf_keras's LossScaleOptimizer (TF 2.4's class, with TF 2.5+'s
        # aggregate-then-check) as the reference, on two replicas that see
        # different gradients, non-finite now and then on either one:
        # weights, slots, scale and iterations bit-equal after every step.
        tf_keras = test_util.tf_keras
        legacy = tf_keras.optimizers.legacy
        make_inner = {
            "adam": lambda: legacy.Adam(0.1, clipnorm=1.0),
            "sgd": lambda: legacy.SGD(0.1, momentum=0.9),
            "rmsprop": lambda: legacy.RMSprop(0.01, global_clipnorm=2.0),
        }[inner]
        rng = np.random.default_rng(3)
        shapes = [(3,), (2, 2)]
        strategy = test_util.mirrored_strategy()
        runs = []
        for make in (tf_keras.mixed_precision.LossScaleOptimizer,
                     tf_lso.LossScaleOptimizer):
            with strategy.scope():
                var_list = [tf.Variable(np.ones(s, np.float32))
                            for s in shapes]
                opt = make(make_inner(), initial_scale=1024.0,
                           dynamic_growth_steps=2)

            def step(grads0, grads1, opt=opt, var_list=var_list):
                first = tf.equal(test_util.replica_id(), 0)
                grads = [tf.where(first, g0, g1)
                         for g0, g1 in zip(grads0, grads1)]
                opt.apply_gradients(zip(grads, var_list))

            def run(grads0, grads1, step=step):
                strategy.run(step, args=(grads0, grads1))

            runs.append((opt, var_list,
                         test_util.maybe_function(run, use_tf_function)))
        (ref, ref_vars, ref_run), (opt, var_list, opt_run) = runs
        skipped = one_bad_replica = 0
        for _ in range(10):
            per_replica, bad = [], 0
            for _ in range(2):
                grads = [rng.normal(size=s).astype(np.float32) * 10
                         for s in shapes]
                if rng.random() < 0.25:
                    grads[rng.integers(2)].flat[0] = rng.choice(
                        [np.inf, -np.inf, np.nan])
                    bad += 1
                per_replica.append([tf.constant(g) for g in grads])
            one_bad_replica += bad == 1
            ref_run(*per_replica)
            opt_run(*per_replica)
            test_util.assert_same_state_as_tf_keras(
                self, opt, var_list, ref, ref_vars, use_tf_function, strategy)
            self.assertEqual(float(opt.loss_scale), float(ref.loss_scale))
            self.assertEqual(test_util.num(opt.iterations),
                             test_util.num(ref.iterations))
            skipped = test_util.num(opt.skipped_steps)
        self.assertBetween(skipped, 1, 9)  # Both branches were taken,
        self.assertGreaterEqual(one_bad_replica, 1)  # once for one replica.

    @parameterized.product(inner=["adam", "rmsprop", "adagrad"],
                           use_tf_function=[False, True])
    def test_matches_bare_keras_optimizer(self, inner, use_tf_function):
        # On two replicas that see different gradients, a kept step is the
        # bare Keras 3 optimizer's step bit for bit, and a skipped step
        # (non-finite on either replica) only counts. No clipping: tf_lso
        # clips the sum over replicas, Keras 3 each replica's gradient
        # (ClippingTest). The (40000,) gradient is too big to be stacked.
        make = {
            "adam": lambda: keras.optimizers.Adam(0.1),
            "rmsprop": lambda: keras.optimizers.RMSprop(0.01, momentum=0.5),
            "adagrad": lambda: keras.optimizers.Adagrad(0.1),
        }[inner]
        rng = np.random.default_rng(1)
        shapes = [(3,), (2, 2), (40000,)]
        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            var_list = [tf.Variable(np.ones(s, np.float32)) for s in shapes]
            bare_vars = [tf.Variable(np.ones(s, np.float32)) for s in shapes]
            opt = tf_lso.LossScaleOptimizer(make(), initial_scale=8.0,
                                            dynamic_growth_steps=2)
            bare = make()
            bare.build(bare_vars)

        def step(grads0, grads1, keep):
            first = tf.equal(test_util.replica_id(), 0)
            grads = [tf.where(first, g0, g1) for g0, g1 in zip(grads0, grads1)]
            opt.apply_gradients(zip(grads, var_list))
            if keep:
                bare.apply_gradients(zip(grads, bare_vars))

        run = test_util.maybe_function(
            lambda grads0, grads1, keep: strategy.run(
                step, args=(grads0, grads1, keep)),
            use_tf_function,
        )
        skipped = 0
        for _ in range(8):
            per_replica = [[rng.normal(size=s).astype(np.float32)
                            for s in shapes] for _ in range(2)]
            keep = rng.random() >= 0.3
            if not keep:
                per_replica[rng.integers(2)][0][0] = np.nan
                skipped += 1
            run(*([tf.constant(g) for g in grads] for grads in per_replica),
                keep)
            if not keep:
                bare.iterations.assign_add(1)
            self.assertLen(opt.variables, len(bare.variables))
            for a, e in zip(var_list + opt.variables,
                            bare_vars + bare.variables):
                for a_local, e_local in zip(
                    test_util.local_values(strategy, a),
                    test_util.local_values(strategy, e),
                ):
                    self.assertAllEqual(a_local, e_local)
        self.assertBetween(skipped, 1, 7)
        self.assertEqual(test_util.num(opt.skipped_steps), skipped)


RNG = np.random.default_rng(0)
X = RNG.normal(size=(64, 4)).astype("float32")
Y = RNG.normal(size=(64, 1)).astype("float32")


def _fit(strategy, make_optimizer, x=X, y=Y, synchronized_batch_norm=False,
         outside=(), **compile_kwargs):
    """Trains a small model for 2 epochs of 4 batches of 16 under `strategy`.

    With `synchronized_batch_norm`, the model's backward pass all-reduces
    across replicas (a `merge_call`, where replica threads switch).
    `outside` names what is done outside `strategy.scope()`: "optimizer"
    (made before the model), "compile".
    """
    if "optimizer" in outside:
        optimizer = make_optimizer()
    with strategy.scope():
        keras.utils.set_random_seed(1)
        batch_norm = ([keras.layers.BatchNormalization(synchronized=True)]
                      if synchronized_batch_norm else [])
        model = keras.Sequential([
            keras.Input((4,)),
            keras.layers.Dense(8, activation="tanh"),
            *batch_norm,
            keras.layers.Dense(1),
        ])
        if "optimizer" not in outside:
            optimizer = make_optimizer()
    with (contextlib.nullcontext() if "compile" in outside
          else strategy.scope()):
        model.compile(optimizer, "mse", **compile_kwargs)
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    return [w.numpy() for w in model.weights], model.optimizer


class FitTest(tf.test.TestCase, parameterized.TestCase):
    # Keras 3 cannot run `fit` with jit_compile=True under MirroredStrategy
    # even with a bare optimizer (XLA reads replica 1's variables from CPU:0).
    @parameterized.named_parameters(
        ("one_device", "one_device", {}),
        ("one_device_jit", "one_device", {"jit_compile": True}),
        ("mirrored", "mirrored", {}),
    )
    def test_fit_matches_single_device(self, strategy_name, compile_kwargs):
        expected, _ = _fit(test_util.default_strategy(),
                           lambda: keras.optimizers.Adam(0.01),
                           **compile_kwargs)
        actual, opt = _fit(
            test_util.STRATEGIES[strategy_name](),
            lambda: tf_lso.LossScaleOptimizer(
                keras.optimizers.Adam(0.01), initial_scale=256,
                dynamic_growth_steps=3,
            ),
            **compile_kwargs,
        )
        for a, e in zip(actual, expected):
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
        self.assertEqual(float(opt.loss_scale), 256.0 * 2**2)  # 8 steps

    @parameterized.product(bad_replica=[0, 1], kind=["v2", "v1"])
    def test_overflow_on_one_replica_skips_the_batch(self, bad_replica, kind):
        # Regression: Keras 3's LossScaleOptimizer decides from replica 0's
        # unreduced gradients, so an overflow on replica 1 only reaches the
        # weights as inf/NaN.
        strategy = test_util.mirrored_strategy()
        y = Y.copy()
        first = 16 + 8 * bad_replica  # Replica r gets rows 8r:8r+8 of a batch.
        y[first:first + 8] = 3e38  # Their squared error overflows to inf.
        self.assertEqual(self._nonfinite_replicas(strategy, X[16:32],
                                                  y[16:32]), [bad_replica])

        def make_optimizer():
            if kind == "v1":
                return tf_lso.experimental.LossScaleOptimizer(
                    keras.optimizers.SGD(0.05),
                    tf_lso.experimental.DynamicLossScale(1024.0),
                )
            return tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.05),
                                             initial_scale=1024)

        actual, opt = _fit(strategy, make_optimizer, y=y)
        # SGD ignores `iterations`, so a skipped batch is as if it were not
        # in the data at all.
        keep = np.r_[0:16, 32:64]
        expected, _ = _fit(test_util.default_strategy(),
                           lambda: keras.optimizers.SGD(0.05),
                           x=X[keep], y=Y[keep])
        for a, e in zip(actual, expected):
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
        self.assertEqual(test_util.num(opt.skipped_steps), 2)  # once per epoch
        self.assertEqual(float(opt.loss_scale), 256.0)
        self.assertEqual(test_util.num(opt.iterations), 8)

    @parameterized.parameters(("v2", ("optimizer",)),
                              ("v1", ("optimizer", "compile")))
    def test_an_optimizer_made_outside_the_scope(self, kind, outside):
        # As in the scope: one batch of each epoch overflows on replica 1
        # and is skipped once, Adam's bias correction counts each step once.
        strategy = test_util.mirrored_strategy()
        y = Y.copy()
        y[24:32] = 3e38

        def make_optimizer():
            if kind == "v1":
                return tf_lso.experimental.LossScaleOptimizer(
                    keras.optimizers.Adam(0.01),
                    tf_lso.experimental.DynamicLossScale(1024.0, 2))
            return tf_lso.LossScaleOptimizer(keras.optimizers.Adam(0.01),
                                             initial_scale=1024,
                                             dynamic_growth_steps=2)

        expected, inside = _fit(strategy, make_optimizer, y=y)
        actual, opt = _fit(strategy, make_optimizer, y=y, outside=outside)
        for a, e in zip(actual, expected):
            np.testing.assert_array_equal(a, e)
        for optimizer in (opt, inside):
            self.assertEqual(test_util.num(optimizer.skipped_steps), 2)
            self.assertEqual(test_util.num(optimizer.iterations), 8)
            # Halved twice, doubled twice (growth period 2).
            self.assertEqual(float(optimizer.loss_scale), 1024.0)

    def test_the_policy_wrap_compiled_outside_the_scope(self):
        # TF 2.1-2.3's policy with a loss scale: compile wraps the
        # optimizer, here outside the scope.
        strategy = test_util.mirrored_strategy()
        y = Y.copy()
        y[24:32] = 3e38
        tf_lso.experimental.set_policy(tf_lso.experimental.Policy(
            "float32", loss_scale=tf_lso.experimental.DynamicLossScale(
                1024.0, 2)))
        try:
            expected, inside = _fit(strategy,
                                    lambda: keras.optimizers.Adam(0.01), y=y)
            actual, outside = _fit(strategy,
                                   lambda: keras.optimizers.Adam(0.01), y=y,
                                   outside=("optimizer", "compile"))
        finally:
            tf_lso.experimental.set_policy("float32")
            compile_hook.disable()
        for a, e in zip(actual, expected):
            np.testing.assert_array_equal(a, e)
        for optimizer in (inside, outside):
            self.assertIsInstance(optimizer,
                                  tf_lso.experimental.LossScaleOptimizer)
            self.assertEqual(test_util.num(optimizer.skipped_steps), 2)
            self.assertEqual(test_util.num(optimizer.iterations), 8)
            self.assertEqual(float(optimizer.loss_scale()), 1024.0)

    @parameterized.parameters("v2", "v1")
    def test_a_merge_call_between_scale_loss_and_apply(self, kind):
        # Regression: whether apply_gradients' gradients came from
        # scale_loss was one flag for all replica threads; a synchronized
        # BatchNormalization switches threads inside tape.gradient, so the
        # first replica's apply_gradients cleared the flag before the
        # second read it, and the second's gradients stayed scaled.
        strategy = test_util.mirrored_strategy()

        def make_optimizer():
            if kind == "v1":
                return tf_lso.experimental.LossScaleOptimizer(
                    keras.optimizers.SGD(0.05), 1024)
            return tf_lso.LossScaleOptimizer(
                keras.optimizers.SGD(0.05), dynamic=False, initial_scale=1024)

        actual, opt = _fit(strategy, make_optimizer,
                           synchronized_batch_norm=True)
        expected, _ = _fit(strategy, lambda: keras.optimizers.SGD(0.05),
                           synchronized_batch_norm=True)
        for a, e in zip(actual, expected):
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)
        self.assertEqual(test_util.num(opt.skipped_steps), 0)

    def _nonfinite_replicas(self, strategy, x, y):
        """Which replicas see a non-finite squared error for this batch."""
        dataset = strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(len(x))
        )
        flags = strategy.run(
            lambda x, y: gradients.local_nonfinite([tf.square(y - x[:, :1])]),
            args=next(iter(dataset)),
        )
        return [i for i, flag in enumerate(
            strategy.experimental_local_results(flags)) if flag]


class ClippingTest(tf.test.TestCase, parameterized.TestCase):
    """Clipping sees the gradient summed over replicas, as in TF 2.4."""

    @parameterized.product(
        kind=["keras", "tf_keras", "tf_keras_legacy"],
        clip=["clipnorm", "clipvalue", "global_clipnorm"],
        use_tf_function=[False, True],
    )
    def test_clips_the_aggregated_gradient(self, kind, clip, use_tf_function):
        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            var = tf.Variable(5.0)
            inner = _inner(kind, 1.0)
            setattr(inner, clip, 2.0)
            opt = tf_lso.LossScaleOptimizer(inner, initial_scale=4)

        def step(bad):
            # Each replica has gradient 2.0 (or inf on replica 1): their sum,
            # 4.0, is clipped to 2.0.
            grad = tf.where(bad & (test_util.replica_id() > 0), INF, 2.0)
            opt.apply_gradients([(grad, var)])

        run = test_util.maybe_function(
            lambda bad: strategy.run(step, args=(bad,)), use_tf_function
        )
        run(tf.constant(False))
        self.assertEqual(test_util.local_values(strategy, var), [3.0, 3.0])
        run(tf.constant(True))  # Clipping never rescues an inf gradient.
        self.assertEqual(test_util.local_values(strategy, var), [3.0, 3.0])
        self.assertEqual(float(opt.loss_scale), 2.0)
        # Unaggregated: the user's own sum is clipped once, not summed again.
        context_total = lambda g: tf.distribute.get_replica_context(  # noqa
        ).all_reduce(tf.distribute.ReduceOp.SUM, g)

        def user_step():
            total = context_total(tf.constant(2.0))
            opt.apply_gradients([(total, var)],
                                experimental_aggregate_gradients=False)

        test_util.maybe_function(
            lambda: strategy.run(user_step), use_tf_function
        )()
        self.assertEqual(test_util.local_values(strategy, var), [1.0, 1.0])

    def test_fit_clips_the_aggregated_gradient(self):
        def make(clipped):
            inner = keras.optimizers.SGD(0.5, global_clipnorm=0.01)
            if clipped:
                return tf_lso.LossScaleOptimizer(inner, initial_scale=256)
            return inner

        expected, _ = _fit(test_util.default_strategy(), lambda: make(False))
        actual, _ = _fit(test_util.mirrored_strategy(), lambda: make(True))
        for a, e in zip(actual, expected):
            np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6)


# Where each piece of a custom loop's optimizer is made: inside
# `strategy.scope()` or outside, before or after the model's variables.
# "wrapper_out" is TensorSpeech/TensorFlowTTS's trainer: the model and the
# inner optimizer inside the scope, the loss scale optimizer outside.
# The experimental class's `DynamicLossScale` is made where the wrapper is,
# unless "loss_scale" says otherwise.
LAYOUTS = {
    "all_in": dict(inner="in", wrapper="in"),
    "all_in_before_the_model": dict(inner="in", wrapper="in",
                                    before_the_model=True),
    "wrapper_out": dict(inner="in", wrapper="out"),
    "inner_out": dict(inner="out", wrapper="in"),
    "all_out": dict(inner="out", wrapper="out"),
    "all_out_before_the_model": dict(inner="out", wrapper="out",
                                     before_the_model=True),
    "loss_scale_out": dict(inner="in", wrapper="in", loss_scale="out"),
    "loss_scale_in": dict(inner="in", wrapper="out", loss_scale="in"),
    "from_config_out": dict(inner="in", wrapper="in", rebuilt="out"),
    "deserialize_out": dict(inner="in", wrapper="in", rebuilt="out",
                            deserialize=True),
}


class WhereTheOptimizerIsMadeTest(tf.test.TestCase, parameterized.TestCase):
    """Wherever it is made, the state changes once per step (issue 59).

    TF 2.4 updated its loss scale in a cross-replica context, so a loss
    scale optimizer made outside `strategy.scope()` trained as one made
    inside. Two replicas, five steps; on the second, replica 1's loss and
    gradient are NaN. Every layout must move as one replica would: the
    golden values below.
    """

    # After each step: (loss scale, counter, iterations, skipped steps,
    # the variable). One replica taking the summed gradient, 2.0 per
    # element, with SGD(0.25): -0.5 per applied step.
    GOLDEN = [
        (32768.0, 1, 1, 0, [0.5, 1.5]),
        (16384.0, 0, 2, 1, [0.5, 1.5]),
        (16384.0, 1, 3, 1, [0.0, 1.0]),
        (32768.0, 0, 4, 1, [-0.5, 0.5]),
        (32768.0, 1, 5, 1, [-1.0, 0.0]),
    ]

    def _made(self, layout, cls, kind):
        """The variable and the optimizer, made as `layout` says."""
        strategy = test_util.mirrored_strategy()
        where = {"in": strategy.scope, "out": contextlib.nullcontext}
        settings = LAYOUTS[layout]
        made = {}

        def make_variable():
            with strategy.scope():
                made["var"] = tf.Variable([1.0, 2.0], name="var")

        if not settings.get("before_the_model"):
            make_variable()
        with where[settings.get("loss_scale", settings["wrapper"])]():
            loss_scale = tf_lso.experimental.DynamicLossScale(32768.0, 2)
        with where[settings["inner"]]():
            inner = _inner(kind, 0.25)
        with where[settings["wrapper"]]():
            if cls == "v1":
                opt = tf_lso.experimental.LossScaleOptimizer(inner,
                                                             loss_scale)
            else:
                opt = tf_lso.LossScaleOptimizer(inner,
                                                dynamic_growth_steps=2)
        if "rebuilt" in settings:
            with where[settings["rebuilt"]]():
                if settings.get("deserialize"):
                    opt = keras.optimizers.deserialize(
                        keras.optimizers.serialize(opt))
                else:
                    opt = type(opt).from_config(opt.get_config())
        if settings.get("before_the_model"):
            make_variable()
        return made["var"], opt

    def _trajectory(self, var, opt, use_tf_function):
        strategy = test_util.mirrored_strategy()

        def replica_step(bad):
            x = tf.where(bad & (test_util.replica_id() > 0), NAN, 1.0)
            with tf.GradientTape() as tape:
                scaled = opt.get_scaled_loss(tf.reduce_sum(var * x))
            grads = opt.get_unscaled_gradients(tape.gradient(scaled, [var]))
            opt.apply_gradients(zip(grads, [var]))

        run = test_util.maybe_function(
            lambda bad: strategy.run(replica_step, args=(bad,)),
            use_tf_function)
        trajectory = []
        for bad in (False, True, False, False, False):
            run(tf.constant(bad))
            copies = test_util.local_values(strategy, var)
            self.assertAllEqual(copies[0], copies[1])
            trajectory.append((
                float(opt.loss_scale), test_util.num(opt.dynamic_counter),
                test_util.num(opt.iterations),
                test_util.num(opt.skipped_steps), copies[0].tolist()))
        return trajectory

    @parameterized.product(
        layout=list(LAYOUTS), cls=["v1", "v2"], use_tf_function=[False, True])
    def test_a_keras_inner_optimizer(self, layout, cls, use_tf_function):
        if cls == "v2" and "loss_scale" in LAYOUTS[layout]:
            self.skipTest("tf_lso.LossScaleOptimizer makes its loss scale.")
        if cls == "v2" and layout == "all_in_before_the_model":
            self.skipTest("The experimental class covers it.")
        var, opt = self._made(layout, cls, "keras")
        self.assertEqual(self._trajectory(var, opt, use_tf_function),
                         self.GOLDEN)
        # The overflow record is written once too.
        self.assertEqual(opt.last_overflow,
                         tf_lso.Overflow(1, 1, ("var:0",), 1, "loss"))
        self.assertEqual(test_util.num(opt.nonfinite_loss_steps), 1)

    @parameterized.product(
        layout=["wrapper_out", "all_out"],
        kind=["tf_keras", "tf_keras_legacy"], use_tf_function=[False, True])
    def test_a_tf_keras_inner_optimizer(self, layout, kind, use_tf_function):
        var, opt = self._made(layout, "v1", kind)
        self.assertEqual(self._trajectory(var, opt, use_tf_function),
                         self.GOLDEN)

    @parameterized.parameters("wrapper_out", "all_out")
    def test_an_accumulation_window(self, layout):
        # Keras 3 accumulates only eagerly under MirroredStrategy.
        if not test_util.keras_has_gradient_accumulation():
            self.skipTest("Keras 3.4+ accumulates gradients.")
        strategy = test_util.mirrored_strategy()

        def made(layout):
            settings = LAYOUTS[layout]
            with strategy.scope():
                var = tf.Variable([1.0, 2.0], name="var")
            with {"in": strategy.scope,
                  "out": contextlib.nullcontext}[settings["inner"]]():
                inner = keras.optimizers.SGD(0.25,
                                             gradient_accumulation_steps=2)
            with {"in": strategy.scope,
                  "out": contextlib.nullcontext}[settings["wrapper"]]():
                opt = tf_lso.LossScaleOptimizer(inner,
                                                dynamic_growth_steps=1)
            return var, opt

        def states(var, opt):
            def replica_step(bad):
                x = tf.where(bad & (test_util.replica_id() > 0), NAN, 1.0)
                opt.apply_gradients([(tf.fill([2], x), var)])

            result = []
            # Windows of two calls: (finite, NaN) is skipped once, then
            # (finite, finite) applies and grows the scale.
            for bad in (False, True, False, False):
                strategy.run(replica_step, args=(tf.constant(bad),))
                result.append((
                    float(opt.loss_scale), test_util.num(opt.skipped_steps),
                    test_util.num(opt._step.window_overflowed),
                    test_util.local_values(strategy, var)[0].tolist()))
            return result

        expected = [(32768.0, 0, False, [1.0, 2.0]),
                    (16384.0, 1, False, [1.0, 2.0]),
                    (16384.0, 1, False, [1.0, 2.0]),
                    (32768.0, 1, False, [0.5, 1.5])]
        self.assertEqual(states(*made("all_in")), expected)
        self.assertEqual(states(*made(layout)), expected)


class CountingLossScale(tf_lso.experimental.LossScale):
    """A TF 2.4 user's loss scale: its own variable, default aggregation."""

    def __init__(self):
        super().__init__()
        self.updates = tf.Variable(0, dtype=tf.int64, name="updates")
        self.contexts = []

    def __call__(self):
        return tf.constant(8.0)

    def update(self, grads):
        self.contexts.append(tf.distribute.in_cross_replica_context())
        self.updates.assign_add(1)
        return None if tf.executing_eagerly() else tf.no_op(), True

    def get_config(self):
        return {}


def _apply_three_steps(strategy, opt, var, use_tf_function):
    """Three steps of `opt` on `var`, each replica's gradient 1.0."""
    run = test_util.maybe_function(
        lambda: strategy.run(
            lambda: opt.apply_gradients([(tf.constant(1.0), var)])),
        use_tf_function)
    for _ in range(3):
        run()


class UserLossScaleTest(tf.test.TestCase, parameterized.TestCase):
    """TF 2.4 called a user's `LossScale.update` once per step, in a
    cross-replica context, with every replica's gradients."""

    @parameterized.product(scope=["in", "out"], use_tf_function=[False, True])
    def test_update_runs_once_per_step(self, scope, use_tf_function):
        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            var = tf.Variable(1.0)
        with strategy.scope() if scope == "in" else contextlib.nullcontext():
            loss_scale = CountingLossScale()
        with strategy.scope():
            opt = tf_lso.experimental.LossScaleOptimizer(
                keras.optimizers.SGD(0.25), loss_scale)
        _apply_three_steps(strategy, opt, var, use_tf_function)
        self.assertEqual(test_util.local_values(strategy, loss_scale.updates),
                         [3] * len(strategy.experimental_local_results(
                             loss_scale.updates)))
        self.assertEqual(set(loss_scale.contexts), {True})
        self.assertEqual(test_util.local_values(strategy, var), [-0.5, -0.5])


class NeverAppliesLossScale(tf_lso.experimental.LossScale):
    """A user's loss scale whose `update` skips every step: a Python False."""

    def __call__(self):
        return tf.constant(8.0)

    def update(self, grads):
        return None if tf.executing_eagerly() else tf.no_op(), False

    def get_config(self):
        return {}


class PythonFalseSkipTest(tf.test.TestCase, parameterized.TestCase):
    """A skip decided in Python (a user's `update` returning False) counts
    once per step, as a skip decided by a tensor does."""

    @parameterized.product(scope=["in", "out"], use_tf_function=[False, True])
    def test_counts_once_per_step(self, scope, use_tf_function):
        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            var = tf.Variable(1.0)
        with strategy.scope() if scope == "in" else contextlib.nullcontext():
            opt = tf_lso.experimental.LossScaleOptimizer(
                keras.optimizers.SGD(0.25), NeverAppliesLossScale())
        _apply_three_steps(strategy, opt, var, use_tf_function)
        self.assertEqual(int(opt.skipped_steps.numpy()), 3)
        self.assertEqual(opt.last_overflow.consecutive_skips, 3)
        self.assertEqual(int(opt.iterations.numpy()), 3)
        self.assertEqual(test_util.local_values(strategy, var), [1.0, 1.0])


class AllFiniteTest(tf.test.TestCase, parameterized.TestCase):
    @test_util.EAGER_AND_FUNCTION
    def test_all_finite(self, use_tf_function):
        check = test_util.maybe_function(replicas.all_finite, use_tf_function)
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
                lambda: replicas.all_finite(
                    [test_util.value_on_replica_0(1.0, NAN)]
                )
            )

        results = strategy.experimental_local_results(run())
        self.assertEqual([bool(r) for r in results], [False, False])


class PackedAllFiniteTest(tf.test.TestCase, parameterized.TestCase):
    """`all_finite` of a `Packed`: the same verdict, without stacking again."""

    @parameterized.parameters(0.0, float("inf"), float("nan"))
    def test_same_verdict_as_all_finite(self, bad):
        grads = [tf.constant([1.0, bad]), tf.constant([2.0, 3.0]),
                 tf.constant([[4.0]]), None]
        packed = gradients.pack(grads)
        self.assertEqual(bool(replicas.all_finite(packed)),
                         bool(replicas.all_finite(grads)))
        self.assertEqual(bool(replicas.all_finite(packed)), bad == 0.0)

    def test_checks_the_stacks_as_they_are(self):
        # A stack of two (3,) gradients has the shape (2, 3) of the third
        # gradient: checking them must not stack them together again.
        @tf.function
        def check(a, c):
            return replicas.all_finite(gradients.pack([a, a + 1.0, c]))

        graph = check.get_concrete_function(
            tf.TensorSpec([3], tf.float32), tf.TensorSpec([2, 3], tf.float32)
        ).graph
        stacks = [op for op in graph.get_operations()
                  if op.type == "Pack" and op.name.startswith("stack")]
        self.assertLen(stacks, 1)  # pack()'s own stack, nothing more.
