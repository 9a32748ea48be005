"""`clip-before-unscale`: gradients clipped, normed or logged while scaled."""

from tf_lso_migration import rule
from tf_lso_migration.rules import _gradient_flow as flow

# What shows that a file scales losses: Keras 3's `scale_loss` is the
# identity unless the optimizer is a loss scale optimizer (or has a
# `loss_scale_factor`).
LOSS_SCALING = ("mixed_float16", "LossScaleOptimizer", "loss_scale_factor",
                "get_scaled_loss", "get_unscaled_gradients", "dynamic_scale")


@rule.register
class ClipBeforeUnscale(rule.Rule):
    """gradients of a scaled loss clipped, normed or logged before they
    are unscaled, so that the clip or the logged value is off by the loss
    scale

    `tape.gradient(scaled_loss, vars)` returns the true gradients times the
    loss scale (2**15 by default). Clipping them to a norm of 1.0 clips
    almost every step, and a logged gradient or gradient norm is the loss
    scale times too large. Unscale first, then clip or log:

        grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, vars))
        grads, _ = tf.clip_by_global_norm(grads, 1.0)
        opt.apply_gradients(zip(grads, vars))

    With Keras 3's protocol (`scale_loss`, then `apply`, which unscales
    inside) the gradients are scaled up to `apply`: set the clipping on the
    inner optimizer (`global_clipnorm=`, `clipnorm=`), which clips unscaled
    gradients. Not reported: a clip norm that is itself multiplied by the
    loss scale (also through names, `*=` or on one path only: `threshold =
    max_norm * opt.loss_scale`, `threshold *= opt.loss_scale`, `s =
    opt.loss_scale` then `s * max_norm`), and a log call whose text says
    it logs a scaled value.

    `scale_loss` is the identity on an optimizer that is not a loss scale
    optimizer: a clip or a log after it is reported only in a file that
    shows loss scaling (it names `mixed_float16`, `LossScaleOptimizer`,
    `loss_scale_factor`, `dynamic_scale`, or TF 2.x's `get_scaled_loss` or
    `get_unscaled_gradients`), where under `mixed_float16` Keras's
    `compile` makes the optimizer one. A copy of Keras 3's own `train_step`
    (`if self.optimizer is not None: loss =
    self.optimizer.scale_loss(loss)`) with a clip added, in a file that
    shows none, is not sure: not reported.

    A clip is `tf.clip_by_global_norm`, `clip_by_norm`, `clip_by_value`,
    a call whose name says it clips, of another module or inherited from
    one (`agc.adaptive_clip_grad(vars, grads)`, `self._clip(grads)`; not
    where it is also given the optimizer or called on what holds it, `self`
    with `self.optimizer`: it may unscale first), or a function of the same
    file that calls one (followed one call down). A loss scaled
    under a condition (`if self.mixed_precision:`, `... if amp else loss`)
    is followed on that condition's path, and the finding names it ("When
    `self.mixed_precision` is true, ..."); where the unscale is under
    another test, or the path cannot be followed, nothing is reported
    (docs/migration.md lists what is not followed).
    """

    id, severity = "clip-before-unscale", "warning"
    section = "Mixed-precision bugs"
    mentions = flow.MENTIONS

    def finish(self, context):
        scales = context.mentions(*LOSS_SCALING)
        for event in flow.gradient_events(context):
            if event.what in ("clip", "log") and (
                    scales or event.protocol != flow.KERAS3):
                context.report(event.node, self.id, _message(event))


def _message(event):
    return flow.on_path(event, _what(event) + _instead(event))


def _what(event):
    via = flow.inside(event)
    if event.what == "log":
        return (f"`{event.call}` logs gradients of a scaled loss (or their "
                f"norm){via} before they are unscaled: the value is the loss "
                "scale (2**15 by default) times too large. ")
    clipping = (f"clipping them {event.clip}" if event.clip
                else "a clip meant for the true gradients")
    return (f"`{event.call}` clips gradients of a scaled loss{via} before "
            "they are unscaled: they are the true gradients times the loss "
            f"scale (2**15 by default), so {clipping} clips almost every "
            "one. ")


def _instead(event):
    if event.what == "log":
        return "Log what `opt.get_unscaled_gradients(grads)` returns."
    if event.protocol == flow.KERAS3:
        return ("After `scale_loss`, `apply` unscales inside: set the "
                "clipping on the inner optimizer (`global_clipnorm=`/"
                "`clipnorm=`), or with tf_lso's optimizer unscale first "
                "(`grads = opt.get_unscaled_gradients(grads)`), clip, then "
                "`opt.apply_gradients(zip(grads, vars))`.")
    return ("Unscale first: `grads = opt.get_unscaled_gradients("
            "tape.gradient(scaled_loss, vars))`, then clip, then "
            "`opt.apply_gradients(zip(grads, vars))`.")
