"""Validating and reading `LossScaleOptimizer` settings and configs.

The inner optimizer's config too: `deserialize_inner_optimizer`.
"""

import importlib

import keras
import tensorflow as tf

from tf_lso._src.scaling import loss_scale as loss_scale_lib
from tf_lso._src.scaling import serialization
from tf_lso._src.scaling import validation

# The keys of TF 2.4's config and of TF <= 2.3's.
TF24_KEYS = ("inner_optimizer", "dynamic", "initial_scale",
             "dynamic_growth_steps")
TF23_KEYS = ("optimizer", "loss_scale")
# Keys in either format's config only when set: Keras 3's `name`, and
# tf_lso's own settings.
OPTIONAL_KEYS = ("name", "max_consecutive_skips", "print_overflows")
# Keras 3's base optimizer arguments, which belong to the inner optimizer,
# with the values that Keras 3's LossScaleOptimizer still accepts (its
# Keras 3.0-3.3 configs hold them).
KERAS_BASE_DEFAULTS = {
    "weight_decay": None,
    "clipnorm": None,
    "global_clipnorm": None,
    "clipvalue": None,
    "use_ema": False,
    "ema_momentum": 0.99,
    "ema_overwrite_frequency": None,
    "loss_scale_factor": None,
    "gradient_accumulation_steps": None,
}


def check_dynamic(dynamic):
    """Raises TF 2.4's TypeError unless `dynamic` is a bool.

    It catches TF 2.1-2.3 code that passes a loss scale as the second
    argument of the TF 2.4 constructor, and Keras 3 code that passes its
    initial scale there.
    """
    if not isinstance(dynamic, bool):
        raise TypeError(
            '"dynamic" argument to LossScaleOptimizer.__init__ must be a '
            f"bool, but got: {dynamic!r}. To pass a loss scale as the "
            "second argument, use "
            "tf_lso.experimental.LossScaleOptimizer(optimizer, loss_scale); "
            "to set the initial loss scale (Keras 3's second argument), pass "
            "`initial_scale=` by keyword."
        )


def check_keras_keywords(kwargs, class_name="LossScaleOptimizer"):
    """Raises Keras 3's ValueError for keywords a loss scale optimizer lacks.

    Keras 3's base optimizer arguments are accepted at their defaults only
    (`KERAS_BASE_DEFAULTS`); anything else is refused by name.

    Args:
        kwargs: The keywords beyond the constructor's own.
        class_name: For messages.

    Raises:
        ValueError: For a base optimizer argument with another value (set
            it on the inner optimizer), or an unknown keyword.
    """
    for name, default in KERAS_BASE_DEFAULTS.items():
        if name not in kwargs:
            continue
        value = kwargs[name]
        if (default is None and value is not None) or value != default:
            raise ValueError(
                f"{class_name} does not support `{name}`. Instead, set "
                f"`{name}` on the `inner_optimizer`. Received: "
                f"{name}={value!r}."
            )
    unknown = [k for k in kwargs if k not in KERAS_BASE_DEFAULTS]
    if unknown:
        hint = (
            " To pass a TF 2.1-2.3 loss scale, use "
            "tf_lso.experimental.LossScaleOptimizer(optimizer, loss_scale)."
            if "loss_scale" in unknown else
            " Its arguments are inner_optimizer, dynamic, initial_scale, "
            "dynamic_growth_steps, name, max_consecutive_skips and "
            "print_overflows."
        )
        raise ValueError(
            f"{class_name} does not support arguments: "
            f"`{'`, `'.join(unknown)}`.{hint}"
        )


def loss_scale_from_settings(dynamic=True, initial_scale=None,
                             dynamic_growth_steps=None):
    """The loss scale for TF 2.4's constructor arguments, validated.

    Args:
        dynamic: Whether the scale is dynamic; must be a bool.
        initial_scale: The initial scale, or None for the default (dynamic
            only).
        dynamic_growth_steps: The growth period, or None for the default;
            must be None when `dynamic` is False.

    Returns:
        A `DynamicLossScale` (multiplier 2) or a `FixedLossScale`.

    Raises:
        TypeError: If `dynamic` is not a bool or a value is not a number.
        ValueError: For missing or out-of-range values.
    """
    check_dynamic(dynamic)
    if dynamic:
        return loss_scale_lib.DynamicLossScale(
            validation.scale(
                loss_scale_lib.DEFAULT_INITIAL_SCALE if initial_scale is None
                else initial_scale,
                "initial_scale",
            ),
            validation.integer(
                loss_scale_lib.DEFAULT_GROWTH_STEPS
                if dynamic_growth_steps is None
                else dynamic_growth_steps,
                "dynamic_growth_steps",
            ),
            multiplier=2.0,
        )
    if initial_scale is None:
        raise ValueError(
            '"initial_scale" must be specified if "dynamic" is False.'
        )
    if dynamic_growth_steps is not None:
        raise ValueError(
            '"dynamic_growth_steps" must be None if "dynamic" is '
            f"False, but got: {dynamic_growth_steps!r}. Pass it only "
            "with dynamic=True."
        )
    return loss_scale_lib.FixedLossScale._optimizer_scale(initial_scale,
                                                           "initial_scale")


def checked_config(config, class_name):
    """A copy of `config` after checking its keys.

    Keras 3's base optimizer settings, which older Keras 3 configs hold, are
    checked as the constructor checks them, and left out.

    Args:
        config: What `from_config` received.
        class_name: The class being built, for messages.

    Raises:
        TypeError: If `config` is not a dict or has keys that are neither
            TF 2.4's nor TF <= 2.3's (nor `OPTIONAL_KEYS`).
        ValueError: If the optimizer key is missing, or for a base
            optimizer setting that is not its default.
    """
    if not isinstance(config, dict):
        raise TypeError(
            f"{class_name}.from_config() needs a dict, as returned by "
            f"get_config(). Received: config={config!r} of type "
            f"{type(config).__name__}."
        )
    check_keras_keywords(
        {k: v for k, v in config.items() if k in KERAS_BASE_DEFAULTS},
        class_name)
    config = {k: v for k, v in config.items() if k not in KERAS_BASE_DEFAULTS}
    legacy = "loss_scale" in config or "optimizer" in config
    keys = TF23_KEYS if legacy else TF24_KEYS
    unknown = sorted(set(config) - set(keys) - set(OPTIONAL_KEYS), key=str)
    if unknown:
        raise TypeError(
            f"{class_name}.from_config() got unknown keys {unknown}. Received "
            f"keys: {sorted(config, key=str)}. A TF 2.4 config has the keys "
            f"{list(TF24_KEYS)}, a TF 2.1-2.3 config {list(TF23_KEYS)}."
        )
    missing = [k for k in (keys if legacy else keys[:1]) if k not in config]
    if missing:
        raise ValueError(
            f"{class_name}.from_config() needs the keys {missing}. Received "
            f"keys: {sorted(config, key=str)}. Pass the dict that get_config() "
            "returned."
        )
    return config


def optional_config(name, max_consecutive_skips, print_overflows):
    """The config entries beyond TF's that are set (`OPTIONAL_KEYS`).

    Unset ones are left out, so configs stay equal to TF's.

    Args:
        name: Keras 3's `name`, if one was passed (else None).
        max_consecutive_skips: tf_lso's setting.
        print_overflows: tf_lso's setting.
    """
    config = {} if name is None else {"name": name}
    if max_consecutive_skips is not None:
        config["max_consecutive_skips"] = max_consecutive_skips
    if print_overflows:
        config["print_overflows"] = True
    return config


def check_multiplier(loss_scale, source):
    """Rejects a DynamicLossScale whose multiplier is not 2.

    TF 2.4's optimizer arguments cannot describe another multiplier.

    Args:
        loss_scale: A `LossScale`.
        source: `'argument'` (passed to the TF 2.1-2.3 constructor) or
            `'config'` (deserialized); TF's message differs.

    Raises:
        ValueError: With TF's message for `source`.
    """
    if (
        not isinstance(loss_scale, loss_scale_lib.DynamicLossScale)
        or loss_scale.multiplier == 2
    ):
        return
    if source == "argument":
        raise ValueError(
            'When passing a DynamicLossScale to "loss_scale", '
            f"DynamicLossScale.multiplier must be 2. Got: {loss_scale!r}."
            " Write a LossScale subclass for another growth rule."
        )
    raise ValueError(
        "Cannot deserialize LossScaleOptimizer with a DynamicLossScale "
        f"whose multiplier is not 2. Got DynamicLossScale: {loss_scale!r}."
        " Only a multiplier of 2 has a TF 2.4 equivalent."
    )


def legacy_loss_scale(config, custom_objects=None):
    """The `LossScale` of a TF 2.1-2.3 config (`optimizer`, `loss_scale`).

    Raises:
        ValueError: For a DynamicLossScale whose multiplier is not 2, or an
            unknown loss scale class.
    """
    loss_scale = serialization.deserialize(config["loss_scale"],
                                           custom_objects)
    check_multiplier(loss_scale, "config")
    return loss_scale


def upgrade_legacy_config(config):
    """Turns a TF <= 2.3 config (`optimizer`, `loss_scale`) into TF 2.4's."""
    config = dict(config)
    if "loss_scale" not in config:
        return config
    loss_scale = legacy_loss_scale(config)  # TF 2.4 passed no custom objects.
    del config["loss_scale"]
    settings = loss_scale._optimizer_settings()
    if settings is None:
        raise ValueError(
            "Serialized LossScaleOptimizers with a LossScale that is neither "
            "a FixedLossScale nor a DynamicLossScale can no longer be "
            f"deserialized. Got: {loss_scale!r}."
        )
    config.update(
        dynamic=settings.dynamic,
        initial_scale=settings.initial_scale,
        dynamic_growth_steps=settings.growth_steps,
    )
    config["inner_optimizer"] = config.pop("optimizer")
    return config


def upgrade_tf2_inner_config(config, custom_objects=None):
    """A TF 2.x inner optimizer config, made readable by Keras 3.

    TF 2.x wrote a learning rate schedule as `{class_name, config}` with
    `name: None`: Keras 3 finds no class without a `module`, and a schedule
    named None fails when called. It is deserialized here, under its class's
    default name. The `decay: 0.0` that every TF 2.x config has is dropped
    (Keras 3 warns about any `decay`; a nonzero one it ignores, and keeps
    warning about). Configs that Keras 3 wrote are returned unchanged.

    Args:
        config: A serialized Keras 3 optimizer (`{class_name, config}`).
        custom_objects: Optional dict of custom schedule classes.

    Returns:
        The config to deserialize; `config` itself is never edited.
    """
    inner = config.get("config")
    if not isinstance(inner, dict):
        return config
    inner = dict(inner)
    if inner.get("decay", None) == 0:
        del inner["decay"]
    schedule = inner.get("learning_rate")
    if isinstance(schedule, dict) and "module" not in schedule:
        schedule = dict(schedule)
        if isinstance(schedule.get("config"), dict):
            schedule["config"] = {
                key: value for key, value in schedule["config"].items()
                if not (key == "name" and value is None)
            }
        inner["learning_rate"] = keras.optimizers.schedules.deserialize(
            schedule, custom_objects=custom_objects)
    return {**config, "config": inner}


def _is_tf_keras_config(config):
    inner_config = config.get("config", {})
    return config.get("module") == "keras.optimizers.legacy" or (
        isinstance(inner_config, dict) and "is_legacy_optimizer" in inner_config
    )


def _with_keras_custom_objects(config, custom_objects):
    """`custom_objects` plus Keras 3's custom object for `config`'s class.

    Keras 3 hands custom objects over in a `custom_object_scope` (as
    `keras.optimizers.deserialize` and `load_model` do) or registers them;
    tf_keras does not look there, so the class is passed on by name.
    """
    custom_objects = dict(custom_objects or {})
    for name in (config.get("registered_name"), config.get("class_name")):
        if isinstance(name, str) and name not in custom_objects:
            found = keras.saving.get_registered_object(name)
            if found is not None:
                custom_objects[name] = found
    return custom_objects


def deserialize_inner_optimizer(config, custom_objects=None):
    """Creates an optimizer from a serialized inner optimizer.

    Configs written by tf_keras (`module: keras.optimizers.legacy`, or an
    `is_legacy_optimizer` entry) are rebuilt with tf_keras; everything else,
    including TF 2.x configs without a module, with Keras 3 (see
    `upgrade_tf2_inner_config`).

    Args:
        config: A serialized optimizer dict, or an optimizer instance.
        custom_objects: Optional dict of custom classes.

    Returns:
        An optimizer.
    """
    if not isinstance(config, dict):
        return config
    # Keras's deserialize functions edit the dict they are given (they
    # lower-case `class_name`); the caller's config stays as it was: new
    # dicts and lists all the way down, the same values.
    config = tf.nest.map_structure(lambda value: value, config)
    if _is_tf_keras_config(config):
        tf_keras = importlib.import_module("tf_keras")
        return tf_keras.optimizers.deserialize(
            config, custom_objects=_with_keras_custom_objects(config,
                                                              custom_objects)
        )
    return keras.optimizers.deserialize(
        upgrade_tf2_inner_config(config, custom_objects),
        custom_objects=custom_objects,
    )
