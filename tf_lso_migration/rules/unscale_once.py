"""`unscale-once`: gradients of a scaled loss applied not unscaled, or
unscaled twice."""

from tf_lso_migration import rule
from tf_lso_migration.rules import _gradient_flow as flow


@rule.register
class UnscaleOnce(rule.Rule):
    """gradients of a scaled loss that reach the optimizer never unscaled
    (`get_scaled_loss`, then `apply_gradients` without
    `get_unscaled_gradients`), or unscaled twice

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
    unscale what they are given, and are not reported.
    """

    id, severity = "unscale-once", "warning"
    section = "Mixed-precision bugs"

    def finish(self, context):
        for event in flow.gradient_events(context):
            if event.what == "never":
                context.report(event.node, self.id, (
                    f"`{event.call}` gets gradients of a loss scaled by "
                    "`get_scaled_loss` that were never unscaled: each step "
                    "is the loss scale (2**15 by default) times too large, "
                    "or is skipped. Unscale them first: `grads = "
                    "opt.get_unscaled_gradients(tape.gradient(scaled_loss, "
                    "vars))`, then `opt.apply_gradients(zip(grads, vars))`."))
            elif event.what == "twice":
                again = ("unscales them again (it takes the gradients of the "
                         "scaled loss as they are)"
                         if event.call.endswith(".apply")
                         else "divides them by the loss scale a second time")
                context.report(event.node, self.id, (
                    f"These gradients were unscaled already "
                    f"(`get_unscaled_gradients`); `{event.call}` {again}: "
                    "each step is the loss scale times too small. Unscale "
                    "once: `opt.apply(grads)` with the gradients of the "
                    "scaled loss, or `opt.apply_gradients(zip("
                    "opt.get_unscaled_gradients(grads), vars))`."))
