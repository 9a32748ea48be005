"""The legacy mixed-precision names, and what they become in tf_lso.

The one table that `tf_lso.install()` (the public names, see
`installed_names`) and the migration tool's `legacy-name` rule (`check`
and `--fix`) both read, and how a dotted name is spelled canonically.

It is migration knowledge (a legacy name and what it becomes), and
`install()` is the migration done at run time, so it lives here, in
`tf_lso_migration`: the one place both can import without TensorFlow (a
module inside `tf_lso` could not be imported without the runtime).
Standard library only, and it imports nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

# The routes a code base can take to TF 2.16+: `tf.keras` is Keras 3
# (the default), or tf_keras 2.x (`TF_USE_LEGACY_KERAS=1`), which keeps TF
# 2.4's `tf.keras.mixed_precision` (`LossScaleOptimizer`, `Policy`, ...) but
# not TF 2.1-2.3's `experimental` module.
ROUTES: tuple[str, ...] = ("keras3", "tf-keras")

_LOSS_SCALES = ("LossScale", "FixedLossScale", "DynamicLossScale")
_SERIALIZATION = ("get", "serialize", "deserialize")
_POLICY = ("Policy", "set_policy", "global_policy", "get_layer_policy")
_GRAPH_REWRITE = ("enable_mixed_precision_graph_rewrite",
                  "disable_mixed_precision_graph_rewrite")

# Legacy modules and the tf_lso module that holds their names (only the
# names in `LEGACY_NAMES` are provided): TF 2.1-2.3's public experimental
# modules, and TF 2.x's private modules that some code imported.
LEGACY_MODULES: dict[str, str] = {
    "tf.keras.mixed_precision.experimental": "tf_lso.experimental",
    "tf.mixed_precision.experimental": "tf_lso.experimental",
    "tf.python.keras.mixed_precision.experimental.loss_scale_optimizer":
        "tf_lso.experimental",
    "tf.python.keras.mixed_precision.experimental.policy":
        "tf_lso.experimental",
    "tf.python.keras.mixed_precision.loss_scale_optimizer": "tf_lso",
    "tf.python.training.experimental.loss_scale": "tf_lso.experimental",
}


def _names(prefix: str, names: Iterable[str],
           target: str = "tf_lso.experimental") -> dict[str, str]:
    return {f"{prefix}.{name}": f"{target}.{name}" for name in names}


# Every legacy name tf_lso provides, canonically spelled (see `canonical`),
# and its tf_lso name: the one table that `tf_lso.install()` (the public
# names, see `installed_names`) and `check --fix` both read.
LEGACY_NAMES: dict[str, str] = {
    **_names("tf.keras.mixed_precision.experimental",
             ("LossScaleOptimizer",) + _POLICY + _LOSS_SCALES + _SERIALIZATION),
    **_names("tf.mixed_precision.experimental", _LOSS_SCALES + _SERIALIZATION),
    **_names("tf.train.experimental", _LOSS_SCALES + _GRAPH_REWRITE),
    # TF 2.4's class: on TF 2.16+ the name is Keras 3's, with another API.
    "tf.keras.mixed_precision.LossScaleOptimizer": "tf_lso.LossScaleOptimizer",
    # TF 2.x's private modules, which some code imported from.
    **_names("tf.python.keras.mixed_precision.experimental."
             "loss_scale_optimizer", ("LossScaleOptimizer",)),
    **_names("tf.python.keras.mixed_precision.experimental.policy", _POLICY),
    **_names("tf.python.keras.mixed_precision.loss_scale_optimizer",
             ("LossScaleOptimizer",), target="tf_lso"),
    **_names("tf.python.training.experimental.loss_scale",
             _LOSS_SCALES + _SERIALIZATION),
}

# Legacy names only where `tf.keras` is Keras 3: tf_keras 2.x has them, with
# TF 2.4's API.
KERAS3_ONLY: frozenset[str] = frozenset({"tf.keras.mixed_precision.LossScaleOptimizer"})

_PREFIXES = (
    ("tensorflow.compat.v2", "tf"),
    ("tf.compat.v2", "tf"),
    ("tensorflow", "tf"),
    ("keras", "tf.keras"),  # Standalone Keras 2 spelled tf.keras's names.
)


def canonical(dotted: str) -> str:
    """`dotted` with TensorFlow's and Keras's module spelled as `tf`/`tf.keras`.

    >>> canonical("tensorflow.keras.mixed_precision.experimental")
    'tf.keras.mixed_precision.experimental'
    """
    for prefix, replacement in _PREFIXES:
        if dotted == prefix or dotted.startswith(prefix + "."):
            return replacement + dotted[len(prefix):]
    return dotted


def replacement(dotted: str) -> str | None:
    """The tf_lso name of a canonical legacy name or module, or None."""
    if dotted in LEGACY_NAMES:
        return LEGACY_NAMES[dotted]
    return LEGACY_MODULES.get(dotted)


def behaviour(dotted: str) -> str:
    """What a canonical name stands for: its tf_lso name if it has one.

    Rules about behaviour ask this, so that a name reads the same before and
    after `--fix` (`tf.keras.mixed_precision.experimental.LossScaleOptimizer`
    and `tf_lso.experimental.LossScaleOptimizer` are one class).
    """
    return replacement(dotted) or dotted


def installed_names() -> list[str]:
    """The legacy names `tf_lso.install()` provides: the public ones.

    TF's private modules (`tf.python...`) are not provided at run time;
    `--fix` rewrites their imports.
    """
    return [name for name in LEGACY_NAMES if not name.startswith("tf.python.")]


def installed(dotted: str) -> bool:
    """Whether `install()` provides a canonical legacy name or module.

    >>> installed("tf.python.keras.mixed_precision.loss_scale_optimizer")
    False
    """
    return replacement(dotted) is not None and not dotted.startswith(
        "tf.python.")


def in_legacy_module(dotted: str) -> bool:
    """Whether a canonical dotted name is inside a legacy module."""
    return any(dotted.startswith(module + ".") for module in LEGACY_MODULES)


def is_legacy(dotted: str) -> bool:
    """Whether a canonical dotted name is, or is inside, a legacy module."""
    return replacement(dotted) is not None or in_legacy_module(dotted)


def is_legacy_on(dotted: str, route: str) -> bool:
    """Whether a canonical dotted name is legacy on `route` (`ROUTES`).

    >>> is_legacy_on("tf.keras.mixed_precision.LossScaleOptimizer", "tf-keras")
    False
    """
    return is_legacy(dotted) and (route == "keras3"
                                  or dotted not in KERAS3_ONLY)


def is_ours(dotted: str) -> bool:
    """Whether a canonical dotted name is tf_lso's."""
    return dotted == "tf_lso" or dotted.startswith("tf_lso.")
