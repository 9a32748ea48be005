"""The underflow and headroom report (issue 43): `opt.gradient_report` and
`LossScaleMonitor(gradient_report_freq=N)`, against NumPy."""

import keras
import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import tf_lso
from tf_lso._src.optimizer import loss_scale_optimizer as lso_lib

import inner_kinds
import test_util

tf_keras = test_util.tf_keras

MIN_NORMAL = 2.0**-14


def _expected(grads, scale):
    """The report's per-gradient fields, in NumPy (float64)."""
    zero, below, headroom, size = [], [], [], []
    for g in grads:
        if g is None:
            zero.append(np.nan)
            below.append(np.nan)
            headroom.append(np.nan)
            size.append(0)
            continue
        values = g.values if isinstance(g, tf.IndexedSlices) else g
        x = np.abs(np.asarray(values, np.float64).ravel() * scale)
        zero.append(np.mean(x == 0))
        below.append(np.mean(x < MIN_NORMAL))
        headroom.append(np.floor(np.log2(65504.0 / x.max())) if x.max()
                        else np.inf)
        size.append(x.size)
    return zero, below, headroom, size


def _known_grads():
    """Dense gradients of several kinds, an IndexedSlices and a None."""
    rng = np.random.default_rng(5)

    def magnitudes(shape):
        # Magnitudes from 2**-40 to 2**4, some exact zeros and signs.
        x = 2.0 ** rng.uniform(-40, 4, size=shape)
        x *= rng.choice([-1.0, 1.0, 0.0], size=shape, p=[0.45, 0.45, 0.1])
        return x.astype(np.float32)

    return [
        tf.constant(magnitudes([3, 4])),  # stacked with the next one
        tf.constant(magnitudes([3, 4])),
        None,
        tf.constant(magnitudes([200, 100])),  # too big to stack
        tf.IndexedSlices(tf.constant(magnitudes([5, 4])),
                         tf.constant([0, 7, 7, 2, 9]),
                         tf.constant([10, 4])),
        tf.constant(magnitudes([7])),
        tf.zeros([2]),
        tf.constant(magnitudes([3, 4]).astype(np.float16)),  # float16
    ]


def _variables():
    shapes = [[3, 4], [3, 4], [2], [200, 100], [10, 4], [7], [2], [3, 4]]
    return [tf.Variable(tf.zeros(s), name=f"v{i}")
            for i, s in enumerate(shapes)]


class GradientReportTest(tf.test.TestCase, parameterized.TestCase):
    def _assert_matches(self, report, grads, scale, names, at=None):
        zero, below, headroom, size = _expected(
            grads, scale if at is None else at)
        self.assertEqual(float(report.loss_scale), float(scale))
        self.assertEqual(tuple(report.variables), tuple(names))
        self.assertAllClose(report.zero_share, zero, rtol=1e-6, atol=0)
        self.assertAllClose(report.below_normal_share, below, rtol=1e-6,
                            atol=0)
        self.assertAllEqual(report.headroom, headroom)
        self.assertAllEqual(report.size, size)

    @parameterized.product(
        mode=["eager", "tf_function", "jit"], scale=[1.0, 2.0**15],
        scaled=[False, True])
    def test_matches_numpy(self, mode, scale, scaled):
        grads = _known_grads()
        if scaled:  # Gradients of the scaled loss (float16 may overflow).
            grads = [
                g if g is None
                else tf.IndexedSlices(g.values * scale, g.indices,
                                      g.dense_shape)
                if isinstance(g, tf.IndexedSlices)
                else g * tf.cast(scale, g.dtype) for g in grads]
        variables = _variables()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(),
                                        initial_scale=scale)

        def report(grads):
            result = opt.gradient_report(grads, variables, scaled=scaled)
            return result[2:] + (result.loss_scale,)

        if mode != "eager":
            report = tf.function(report, jit_compile=mode == "jit")
        *fields, loss_scale = report(grads)
        names = [v.name for v in variables]
        self._assert_matches(
            tf_lso.GradientReport(loss_scale, names, *fields), grads, scale,
            names, at=1.0 if scaled else None)
        if mode == "eager":
            self.assertIsInstance(fields[0], np.ndarray)

    def test_underflow_at_scale_one_and_not_at_a_high_scale(self):
        # Float16-range gradients of 2**-20: all below the smallest normal
        # at scale 1, none at 2**15 (2**-5), with 10 doublings left.
        grads = [tf.fill([8], 2.0**-20)]
        low = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(),
                                        initial_scale=1)
        high = tf_lso.LossScaleOptimizer(keras.optimizers.SGD())
        self.assertAllEqual(low.gradient_report(grads).below_normal_share,
                            [1.0])
        report = high.gradient_report(grads)
        self.assertAllEqual(report.below_normal_share, [0.0])
        self.assertAllEqual(report.headroom, [20.0])  # 65504 / 2**-5.
        self.assertEqual(report.variables, ("0",))

    @parameterized.parameters("eager", "tf_function", "jit")
    def test_a_nonfinite_gradient_has_no_headroom(self, mode):
        # A NaN element, as an Inf one, leaves no headroom: -inf, also for
        # the step's minimum (a step the optimizer skips).
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(),
                                        initial_scale=1024)

        def report(grads):
            result = opt.gradient_report(grads)
            return result.headroom, result.min_headroom

        if mode != "eager":
            report = tf.function(report, jit_compile=mode == "jit")
        headroom, min_headroom = report([
            tf.constant([np.nan, 1.0]), tf.constant([np.inf, 1.0]),
            tf.constant([1e-3]), None])
        # 65504 / (1e-3 * 1024) is 2**15.97; a None gradient has NaN.
        self.assertAllEqual(headroom, [-np.inf, -np.inf, 15.0, np.nan])
        self.assertEqual(float(min_headroom), -np.inf)

    def test_totals(self):
        grads = _known_grads()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(),
                                        initial_scale=64)
        report = opt.gradient_report(grads)
        zero, below, headroom, size = _expected(grads, 64)
        size = np.asarray(size, np.float64)
        present = size > 0
        self.assertAllClose(
            report.total_zero_share,
            np.sum(np.asarray(zero)[present] * size[present]) / size.sum())
        self.assertAllClose(
            report.total_below_normal_share,
            np.sum(np.asarray(below)[present] * size[present]) / size.sum())
        self.assertEqual(float(report.min_headroom),
                         np.nanmin(np.asarray(headroom)))

    @parameterized.named_parameters(
        (name, name) for name in inner_kinds.TF_KERAS_NAMES)
    def test_every_inner_optimizer_kind(self, kind):
        grads = _known_grads()
        opt = tf_lso.LossScaleOptimizer(inner_kinds.sgd(kind),
                                        initial_scale=128)
        self._assert_matches(opt.gradient_report(grads), grads, 128,
                             [str(i) for i in range(len(grads))])


def _step(opt, variables, use_tf_function=True, jit_compile=None):
    def step(grads):
        opt.apply_gradients(zip(grads, variables))

    if use_tf_function:
        step = tf.function(step, jit_compile=jit_compile)
    return step


class RecordTest(tf.test.TestCase, parameterized.TestCase):
    """The on-device report of a requested step, as the monitor uses it."""

    @parameterized.named_parameters(
        ("keras_eager", "keras", False, None),
        ("keras_tf_function", "keras", True, None),
        ("keras_jit", "keras", True, True),
        *((name, name, True, None) for name in inner_kinds.TF_KERAS_NAMES))
    def test_requested_step_is_recorded(self, kind, use_tf_function, jit):
        opt = tf_lso.LossScaleOptimizer(inner_kinds.sgd(kind, 0.0),
                                        initial_scale=2**10)
        variables = _variables()
        reports = lso_lib.gradient_reports(opt)
        reports.enabled = True
        step = _step(opt, variables, use_tf_function, jit)
        grads = _known_grads()
        grads[-1] = tf.cast(grads[-1], tf.float32)
        step(grads)
        self.assertIsNone(lso_lib.last_gradient_report(opt))  # Not requested.
        reports.requested.assign(True)
        step(grads)
        self.assertFalse(reports.requested.numpy())
        report = lso_lib.last_gradient_report(opt)
        zero, below, headroom, size = _expected(grads, 2.0**10)
        self.assertEqual(report.loss_scale, 1024.0)
        self.assertEqual(report.variables, tuple(v.name for v in variables))
        self.assertAllClose(report.zero_share, zero, rtol=1e-6, atol=0)
        self.assertAllClose(report.below_normal_share, below, rtol=1e-6,
                            atol=0)
        self.assertAllEqual(report.headroom, headroom)
        self.assertAllEqual(report.size, size)
        self.assertEqual(test_util.num(reports.step), 1)

    def test_free_when_off(self):
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        variables = _variables()[:2]
        step = _step(opt, variables)
        graph = step.get_concrete_function(
            [tf.TensorSpec([3, 4])] * 2).graph
        requested = lso_lib.gradient_reports(opt).requested
        captured = [t for t in graph.captures
                    if t[0] is requested.handle]
        self.assertEmpty(captured)
        self.assertEmpty([op for op in graph.get_operations()
                          if "gradient_report" in op.name])

    def test_mirrored_custom_loop(self):
        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            variables = [tf.Variable(tf.zeros([4]), name="w"),
                         tf.Variable(tf.zeros([]), name="b")]
            opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.0),
                                            initial_scale=2**10)
        lso_lib.gradient_reports(opt).enabled = True
        lso_lib.gradient_reports(opt).requested.assign(True)
        per_replica = [2.0**-30, 2.0**-20]

        def replica_step():
            g = tf.gather(tf.constant(per_replica), test_util.replica_id())
            opt.apply_gradients(zip(
                [tf.stack([0.0, g, 1.0, 3.0]), tf.constant(0.5)], variables))

        tf.function(lambda: strategy.run(replica_step))()
        report = lso_lib.last_gradient_report(opt)
        # The summed gradients, as they are applied.
        summed = [np.array([0.0, sum(per_replica), 2.0, 6.0]), np.array(1.0)]
        zero, below, headroom, size = _expected(summed, 1024.0)
        self.assertAllClose(report.zero_share, zero)
        self.assertAllClose(report.below_normal_share, below)
        self.assertAllEqual(report.headroom, headroom)
        self.assertEqual(report.variables, ("w:0", "b:0"))


def _model():
    keras.utils.set_random_seed(6)
    return keras.Sequential([keras.Input((3,)),
                             keras.layers.Dense(4, name="hidden"),
                             keras.layers.Dense(1, name="out")])


def _data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(32, 3)).astype("float32")
    x[:, 2] *= 1e-9  # The kernel row for input 2 gets tiny gradients.
    y = rng.normal(size=(32, 1)).astype("float32")
    return x, y


class MonitorTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(
        ("one_device", False, False), ("jit", False, True),
        ("mirrored", True, False))
    def test_fit_reports_every_n_batches(self, mirrored, jit):
        scope = (test_util.mirrored_strategy().scope() if mirrored
                 else tf.distribute.get_strategy().scope())
        with scope:
            model = _model()
            # A zero learning rate: every batch's gradients are those of the
            # initial weights, which the test computes itself.
            opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.0),
                                            initial_scale=4)
            model.compile(opt, "mse", jit_compile=jit)
        x, y = _data()
        monitor = tf_lso.callbacks.LossScaleMonitor(gradient_report_freq=3)
        batch_logs = []

        class Logs(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                batch_logs.append(dict(logs))

        history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False,
                            verbose=0, callbacks=[monitor, Logs()])
        # Batches 3 (index 2) only: reported once.
        self.assertEqual([i for i, logs in enumerate(batch_logs)
                          if "gradient_zero_share" in logs], [2])
        with tf.GradientTape() as tape:
            loss = keras.losses.MeanSquaredError()(
                y[16:24], model(x[16:24]))
        grads = tape.gradient(loss, model.trainable_variables)
        zero, below, headroom, size = _expected(
            [g.numpy() for g in grads], 4.0)
        report = monitor.last_gradient_report
        self.assertEqual(report.variables,
                         tuple(v.path for v in model.trainable_variables))
        self.assertAllClose(report.zero_share, zero)
        self.assertAllClose(report.below_normal_share, below)
        self.assertAllEqual(report.headroom, headroom)
        self.assertGreater(report.below_normal_share[0], 0.0)
        self.assertEqual(history.history["gradient_headroom"],
                         [float(np.min(headroom))])
        self.assertAllClose(history.history["gradient_below_normal_share"],
                            [np.dot(below, size) / np.sum(size)])

    def test_off_by_default_and_validated(self):
        monitor = tf_lso.callbacks.LossScaleMonitor()
        self.assertIsNone(monitor.gradient_report_freq)
        model = _model()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.0))
        model.compile(opt, "mse")
        history = model.fit(*_data(), batch_size=8, verbose=0,
                            callbacks=[monitor])
        self.assertNotIn("gradient_zero_share", history.history)
        self.assertFalse(lso_lib.gradient_reports(opt).enabled)
        for value in (0, 1.5, "2"):
            with self.assertRaisesRegex((ValueError, TypeError),
                                        "gradient_report_freq"):
                tf_lso.callbacks.LossScaleMonitor(gradient_report_freq=value)

    def test_turning_it_on_for_a_second_fit_retraces(self):
        model = _model()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.0))
        model.compile(opt, "mse")
        x, y = _data()
        model.fit(x, y, batch_size=8, verbose=0)
        monitor = tf_lso.callbacks.LossScaleMonitor(gradient_report_freq=1)
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[monitor])
        self.assertIsNotNone(monitor.last_gradient_report)
        self.assertEqual(test_util.num(lso_lib.gradient_reports(opt).step), 7)


class MoreTest(tf.test.TestCase):
    def test_tensorboard_shows_the_report(self):
        model = _model()
        model.compile(tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.0)),
                      "mse")
        log_dir = self.create_tempdir().full_path
        model.fit(*_data(), batch_size=8, epochs=1, verbose=0, callbacks=[
            tf_lso.callbacks.LossScaleMonitor(gradient_report_freq=2),
            keras.callbacks.TensorBoard(log_dir, update_freq=1)])
        tags = set()
        for path in tf.io.gfile.glob(log_dir + "/train/*"):
            for event in tf.compat.v1.train.summary_iterator(path):
                tags.update(v.tag for v in event.summary.value)
        for name in ("gradient_zero_share", "gradient_below_normal_share",
                     "gradient_headroom"):
            self.assertIn(f"epoch_{name}", tags)
            self.assertIn(f"batch_{name}", tags)

    def test_mirrored_eager_custom_loop(self):
        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            variables = [tf.Variable(tf.zeros([3]), name="w")]
            opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.0),
                                            initial_scale=2)
        lso_lib.gradient_reports(opt).enabled = True
        lso_lib.gradient_reports(opt).requested.assign(True)
        strategy.run(lambda: opt.apply_gradients(
            [(tf.constant([0.0, 2.0**-20, 1.0]), variables[0])]))
        report = lso_lib.last_gradient_report(opt)
        # Summed over two replicas, at scale 2: 0, 2**-18, 4.
        self.assertAllClose(report.zero_share, [1 / 3])
        self.assertAllClose(report.below_normal_share, [2 / 3])
        self.assertAllEqual(report.headroom, [13.0])
