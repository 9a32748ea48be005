"""`bfloat16-loss-scale`: a dynamic loss scale under `mixed_bfloat16`."""

import ast

from tf_lso_migration import rule
from tf_lso_migration.rules import _policies as mp

# Loss scale optimizers (canonical names, tf_lso's for legacy ones) and
# whether their loss scale is dynamic unless said otherwise.
_OPTIMIZERS = {
    "tf_lso.LossScaleOptimizer": "dynamic",       # TF 2.4's class
    "tf_lso.experimental.LossScaleOptimizer": "loss_scale",  # TF 2.1-2.3's
    "tf.keras.optimizers.LossScaleOptimizer": "always",  # Keras 3's
}
_DYNAMIC_LOSS_SCALES = frozenset({
    "tf_lso.experimental.DynamicLossScale",
    "tf.compat.v1.mixed_precision.DynamicLossScale",
})


@rule.register
class Bfloat16LossScale(rule.Rule):
    """a dynamic loss scale (a `LossScaleOptimizer`, a `DynamicLossScale`)
    in a file whose global policy is `mixed_bfloat16`, which needs no loss
    scaling

    bfloat16 has float32's exponent range: its gradients neither underflow
    nor overflow where float32's would not, and TensorFlow's mixed
    precision guide says loss scaling is not needed with it. A dynamic loss
    scale still costs a finite check of every gradient on every step, and
    skips steps it need not skip. Drop the wrapper and train with the inner
    optimizer (`opt = inner_optimizer`; `get_scaled_loss` and
    `get_unscaled_gradients` go too).

    Reported only where every global policy the file sets is
    `'mixed_bfloat16'`, written out, and the optimizer is not built in a
    branch that the policy is not set in, or under an `if` that asks about
    the policy or a dtype. A policy set under an `if` that the optimizer is
    not under is named: "When `use_tpu` is true, ..." (not `__name__ ==
    "__main__"`, where the script runs).
    """

    id, severity = "bfloat16-loss-scale", "warning"
    section = "Mixed-precision bugs"
    mentions = ("mixed_bfloat16",)  # The policy, written out.

    def finish(self, context):
        policy = mp.file_policy(context, "mixed_bfloat16")
        if policy is None:
            return
        for node in ast.walk(context.tree):
            if (isinstance(node, ast.Call) and _dynamic(context, node)
                    and mp.runs_under(context, node, policy)):
                when = mp.phrase(mp.policy_path(context, node, policy))
                message = (
                    "A dynamic loss scale under the 'mixed_bfloat16' policy "
                    f"set at {context.line(policy.node.lineno)}: bfloat16 has "
                    "float32's range and needs no loss scaling, which here "
                    "costs a finite check every step and can skip steps. "
                    "Train with the inner optimizer instead (and drop "
                    "`get_scaled_loss`/`get_unscaled_gradients`).")
                if when:
                    message = when + message[0].lower() + message[1:]
                context.report(node, self.id, message)


def _dynamic(context, node):
    """Whether `node` builds a loss scale optimizer or loss scale that is
    dynamic for sure."""
    name = mp.behaviour(context, node.func)
    if name in _DYNAMIC_LOSS_SCALES:
        return True
    how = _OPTIMIZERS.get(name)
    if how is None or any(k.arg is None for k in node.keywords):
        return False
    if how == "always":
        return True
    if how == "dynamic":
        given = _argument(node, 1, "dynamic")
        return given is None or (isinstance(given, ast.Constant)
                                 and given.value is True)
    given = _argument(node, 1, "loss_scale")
    return (mp.string_argument(given) == "dynamic" or (
        isinstance(given, ast.Call)
        and mp.behaviour(context, given.func) in _DYNAMIC_LOSS_SCALES))


def _argument(node, index, keyword):
    if any(isinstance(a, ast.Starred) for a in node.args):
        return ast.Name("unknown")  # Not sure what was passed.
    if len(node.args) > index:
        return node.args[index]
    return next((k.value for k in node.keywords if k.arg == keyword), None)
