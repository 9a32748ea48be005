"""`optimizer-v2-subclass`: a Keras optimizer subclass with OptimizerV2 hooks.

Keras 3 optimizers never call `_resource_apply_dense` and its siblings, so
such a subclass trains nothing (or fails) on TF 2.16+.
"""

import ast

from tf_lso_migration import rule

_OPTIMIZER_V2_HOOKS = frozenset({
    "_resource_apply_dense", "_resource_apply_sparse", "_create_slots",
    "_prepare_local", "_set_hyper", "_get_hyper",
    "_resource_apply_sparse_duplicate_indices",
})
# Mixins from other packages that bring OptimizerV2 hooks to the optimizer
# they are mixed into.
_HOOK_MIXINS = {
    "tensorflow_addons.optimizers.DecoupledWeightDecayExtension": frozenset({
        "_resource_apply_dense", "_resource_apply_sparse"}),
}


@rule.register
class OptimizerV2Subclass(rule.Rule):
    """a `tf.keras.optimizers` subclass written against OptimizerV2's
    hooks, which Keras 3 optimizers do not call

    `_resource_apply_dense`, `_resource_apply_sparse`, `_create_slots`,
    `_set_hyper` and their siblings are OptimizerV2's hooks. The
    optimizers `tf.keras.optimizers` holds on TF 2.16+ (Keras 3's, or
    tf_keras's new ones) never call them (`_set_hyper` raises), so such a
    subclass trains nothing or fails. Subclass
    `tf_keras.optimizers.legacy.Optimizer` (custom loops with tf_keras
    models or `tf.Variable`s), or port it to `build`/`update_step`.

    On the tf_keras route a subclass of `tf.keras.optimizers.legacy.*` is
    fine (those are OptimizerV2) and is not reported.
    """

    id, severity = "optimizer-v2-subclass", "error"
    section = "tf_keras legacy inner optimizers"
    visits = (ast.ClassDef,)

    def visit(self, node, context):
        bases = [context.resolve(base) for base in node.bases]
        if not any(b and _is_keras_optimizer(b[0], context.route)
                   for b in bases):
            return
        hooks = _OPTIMIZER_V2_HOOKS & _methods(node, context.classes)
        for base in bases:
            if base and base[0] in _HOOK_MIXINS:
                hooks |= _HOOK_MIXINS[base[0]]
        if hooks:
            context.report(node, self.id, "This optimizer uses OptimizerV2 "
                           f"hooks ({', '.join(sorted(hooks))}) that the "
                           "optimizers of `tf.keras.optimizers` on TF 2.16+ "
                           "(Keras 3's, tf_keras's new ones) never call: "
                           "subclass "
                           "`tf_keras.optimizers.legacy.Optimizer` (custom "
                           "loops with tf_keras or tf.Variables) or port it "
                           "to Keras 3's `build`/`update_step`.")


def _is_keras_optimizer(name, route):
    """Whether `name` is a `tf.keras` optimizer that calls no OptimizerV2 hook.

    On the tf_keras route `tf.keras.optimizers.legacy.*` are OptimizerV2.
    """
    return name.startswith("tf.keras.optimizers.") and not (
        route == "tf-keras"
        and name.startswith("tf.keras.optimizers.legacy."))


def _called_self_methods(node):
    return {
        sub.func.attr for sub in ast.walk(node)
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)
        and isinstance(sub.func.value, ast.Name) and sub.func.value.id == "self"
    }


def _methods(node, classes, seen=()):
    """The methods a class defines or calls on `self`, its bases' included.

    Bases are followed when they are classes of the same file (`classes`:
    name -> ClassDef), as a mixin that brings OptimizerV2 hooks is
    (tensorflow/addons' `DecoupledWeightDecayExtension`).
    """
    found = _called_self_methods(node) | {
        item.name for item in node.body
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    for base in node.bases:
        if (isinstance(base, ast.Name) and base.id in classes
                and base.id not in seen):
            found |= _methods(classes[base.id], classes, seen + (node.name,))
    return found
