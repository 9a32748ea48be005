"""`unscale-once`: gradients of a scaled loss applied not unscaled,
unscaled twice, or a loss scaled twice."""

from tf_lso_migration import rule
from tf_lso_migration.rules import _gradient_flow as flow


@rule.register
class UnscaleOnce(rule.Rule):
    """gradients of a scaled loss that reach the optimizer never unscaled
    (`get_scaled_loss`, then `apply_gradients` without
    `get_unscaled_gradients`), unscaled twice, or a loss scaled twice
    (`minimize` of a scaled loss)

    In TF 2.x's protocol `opt.get_scaled_loss(loss)` multiplies the loss by
    the loss scale and `apply_gradients` takes unscaled gradients: without
    `opt.get_unscaled_gradients(grads)` in between every step is the loss
    scale (2**15 by default) times too large, or is skipped. Unscaling twice
    makes every step that many times too small: `get_unscaled_gradients`
    called on its own result, or its result passed to `apply` (Keras 3's
    protocol), which unscales the gradients it is given. The right orders:

        grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, vars))
        opt.apply_gradients(zip(grads, vars))     # TF 2.x
        opt.apply(tape.gradient(opt.scale_loss(loss), vars))  # Keras 3

    After `scale_loss` (Keras 3's protocol) `apply_gradients` and `apply`
    unscale what they are given: reported only where the gradients were
    unscaled already (`g / opt.dynamic_scale`).

    An unscale is `get_unscaled_gradients`, a division by the optimizer's
    `loss_scale` (`[g / opt.loss_scale for g in grads]`), or a function of
    the same file that does one. `opt.minimize(lambda:
    opt.get_scaled_loss(loss), vars)` scales twice: `minimize` scales the
    loss it is given. Gradients accumulated into `tf.Variable`s on `self`
    (`self.acc[i].assign_add(g)`) are followed into the method that applies
    them. A loss scaled under a condition (`if self.mixed_precision:`) is
    followed on that condition's path, and the finding names it; where the
    unscale is under another test, or the path cannot be followed, nothing
    is reported (docs/migration.md lists what is not followed).
    """

    id, severity = "unscale-once", "warning"
    section = "Mixed-precision bugs"
    mentions = flow.MENTIONS

    def finish(self, context):
        for event in flow.gradient_events(context):
            message = _MESSAGES.get(event.what)
            if message is not None:
                context.report(event.node, self.id,
                               flow.on_path(event, message(event)))


def _never(event):
    via = flow.inside(event)
    if event.via:
        via += f", accumulated in `{event.via}`,"
    return (f"`{event.call}` gets gradients of a loss scaled by "
            f"`get_scaled_loss`{via} that were never unscaled: each step is "
            "the loss scale (2**15 by default) times too large, or is "
            "skipped. Unscale them first: `grads = "
            "opt.get_unscaled_gradients(tape.gradient(scaled_loss, vars))`, "
            "then `opt.apply_gradients(zip(grads, vars))`.")


def _twice(event):
    if event.call.endswith(".apply"):
        again = ("unscales them again (it takes the gradients of the scaled "
                 "loss as they are)")
    elif event.call.endswith(".apply_gradients"):
        again = ("unscales them again (after `scale_loss` it takes the "
                 "gradients of the scaled loss as they are)")
    else:
        again = "divides them by the loss scale a second time"
    if event.protocol == flow.KERAS3:
        once = ("give `apply` or `apply_gradients` the gradients of the "
                "scaled loss as they are.")
    else:
        once = ("`opt.apply(grads)` with the gradients of the scaled loss, "
                "or `opt.apply_gradients(zip(opt.get_unscaled_gradients("
                "grads), vars))`.")
    return (f"These gradients were unscaled already; `{event.call}`"
            f"{flow.inside(event)} {again}: each step is the loss scale "
            f"times too small. Unscale once: {once}")


def _scaled_twice(event):
    if event.call.endswith(".minimize"):
        return (f"`{event.call}` scales the loss it is given, and this one "
                f"was scaled already{flow.inside(event)}: its gradients are "
                "the loss scale times too large. Give `minimize` the loss "
                "itself: `opt.minimize(lambda: loss_fn(), vars)`.")
    return (f"`{event.call}`{flow.inside(event)} scales a loss that was "
            "scaled already: its gradients are the loss scale times too "
            "large. Scale the loss once.")


_MESSAGES = {"never": _never, "twice": _twice, "scaled-twice": _scaled_twice}
