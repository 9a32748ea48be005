"""`tf_lso.callbacks.LossScaleMonitor`: the loss scale in Keras training logs."""

from __future__ import annotations

import warnings
from typing import Any

import keras

from tf_lso._src.optimizer import gradient_report as gradient_report_lib
from tf_lso._src.optimizer import loss_scale_optimizer as lso_lib
from tf_lso._src.optimizer import training_health
from tf_lso._src.scaling import validation


class LossScaleMonitor(keras.callbacks.Callback):
    """Adds the loss scale and the skipped-step count to the training logs.

    At the end of every epoch (and, with `update_freq=N`, every N batches) it
    logs `loss_scale`, `skipped_steps` (steps skipped for non-finite
    gradients so far), `last_overflow_count` (non-finite gradients at the
    last skipped step; `optimizer.last_overflow` names their variables) and
    `nonfinite_loss_steps` (steps skipped for a non-finite loss: a bug or
    bad data, not an overflow). They reach `History.history` and every later
    callback, so put it before `keras.callbacks.TensorBoard`. Each log costs
    one host sync, never one per step. It works under a distribution
    strategy too.

    It warns once (UserWarning) when steps are still skipped with the scale
    at its floor of 1: lowering the scale cannot help then. A step that
    halves the scale to 1 does not count. When the loss was not finite, the
    warning blames the inputs or the model instead.

    With `gradient_report_freq=N`, every N-th batch reports how its
    gradients sit in float16's range (`tf_lso.GradientReport`). Its
    `gradient_zero_share`, `gradient_below_normal_share` and
    `gradient_headroom` go into that batch's and the epoch's logs;
    `last_gradient_report` keeps the per-variable values.

    Args:
        update_freq: `"epoch"` (default), or an int N to also log every N
            training batches.
        max_consecutive_skips: None (default), or an int K >= 1. After more
            than K skipped steps in a row, training stops
            (`model.stop_training`) at the end of that batch. The message
            names the variables whose gradients were not finite, and says
            when the loss itself was not finite; `stop_reason` keeps it.
            Reads one scalar per batch, and the overflow record after a
            skipped step.
        stop_on_nonfinite_loss: If True, training stops at the end of the
            first batch skipped because the loss was not finite. Unlike the
            optimizer's option, this works under `jit_compile=True`. Reads
            one scalar per batch. Default False.
        gradient_report_freq: None (default: off, the step is unchanged),
            or an int N: report every N-th training batch. Turning it on
            retraces the training step. A step then reads one flag, and a
            reported step reads its report back once.

    Raises:
        ValueError: For an invalid `update_freq` or `max_consecutive_skips`,
            or, when training starts, a model whose optimizer is not
            tf_lso's.

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
        stop_on_nonfinite_loss: bool = False,
        gradient_report_freq: int | None = None,
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
        if not isinstance(stop_on_nonfinite_loss, bool):
            raise TypeError(
                "`stop_on_nonfinite_loss` must be a bool. Received: "
                f"stop_on_nonfinite_loss={stop_on_nonfinite_loss!r}.")
        self.stop_on_nonfinite_loss = stop_on_nonfinite_loss
        if gradient_report_freq is not None:
            gradient_report_freq = validation.integer(
                gradient_report_freq, "gradient_report_freq")
        self.gradient_report_freq = gradient_report_freq
        self.last_gradient_report: gradient_report_lib.GradientReport | None = (
            None)
        self._report_requested = False
        self.stop_reason: str | None = None
        self._warned_floor = False
        self._floor_skips_at_last_log = 0
        # `skipped_steps` at the last stuck check (None: check in full).
        self._skipped_at_last_check: int | None = None

    # tf_keras's fit (the legacy-Keras route) calls these; Keras 3's
    # callbacks lack them.
    _supports_tf_logs = False

    def _implements_train_batch_hooks(self) -> bool:
        return True

    def _implements_test_batch_hooks(self) -> bool:
        return False

    def _implements_predict_batch_hooks(self) -> bool:
        return False

    def _optimizer(self) -> Any:
        """The model's optimizer (tf_keras's `compile` keeps tf_lso's too)."""
        return getattr(self.model, "optimizer", None)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Checks that the model's optimizer is a tf_lso optimizer."""
        self._skipped_at_last_check = None
        optimizer = self._optimizer()
        if not hasattr(optimizer, "skipped_steps"):
            raise ValueError(
                "LossScaleMonitor needs a model compiled with a tf_lso "
                f"optimizer. Received: model.optimizer={optimizer!r}. "
                "Compile with tf_lso.LossScaleOptimizer(...) or "
                "tf_lso.experimental.LossScaleOptimizer(...)."
            )
        if self.gradient_report_freq is not None:
            reports = lso_lib.gradient_reports(optimizer)
            if not reports.enabled:
                # The step records reports only once traced with them on.
                reports.enabled = True
                self.model.make_train_function(force=True)

    def on_train_batch_begin(self, batch: int,
                             logs: dict[str, Any] | None = None) -> None:
        """Asks the optimizer for a gradient report every N batches."""
        freq = self.gradient_report_freq
        self._report_requested = freq is not None and (batch + 1) % freq == 0
        if self._report_requested:
            lso_lib.gradient_reports(self._optimizer()).requested.assign(True)

    def _log(self, logs: dict[str, Any] | None) -> None:
        optimizer = self._optimizer()
        floor_skips = training_health.host_int(
            optimizer.skipped_steps_at_floor)
        if (optimizer.dynamic and not self._warned_floor
                and floor_skips > self._floor_skips_at_last_log):
            self._warned_floor = True
            last = optimizer.last_overflow
            if last is not None and last.cause == "loss":
                why = ("the loss itself is not finite, so "
                       + training_health.LOSS_ADVICE)
            else:
                why = ("the gradients overflow without any scaling, so "
                       "lowering the scale cannot help. "
                       + training_health.REMEDIES)
            warnings.warn(
                "The loss scale is at its floor of 1 and steps are still "
                f"skipped for non-finite gradients: {why} Last overflow: "
                f"{last}.",
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
        logs["nonfinite_loss_steps"] = training_health.host_int(
            optimizer.nonfinite_loss_steps)
        self._log_report(logs)

    def _log_report(self, logs: dict[str, Any]) -> None:
        report = self.last_gradient_report
        if report is None:
            return
        logs["gradient_zero_share"] = float(report.total_zero_share)
        logs["gradient_below_normal_share"] = float(
            report.total_below_normal_share)
        logs["gradient_headroom"] = float(report.min_headroom)

    def on_train_batch_end(self, batch: int,
                           logs: dict[str, Any] | None = None) -> None:
        """Logs every `update_freq` batches; checks for a stuck run."""
        if self._report_requested:
            self.last_gradient_report = (
                lso_lib.last_gradient_report(self._optimizer()))
            if logs is not None:
                self._log_report(logs)
        if (isinstance(self.update_freq, int)  # not "epoch"
                and (batch + 1) % self.update_freq == 0):
            self._log(logs)
        if (self.max_consecutive_skips is not None
                or self.stop_on_nonfinite_loss):
            self._check_stuck()

    def _check_stuck(self) -> None:
        optimizer = self._optimizer()
        skipped = training_health.host_int(optimizer.skipped_steps)
        if skipped == self._skipped_at_last_check:
            return  # No step skipped since a check that found none stuck.
        self._skipped_at_last_check = skipped
        message = lso_lib.overflow_record(optimizer).stop_message(
            self.max_consecutive_skips,
            training_health.host_int(optimizer.iterations),
            self.stop_on_nonfinite_loss)
        if message is None:
            return
        self.stop_reason = "Stopping training: " + message
        print(self.stop_reason)
        self.model.stop_training = True

    def on_epoch_end(self, epoch: int,
                     logs: dict[str, Any] | None = None) -> None:
        """Adds `loss_scale` and `skipped_steps` to the epoch's logs."""
        self._log(logs)

