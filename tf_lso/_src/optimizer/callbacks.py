"""`tf_lso.callbacks.LossScaleMonitor`: the loss scale in Keras training logs."""

from __future__ import annotations

import warnings

import keras

from tf_lso._src.optimizer import training_health
from tf_lso._src.scaling import validation


class LossScaleMonitor(keras.callbacks.Callback):
    """Adds the loss scale and the skipped-step count to the training logs.

    At the end of every epoch (and, with `update_freq=N`, every N batches) it
    writes `loss_scale` (the current scale) and `skipped_steps` (steps skipped
    for non-finite gradients since the optimizer was created) into the logs,
    so they appear in `History.history` and in every callback after it, e.g.
    `keras.callbacks.TensorBoard` (as `epoch_loss_scale`). Put it *before*
    the TensorBoard callback in the list. Reading the values is one host
    sync per epoch (or per N batches), never one per step. It also logs
    `last_overflow_count`: how many gradients were not finite at the last
    skipped step (0 before the first); `optimizer.last_overflow` names their
    variables.

    It warns once (UserWarning) when steps are still being skipped with the
    loss scale at its floor of 1: lowering the scale cannot help then. (A
    step skipped at a higher scale that halves it to 1 does not count.)

    Every value works under a distribution strategy too.

    Args:
        update_freq: `"epoch"` (default), or an int N to also log every N
            training batches.
        max_consecutive_skips: None (default), or an int K >= 1: after more
            than K steps in a row were skipped, training stops
            (`model.stop_training`) at the end of that batch, with a message
            naming the variables whose gradients were not finite (also kept
            in `stop_reason`). Reads one scalar after every batch (the
            overflow record too, after a batch that skipped a step).

    Raises:
        ValueError: For an invalid `update_freq` or `max_consecutive_skips`,
            or at the start of training if the model's optimizer is not a
            tf_lso optimizer.

    >>> model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    >>> model.compile(tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
    ...               "mse")
    >>> history = model.fit(np.ones((4, 1)), np.ones((4, 1)), verbose=0,
    ...                     callbacks=[tf_lso.callbacks.LossScaleMonitor()])
    >>> history.history["loss_scale"], history.history["skipped_steps"]
    ([32768.0], [0])
    """

    def __init__(
        self, update_freq: str | int = "epoch",
        max_consecutive_skips: int | None = None,
    ) -> None:
        super().__init__()
        if update_freq != "epoch" and (
            isinstance(update_freq, bool)
            or not isinstance(update_freq, int)
            or update_freq < 1
        ):
            raise ValueError(
                '`update_freq` must be "epoch" or a positive int. Received: '
                f"update_freq={update_freq!r}. Pass e.g. 100 to log every "
                "100 batches."
            )
        self.update_freq = update_freq
        if max_consecutive_skips is not None:  # As the optimizer checks it.
            max_consecutive_skips = validation.integer(
                max_consecutive_skips, "max_consecutive_skips")
        self.max_consecutive_skips = max_consecutive_skips
        self.stop_reason = None
        self._warned_floor = False
        self._floor_skips_at_last_log = 0
        # `skipped_steps` at the last stuck check (None: check in full).
        self._skipped_at_last_check = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Checks that the model's optimizer is a tf_lso optimizer."""
        self._skipped_at_last_check = None
        optimizer = getattr(self.model, "optimizer", None)
        if not hasattr(optimizer, "skipped_steps"):
            raise ValueError(
                "LossScaleMonitor needs a model compiled with a tf_lso "
                f"optimizer. Received: model.optimizer={optimizer!r}. "
                "Compile with tf_lso.LossScaleOptimizer(...) or "
                "tf_lso.experimental.LossScaleOptimizer(...)."
            )

    def _log(self, logs):
        optimizer = self.model.optimizer
        floor_skips = training_health.host_int(
            optimizer.skipped_steps_at_floor)
        if (optimizer.dynamic and not self._warned_floor
                and floor_skips > self._floor_skips_at_last_log):
            self._warned_floor = True
            warnings.warn(
                "The loss scale is at its floor of 1 and steps are still "
                "skipped for non-finite gradients: the gradients overflow "
                "without any scaling, so lowering the scale cannot help. "
                f"Last overflow: {optimizer.last_overflow}. "
                + training_health.REMEDIES,
                stacklevel=2,
            )
        self._floor_skips_at_last_log = floor_skips
        if logs is None:
            return
        last = optimizer.last_overflow
        logs["loss_scale"] = float(optimizer.loss_scale)
        logs["skipped_steps"] = training_health.host_int(
            optimizer.skipped_steps)
        logs["last_overflow_count"] = 0 if last is None else last.count

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        """Logs every `update_freq` batches; checks for a stuck run."""
        if self.update_freq != "epoch" and (batch + 1) % self.update_freq == 0:
            self._log(logs)
        if self.max_consecutive_skips is not None:
            self._check_stuck()

    def _check_stuck(self):
        optimizer = self.model.optimizer
        skipped = training_health.host_int(optimizer.skipped_steps)
        if skipped == self._skipped_at_last_check:
            return  # No step skipped since a check that found none stuck.
        self._skipped_at_last_check = skipped
        last = optimizer.last_overflow
        if not training_health.is_stuck(
                last, self.max_consecutive_skips,
                training_health.host_int(optimizer.iterations)):
            return
        self.stop_reason = "Stopping training: " + (
            training_health.stuck_message(self.max_consecutive_skips, last))
        print(self.stop_reason)
        self.model.stop_training = True

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Adds `loss_scale` and `skipped_steps` to the epoch's logs."""
        self._log(logs)
