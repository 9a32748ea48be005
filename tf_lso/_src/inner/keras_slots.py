"""TF 2.x (OptimizerV2) checkpoint names on a Keras 3 optimizer.

TF 2.x checkpoints name an optimizer's step counter `iter` and its slots by
slot name (`m`, `v`, `momentum`, ...) under each variable; a Keras 3
optimizer keeps the same state in variables named `<variable path>_<suffix>`.
`kinds.keras_optimizer.KerasInner` uses this mapping to restore TF 2.x checkpoints.
"""

from tf_lso._src import compat

# TF 2.x (OptimizerV2) slot names -> Keras 3 optimizer variable suffixes.
_SLOT_SUFFIXES = {
    "m": ("momentum", "m"),  # Adam, Nadam / Adamax
    "v": ("velocity", "u"),  # Adam, Nadam / Adamax
    "vhat": ("velocity_hat",),
    "rms": ("velocity",),
    "mg": ("average_gradient",),
    "accum_grad": ("accumulated_grad",),
    "accum_var": ("accumulated_delta_var",),
}


def legacy_dependency(optimizer, name):
    """The Keras 3 variable for TF 2.x child `name` (`iter`, ...), or None."""
    if name == "iter":
        return optimizer.iterations
    if name == "learning_rate":
        learning_rate = optimizer.learning_rate
        if compat.is_variable(learning_rate):
            return learning_rate
    return None


def _slot_prefix(variable):
    # As `keras.optimizers.Optimizer.add_variable_from_reference` names slots.
    if hasattr(variable, "path"):
        return variable.path.replace("/", "_")
    return str(variable.name).replace("/", "_").replace(":", "_")


def slot(optimizer, variable, slot_name):
    """The Keras 3 variable holding TF 2.x slot `slot_name` of `variable`."""
    prefix = _slot_prefix(variable)
    for suffix in _SLOT_SUFFIXES.get(slot_name, (slot_name,)):
        name = f"{prefix}_{suffix}"
        matches = [v for v in optimizer.variables if v.name == name]
        if len(matches) > 1:
            # Several variables share the name: slots follow the order of
            # the variables the optimizer was built with.
            same_prefix = [
                v for v in compat.keras_trainable_variables(optimizer)
                if _slot_prefix(v) == prefix
            ]
            position = [v is variable for v in same_prefix]
            if position.count(True) != 1 or len(same_prefix) != len(matches):
                return None
            matches = [matches[position.index(True)]]
        if matches and tuple(matches[0].shape) == tuple(variable.shape):
            return matches[0]
    return None
