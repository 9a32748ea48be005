"""Tests for tf_lso._src.optimizer.callbacks: `LossScaleMonitor` in `fit`.

Its logs with one device are in keras_fit_test.py and training_health_test.py;
here: under MirroredStrategy, and when its floor warning fires.
"""

import warnings

import keras
import numpy as np
import tensorflow as tf

import tf_lso

import test_util


def _model():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((4,)),
                             keras.layers.Dense(2, name="hidden"),
                             keras.layers.Dense(1, name="out")])


def _data(bad_batches=(), batches=8, batch_size=8):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(batches * batch_size, 4)).astype("float32")
    y = rng.normal(size=(batches * batch_size, 1)).astype("float32")
    for batch in bad_batches:
        y[batch * batch_size] = 3e38  # Its squared error overflows to inf.
    return x, y


def _fit(model, x, y, monitor, epochs=1, batch_size=8):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        history = model.fit(x, y, batch_size=batch_size, epochs=epochs,
                            shuffle=False, verbose=0, callbacks=[monitor])
    floor = [w for w in caught if "floor of 1" in str(w.message)]
    return history, floor


class MirroredFitTest(tf.test.TestCase):
    """Every host-side read of the optimizer's state, on two replicas."""

    def test_logs_stop_and_warning(self):
        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            model = _model()
            opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.01),
                                            initial_scale=2)
            model.compile(opt, "mse")
        monitor = tf_lso.callbacks.LossScaleMonitor(
            update_freq=2, max_consecutive_skips=2)
        # Batch 1 skips at scale 2, batches 3-5 at the floor of 1: stopped
        # after batch 5, the third skip in a row.
        x, y = _data(bad_batches=[1, 3, 4, 5])
        history, floor = _fit(model, x, y, monitor, epochs=2)
        self.assertEqual(history.history["skipped_steps"], [4])
        self.assertEqual(history.history["loss_scale"], [1.0])
        self.assertEqual(history.history["last_overflow_count"], [4])
        self.assertIn("3 steps in a row", monitor.stop_reason)
        self.assertIn("hidden/kernel", monitor.stop_reason)
        self.assertLen(floor, 1)
        self.assertEqual(test_util.num(opt.iterations), 6)
        overflow = opt.last_overflow
        self.assertEqual((overflow.step, overflow.count,
                          overflow.consecutive_skips), (5, 4, 3))
        self.assertIn("LossScaleOptimizer", repr(opt))

    def test_experimental_class_reads(self):
        strategy = test_util.mirrored_strategy()
        with strategy.scope():
            opt = tf_lso.experimental.LossScaleOptimizer(
                keras.optimizers.SGD(0.01), "dynamic")
        self.assertIn("current_loss_scale=32768.0", repr(opt.loss_scale))
        self.assertEqual(float(opt.loss_scale()), 32768.0)


class FloorWarningTest(tf.test.TestCase):
    """The warning: steps still skipped with the loss scale at 1."""

    def _run(self, bad_batches, initial_scale, epochs=1):
        model = _model()
        opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.01),
                                        initial_scale=initial_scale)
        model.compile(opt, "mse")
        x, y = _data(bad_batches=bad_batches)
        _, floor = _fit(model, x, y, tf_lso.callbacks.LossScaleMonitor(),
                        epochs=epochs)
        return opt, floor

    def test_not_for_a_skip_that_reached_the_floor(self):
        # The only skip happens at scale 2 (it halves to 1); every later
        # step is finite.
        opt, floor = self._run(bad_batches=[2], initial_scale=2)
        self.assertEqual(float(opt.loss_scale), 1.0)
        self.assertEqual(int(opt.skipped_steps.numpy()), 1)
        self.assertEqual(floor, [])

    def test_for_a_skip_at_the_floor(self):
        opt, floor = self._run(bad_batches=[2, 5], initial_scale=2)
        self.assertLen(floor, 1)
        self.assertIn("floor of 1", str(floor[0].message))

    def test_once_for_the_whole_run(self):
        _, floor = self._run(bad_batches=[1, 2, 4, 6], initial_scale=1,
                             epochs=3)
        self.assertLen(floor, 1)


if __name__ == "__main__":
    tf.test.main()
