"""`tf_lso.callbacks.LossScaleMonitor`: the loss scale in Keras training logs."""

import keras


class LossScaleMonitor(keras.callbacks.Callback):
    """Adds the loss scale and the skipped-step count to the training logs.

    At the end of every epoch (and, with `update_freq=N`, every N batches) it
    writes `loss_scale` (the current scale) and `skipped_steps` (steps skipped
    for non-finite gradients since the optimizer was created) into the logs,
    so they appear in `History.history` and in every callback after it, e.g.
    `keras.callbacks.TensorBoard` (as `epoch_loss_scale`). Put it *before*
    the TensorBoard callback in the list. Reading the values is one host
    sync per epoch (or per N batches), never one per step.

    Args:
        update_freq: `"epoch"` (default), or an int N to also log every N
            training batches.

    Raises:
        ValueError: For an invalid `update_freq`, or at the start of training
            if the model's optimizer is not a tf_lso optimizer.

    >>> model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    >>> model.compile(tf_lso.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
    ...               "mse")
    >>> history = model.fit(np.ones((4, 1)), np.ones((4, 1)), verbose=0,
    ...                     callbacks=[tf_lso.callbacks.LossScaleMonitor()])
    >>> history.history["loss_scale"], history.history["skipped_steps"]
    ([32768.0], [0])
    """

    def __init__(self, update_freq="epoch"):
        super().__init__()
        if update_freq != "epoch" and (
            isinstance(update_freq, bool)
            or not isinstance(update_freq, int)
            or update_freq < 1
        ):
            raise ValueError(
                '"update_freq" must be "epoch" or a positive int, but got: '
                f"{update_freq!r}."
            )
        self.update_freq = update_freq

    def on_train_begin(self, logs=None):
        """Checks that the model's optimizer is a tf_lso optimizer."""
        optimizer = getattr(self.model, "optimizer", None)
        if not hasattr(optimizer, "skipped_steps"):
            raise ValueError(
                "LossScaleMonitor needs a model compiled with a tf_lso "
                f"optimizer, but the model's optimizer is: {optimizer!r}. "
                "Compile with tf_lso.LossScaleOptimizer(...) or "
                "tf_lso.experimental.LossScaleOptimizer(...)."
            )

    def _log(self, logs):
        if logs is None:
            return
        optimizer = self.model.optimizer
        logs["loss_scale"] = float(optimizer.loss_scale)
        logs["skipped_steps"] = int(optimizer.skipped_steps)

    def on_train_batch_end(self, batch, logs=None):
        """Logs every `update_freq` batches when it is an int."""
        if self.update_freq != "epoch" and (batch + 1) % self.update_freq == 0:
            self._log(logs)

    def on_epoch_end(self, epoch, logs=None):
        """Adds `loss_scale` and `skipped_steps` to the epoch's logs."""
        self._log(logs)
