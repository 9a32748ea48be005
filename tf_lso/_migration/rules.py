"""What `python -m tf_lso check` looks for, and where the docs explain it.

Shared by the checker (`check.py`, standard library `ast`) and the
fixer (`fix.py`, LibCST): the legacy names and what they become,
how an imported dotted name is spelled canonically, and the rules.
"""

import collections
import re

SEVERITIES = ("info", "warning", "error")

_LOSS_SCALES = ("LossScale", "FixedLossScale", "DynamicLossScale")
_SERIALIZATION = ("get", "serialize", "deserialize")
_POLICY = ("Policy", "set_policy", "global_policy", "get_layer_policy")
_GRAPH_REWRITE = ("enable_mixed_precision_graph_rewrite",
                  "disable_mixed_precision_graph_rewrite")

# Legacy modules and the tf_lso module that holds their names (only the
# names in `LEGACY_NAMES` are provided): TF 2.1-2.3's public experimental
# modules, and TF 2.x's private modules that some code imported.
LEGACY_MODULES = {
    "tf.keras.mixed_precision.experimental": "tf_lso.experimental",
    "tf.mixed_precision.experimental": "tf_lso.experimental",
    "tf.python.keras.mixed_precision.experimental.loss_scale_optimizer":
        "tf_lso.experimental",
    "tf.python.keras.mixed_precision.experimental.policy":
        "tf_lso.experimental",
    "tf.python.keras.mixed_precision.loss_scale_optimizer": "tf_lso",
    "tf.python.training.experimental.loss_scale": "tf_lso.experimental",
}


def _names(prefix, names, target="tf_lso.experimental"):
    return {f"{prefix}.{name}": f"{target}.{name}" for name in names}


# Every legacy name tf_lso provides, canonically spelled (see `canonical`),
# and its tf_lso name: the one table that `tf_lso.install()` (the public
# names, see `installed_names`) and `check --fix` both read.
LEGACY_NAMES = {
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

_PREFIXES = (
    ("tensorflow.compat.v2", "tf"),
    ("tf.compat.v2", "tf"),
    ("tensorflow", "tf"),
    ("keras", "tf.keras"),  # Standalone Keras 2 spelled tf.keras's names.
)


def canonical(dotted):
    """`dotted` with TensorFlow's and Keras's module spelled as `tf`/`tf.keras`.

    >>> canonical("tensorflow.keras.mixed_precision.experimental")
    'tf.keras.mixed_precision.experimental'
    """
    for prefix, replacement in _PREFIXES:
        if dotted == prefix or dotted.startswith(prefix + "."):
            return replacement + dotted[len(prefix):]
    return dotted


def replacement(dotted):
    """The tf_lso name of a canonical legacy name or module, or None."""
    if dotted in LEGACY_NAMES:
        return LEGACY_NAMES[dotted]
    return LEGACY_MODULES.get(dotted)


def behaviour(dotted):
    """What a canonical name stands for: its tf_lso name if it has one.

    Rules about behaviour ask this, so that a name reads the same before and
    after `--fix` (`tf.keras.mixed_precision.experimental.LossScaleOptimizer`
    and `tf_lso.experimental.LossScaleOptimizer` are one class).
    """
    return replacement(dotted) or dotted


def installed_names():
    """The legacy names `tf_lso.install()` provides: the public ones.

    TF's private modules (`tf.python...`) are not provided at run time;
    `--fix` rewrites their imports.
    """
    return [name for name in LEGACY_NAMES if not name.startswith("tf.python.")]


def is_legacy(dotted):
    """Whether a canonical dotted name is, or is inside, a legacy module."""
    return replacement(dotted) is not None or any(
        dotted.startswith(module + ".") for module in LEGACY_MODULES
    )


Rule = collections.namedtuple("Rule", "id severity section summary")

_DIFFERENCES = "Deliberate differences from TF 2.4"
_OTHER = "Other things you will hit"

RULES = {rule.id: rule for rule in (
    Rule("legacy-name", "error", "Old call → new call",
         "a TF 2.1-2.4 mixed-precision name that TensorFlow 2.16+ no longer "
         "has (or, for `tf.keras.mixed_precision.LossScaleOptimizer`, has "
         "with Keras 3's different API); `--fix` rewrites it to tf_lso's "
         "where tf_lso provides it"),
    Rule("graph-rewrite", "warning", _OTHER,
         "`tf.compat.v1`'s `enable_mixed_precision_graph_rewrite`, which "
         "TensorFlow 2.16+ keeps for TF1 optimizers only"),
    Rule("run-v2", "error", _OTHER,
         "`strategy.experimental_run_v2`, removed in TensorFlow 2.16"),
    Rule("decayed-lr", "error", _OTHER,
         "`opt._decayed_lr(...)`, gone with OptimizerV2"),
    Rule("optimizer-v2-subclass", "error", "tf_keras legacy inner optimizers",
         "a `tf.keras.optimizers` subclass written against OptimizerV2's "
         "hooks, which Keras 3 optimizers do not call"),
    Rule("get-gradients", "warning", _OTHER,
         "`opt.get_gradients(loss, params)`: graph mode only"),
    Rule("schedule-call", "warning", _DIFFERENCES,
         "`opt.learning_rate(step)` / `opt.lr(step)`: callable on tf_lso's "
         "optimizers only"),
    Rule("aggregate-gradients", "warning", _OTHER,
         "`experimental_aggregate_gradients=`, which Keras 3 optimizers "
         "reject"),
    Rule("private-attribute", "warning", _OTHER,
         "`opt._optimizer` / `opt._loss_scale`, TF's private attributes"),
    Rule("dtype-name", "warning", _OTHER,
         "`x.dtype.name`, which fails on Keras 3 tensors (their dtype is a "
         "string)"),
    Rule("variable-name-suffix", "warning", _OTHER,
         "a variable name ending in `:0` in a regex or compared with a "
         "`.name`, which Keras 3 variable names never match"),
    Rule("skipped-step-iterations", "warning",
         "Differences from TF 2.1–2.3 (experimental class)",
         "`iterations` read next to TF 2.1-2.3's LossScaleOptimizer, which "
         "did not count skipped steps; TF 2.4 and tf_lso do"),
    Rule("policy-loss-scale", "info", "The legacy policy API",
         "`Policy(name, loss_scale=...)`: kept by `tf_lso.experimental."
         "Policy` (Keras 3's policies have no loss scale)"),
    Rule("loss-scale-call", "info", _DIFFERENCES,
         "`opt.loss_scale()`: TF 2.1-2.3's call, which the experimental "
         "class keeps (TF 2.4's class has a tensor there)"),
    Rule("unparsable", "error", "Checking a code base",
         "a file that could not be read or parsed as Python 3; it was "
         "skipped"),
)}


def anchor(heading):
    """GitHub's anchor for a markdown heading.

    >>> anchor("Old call → new call")
    'old-call--new-call'
    """
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def doc_link(rule_id):
    """Where docs/migration.md explains a rule."""
    return f"docs/migration.md#{anchor(RULES[rule_id].section)}"
