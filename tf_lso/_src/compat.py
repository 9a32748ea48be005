"""Version checks, and every private TensorFlow, Keras or tf_keras API.

Each hook is one function and names the versions it was written against.
`tests/compat_test.py` fails when a new release moves one.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import re
import sys
import threading
import types
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:  # Annotations only: importing this module needs no TF.
    import tensorflow as tf

MIN_TENSORFLOW = (2, 16)
MIN_KERAS = (3, 8)
# Before 3.8, `fit` under a tf.distribute strategy trains wrongly even with
# a bare optimizer (keras-team/keras#19891). Every supported TF accepts 3.8.

_INSTALL_HINT = (
    "Install TensorFlow 2.16 or newer with `pip install 'tensorflow>=2.16' "
    "'keras>=3.8'` (or `pip install 'tensorflow-cpu>=2.16' 'keras>=3.8'`); "
    "in a clone of tf_lso, `pip install -e '.[tensorflow]'` does both."
)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _require_tf_keras_if_chosen() -> None:
    """With `TF_USE_LEGACY_KERAS=1`, `tf.keras` is tf_keras, so it must exist.
    This error names it. TensorFlow's own would blame Keras or TensorFlow."""
    if os.environ.get("TF_USE_LEGACY_KERAS") not in ("1", "true", "True"):
        return
    try:
        if importlib.util.find_spec("tf_keras") is not None:
            return
    except ImportError:
        pass
    requirement = "tf_keras"
    for distribution in ("tensorflow", "tensorflow-cpu"):
        try:
            version = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
        minor = ".".join(version.split(".")[:2])
        requirement = f"'tf_keras~={minor}.0'"
        break
    raise ImportError(
        "TF_USE_LEGACY_KERAS=1 makes tf.keras tf_keras, which is not "
        f"installed. Install it with `pip install {requirement}` (the minor "
        "version of your TensorFlow; in a clone of tf_lso, `pip install -e "
        "'.[tensorflow,tfkeras]'`), or unset TF_USE_LEGACY_KERAS for Keras 3."
    )


def require_tensorflow() -> None:
    """Raises an ImportError naming what to install if TF/Keras are unusable."""
    _require_tf_keras_if_chosen()
    try:
        import tensorflow as tf
    except ImportError as e:
        raise ImportError(
            f"tf_lso requires TensorFlow, which could not be imported ({e}). "
            + _INSTALL_HINT
        ) from e
    if _version_tuple(tf.__version__) < MIN_TENSORFLOW:
        raise ImportError(
            f"tf_lso requires TensorFlow >= 2.16, but found TensorFlow "
            f"{tf.__version__}. " + _INSTALL_HINT
        )
    try:
        import keras
    except ImportError as e:
        raise ImportError(
            f"tf_lso requires Keras 3, which could not be imported ({e}). "
            "Install it with `pip install 'keras>=3'`."
        ) from e
    if _version_tuple(keras.__version__) < MIN_KERAS:
        raise ImportError(
            f"tf_lso requires Keras >= 3.8, but found Keras {keras.__version__}. "
            "Keras 3.0 to 3.7 train incorrectly under tf.distribute strategies "
            "(keras-team/keras#19891, fixed in Keras 3.8). Upgrade it with "
            "`pip install -U 'keras>=3.8'` (every TensorFlow from 2.16 on "
            "accepts it)."
        )


def is_variable(value: object) -> bool:
    """Whether `value` is a `tf.Variable` or a `keras.Variable`. The two share
    no base class."""
    return callable(getattr(value, "assign", None))


def in_xla_context() -> bool:
    """Whether XLA compiles the graph being built (`jit_compile=True`).

    XLA drops `tf.debugging.Assert` and cannot compile string ops, so the
    assertions that name variables are left out there. Private (TF 2.16-2.21).
    """
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    return control_flow_util.GraphOrParentsInXlaContext(
        tf.compat.v1.get_default_graph()
    )


def merge_call_fails_in_cond() -> bool:
    """Whether a `merge_call` inside a cond fails in this replica context.

    TF 2.16-2.21's mirrored strategies run each replica in a thread whose
    `merge_call` refuses to run in a cond being traced. A strategy that needs
    no merge call (XLA on GPUs) is the exception.
    """
    import tensorflow as tf

    if tf.executing_eagerly() or not tf.distribute.has_strategy():
        return False
    threaded = (
        tf.distribute.MirroredStrategy,
        tf.distribute.MultiWorkerMirroredStrategy,
        tf.distribute.experimental.MultiWorkerMirroredStrategy,
        tf.compat.v1.distribute.MirroredStrategy,
        tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy,
    )
    return isinstance(tf.distribute.get_strategy(), threaded) and not (
        tf.__internal__.distribute.strategy_supports_no_merge_call())


def tf_keras_module() -> types.ModuleType | None:
    """The `tf_keras` module if the user imported it, else None. tf_lso never
    imports it."""
    return sys.modules.get("tf_keras")


# The classes `tf_keras_files_hold` added to what tf_keras's saving visits.
_TF_KERAS_FILE_CLASSES: list[type] = []


def tf_keras_files_hold(cls: type) -> None:
    """Makes tf_keras's `.keras` and `.weights.h5` files hold `cls`'s state.
    It wraps, once, the private `saving_lib._is_keras_trackable` (tf_keras
    2.16-2.21), which decides what saving visits."""
    saving_lib: Any = importlib.import_module(
        "tf_keras.src.saving.saving_lib")
    if not _TF_KERAS_FILE_CLASSES:
        is_keras_trackable = saving_lib._is_keras_trackable

        def _is_keras_trackable(obj: Any) -> bool:
            return is_keras_trackable(obj) or isinstance(
                obj, tuple(_TF_KERAS_FILE_CLASSES))

        saving_lib._is_keras_trackable = _is_keras_trackable
    if cls not in _TF_KERAS_FILE_CLASSES:
        _TF_KERAS_FILE_CLASSES.append(cls)


def legacy_create_all_weights(optimizer: Any,
                              var_list: Iterable[tf.Variable]) -> None:
    """Creates all slots and hyperparameters of a tf_keras legacy optimizer.

    A `tf.cond` cannot create them, so they are made up front, named as
    `apply_gradients` would name them (`Adam/<variable>/m:0`). Private:
    `legacy.Optimizer._create_all_weights` and `_name` (tf_keras 2.16-2.21).
    """
    import tensorflow as tf

    with tf.name_scope(optimizer._name):
        optimizer._create_all_weights(var_list)


def legacy_aggregate_gradients(
    optimizer: Any, grads_and_vars: Iterable[tuple[Any, tf.Variable]],
) -> list[tuple[Any, tf.Variable]]:
    """Sums gradients over replicas as a tf_keras legacy optimizer does before
    clipping. Private `legacy.Optimizer` methods (tf_keras 2.16-2.21)."""
    grads_and_vars = optimizer._transform_unaggregated_gradients(grads_and_vars)
    return optimizer._aggregate_gradients(grads_and_vars)


def legacy_hyperparameter_names(optimizer: Any) -> frozenset[str]:
    """A tf_keras legacy optimizer's hyperparameter names. They are the keys
    of the private `legacy.Optimizer._hyper` (tf_keras 2.16-2.21)."""
    return frozenset(optimizer._hyper)


def tf_dynamic_loss_scale_counter(loss_scale: Any) -> tf.Variable:
    """The good-steps counter of TF's deprecated `DynamicLossScale`. The
    private `_num_good_steps` (TF 2.0-2.21) has no public accessor."""
    return loss_scale._num_good_steps


def init_dtype_policy_without_dtypes(policy: Any, name: str) -> None:
    """Sets up a Keras 3 `DTypePolicy` with no dtypes (TF 2.x's `'_infer'`),
    which its constructor rejects. Private attributes of Keras 3.8-3.15."""
    policy._name = name
    policy._compute_dtype = policy._variable_dtype = None
    policy._quantization_mode = None


# -- TensorFlow's Trackable protocol (optimizer/checkpointing.py) -----------
# TF 2.16-2.21. Checkpoints find an object's children through these private
# methods. checkpointing.py also overrides four of them, outside this file,
# because TensorFlow calls them on the object itself.


def __getattr__(name: str) -> Any:
    """`Trackable` (TF 2.16-2.21), looked up on first use so that the version
    check needs no TensorFlow."""
    if name == "Trackable":
        import tensorflow as tf

        return getattr(tf.__internal__.tracking, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def trackable_children(obj: Any, save_type: str,
                       **kwargs: Any) -> dict[str, Any]:
    """`obj._trackable_children(...)`: what a checkpoint saves under obj."""
    return obj._trackable_children(save_type, **kwargs)


def is_saved_model(save_type: str) -> bool:
    """Whether `_trackable_children` was asked for a SavedModel (TF 2.16-2.21)."""
    return save_type == "savedmodel"


def lookup_dependency(obj: Any, name: str) -> Any:
    """`obj._lookup_dependency(name)`: the child `name` of obj, or None."""
    return obj._lookup_dependency(name)


def deferred_dependencies(obj: Any) -> dict[str, list[Any]]:
    """`obj._deferred_dependencies`: restores waiting for a child to exist."""
    return obj._deferred_dependencies


def create_or_restore_slot(optimizer: Any, position: Any, slot_name: str,
                           variable: tf.Variable, **kw: Any) -> Any:
    """OptimizerV2's `_create_or_restore_slot_variable` (tf_keras legacy)."""
    return optimizer._create_or_restore_slot_variable(
        slot_variable_position=position,
        slot_name=slot_name,
        variable=variable,
        **kw,
    )


def restore_position(position: Any, trackable: Any) -> None:
    """Restores a checkpoint position (from a deferred slot) into trackable."""
    position.restore(trackable)


# The attribute name under which checkpoints store a variable's value.
VARIABLE_VALUE = "VARIABLE_VALUE"


def keras_trainable_variables(optimizer: Any) -> list[Any]:
    """The variables a built Keras 3 optimizer updates (Keras 3.8-3.15)."""
    return optimizer._trainable_variables


def keras_set_trainable_variables(optimizer: Any,
                                  var_list: Iterable[Any]) -> None:
    """Records the variables a Keras 3 optimizer was built for, since a loss
    scale optimizer skips Keras's `build`. Keras 3.8-3.15 read this private
    attribute off any optimizer."""
    optimizer._trainable_variables = list(var_list)


def keras_check_variables_are_known(optimizer: Any,
                                    var_list: Iterable[Any]) -> None:
    """Raises Keras 3's ValueError for variables a built optimizer lacks,
    before tf_lso's state changes. Private (Keras 3.8-3.15)."""
    optimizer._check_variables_are_known(var_list)


def tf_keras_check_variables_are_known(
        optimizer: Any, var_list: Iterable[tf.Variable]) -> None:
    """Raises tf_keras's KeyError for variables a built optimizer lacks.
    Private: `Optimizer._var_key` and `_index_dict` (tf_keras 2.16-2.21)."""
    for variable in var_list:
        if optimizer._var_key(variable) not in optimizer._index_dict:
            raise KeyError(
                f"The optimizer cannot recognize variable {variable.name}. "
                "This usually means you are trying to call the optimizer to "
                "update different parts of the model separately. Please call "
                "`optimizer.build(variables)` with the full list of trainable "
                "variables before the training loop or use legacy optimizer "
                "`tf.keras.optimizers.legacy."
                f"{type(optimizer).__name__}`."
            )


def keras_is_auto_name(optimizer: Any) -> bool:
    """Whether a Keras 3 optimizer's name has the form Keras generates.

    Such a name is not configuration: two `SGD()`s are configured alike.
    Keras 3.8-3.14 use the constructor's default `name` (`"SGD"`). Keras
    3.15 uses the class name in snake case, then `_1`, `_2`, ...
    """
    try:
        parameter = inspect.signature(type(optimizer)).parameters.get("name")
    except (TypeError, ValueError):
        parameter = None
    if parameter is not None and optimizer.name == parameter.default:
        return True
    snake = re.sub(r"\W+", "", type(optimizer).__name__)
    snake = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", snake)
    snake = re.sub("([a-z])([A-Z])", r"\1_\2", snake).lower()
    return re.fullmatch(re.escape(snake) + r"(_\d+)?", optimizer.name) is not None


def keras_step_counter(optimizer: Any) -> Any:
    """The variable counting a Keras 3 optimizer's `apply` calls (private,
    Keras 3.8-3.15). With gradient accumulation, `iterations` is a tensor."""
    return optimizer._iterations


def keras_optimizer_into_strategy(optimizer: Any) -> None:
    """Moves a Keras 3 optimizer made outside the strategy's scope into it.

    Call it in a cross-replica context. Such an optimizer holds plain
    tf.Variables, which every replica writes, and it cannot create slots
    under the strategy. Each such variable gets a copy made in the strategy.
    The Keras variable stays the same object. Private (Keras 3.8-3.15).
    """
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    if optimizer._distribution_strategy is strategy:
        return
    optimizer._distribution_strategy = strategy
    for variable in optimizer.variables:
        storage = variable._value
        if strategy.extended.variable_created_in_scope(storage):
            continue
        with tf.init_scope():
            variable._value = tf.Variable(
                storage.read_value(), name=variable.name,
                dtype=storage.dtype, trainable=storage.trainable,
                aggregation=storage.aggregation,
                synchronization=storage.synchronization)


def keras_gradient_accumulators(optimizer: Any,
                                var_list: Iterable[Any]) -> list[Any]:
    """The gradient accumulators of `var_list` in a built Keras 3 optimizer
    (private, Keras 3.8-3.15)."""
    return [
        optimizer._accumulated_gradients[optimizer._get_variable_index(v)]
        for v in var_list
    ]


def keras_learning_rate_schedule(
        optimizer: Any) -> Callable[..., Any] | None:
    """A Keras 3 optimizer's learning rate schedule (or callable), or None.
    Private: `BaseOptimizer._learning_rate` (Keras 3.8-3.15)."""
    learning_rate = optimizer._learning_rate
    if is_variable(learning_rate) or not callable(learning_rate):
        return None
    return learning_rate


_SHADOWS_LOCK = threading.Lock()
_NOT_SET = object()  # The attribute was not in the instance dict.


def _shadow_key(name: str) -> str:
    return f"_tf_lso_shadowed_{name}"


@contextlib.contextmanager
def _shadowed(obj: Any, name: str, value: Any) -> Iterator[None]:
    """While active, `obj`'s instance attribute `name` is `value`. Replicas'
    threads overlap, so a count in `obj.__dict__` lets the last exit restore
    the old value, which `_unshadowed` reads meanwhile."""
    state = vars(obj)
    key = _shadow_key(name)
    with _SHADOWS_LOCK:
        entry = state.setdefault(key, [0, state.get(name, _NOT_SET)])
        entry[0] += 1
        state[name] = value
    try:
        yield
    finally:
        with _SHADOWS_LOCK:
            entry[0] -= 1
            if not entry[0]:
                del state[key]
                if entry[1] is _NOT_SET:
                    del state[name]
                else:
                    state[name] = entry[1]


def _unshadowed(obj: Any, name: str, default: Any) -> Any:
    """`getattr(obj, name, default)` as it is outside `_shadowed`."""
    with _SHADOWS_LOCK:
        entry = vars(obj).get(_shadow_key(name))
        if entry is None:
            return getattr(obj, name, default)
        if entry[1] is _NOT_SET:
            return getattr(type(obj), name, default)
        return entry[1]


def keras_apply_without_all_reduce(
        optimizer: Any, grads_and_vars: Iterable[tuple[Any, Any]],
        *arguments: Any) -> None:
    """Applies gradients with a Keras 3 optimizer but skips its all-reduce.

    It serves `experimental_aggregate_gradients=False`. The private
    `TFOptimizer._all_reduce_sum_gradients` (Keras 3.8-3.15) has no public
    switch, so it is the identity until the last replica's call returns.
    """
    if not hasattr(type(optimizer), "_all_reduce_sum_gradients"):
        raise NotImplementedError(
            "apply_gradients(..., experimental_aggregate_gradients=False) "
            f"needs Keras 3's TFOptimizer._all_reduce_sum_gradients, which "
            f"{type(optimizer).__name__} does not have in this Keras version. "
            "Pass the per-replica gradients with "
            "experimental_aggregate_gradients=True instead."
        )
    with _shadowed(optimizer, "_all_reduce_sum_gradients", list):
        optimizer.apply_gradients(grads_and_vars, *arguments)


def keras_loss_scale_optimizer_file_state(
        store: Any, inner_count: int) -> tuple[Any, Any] | None:
    """`(dynamic_scale, step_counter)` from a Keras 3 LossScaleOptimizer's file
    entry, or None for another layout. Keras 3.8-3.15 save its `variables` by
    position: `iterations` and `learning_rate` (unused), `step_counter`,
    `dynamic_scale`, then the inner optimizer's `inner_count` variables."""
    if set(store.keys()) != {str(i) for i in range(4 + inner_count)}:
        return None
    return store["3"], store["2"]


def keras_compile_owner() -> type[Any]:
    """The class whose `compile` the hook replaces: the private `Trainer`
    (Keras 3.8-3.15). `load_model` compiles a model only if
    `type(model).compile == Trainer.compile`, so the hook cannot go on
    `keras.Model`."""
    from keras.src.trainers import trainer

    owner = trainer.Trainer
    if "compile" not in vars(owner) or "compile_from_config" not in vars(owner):
        raise NotImplementedError(
            "tf_lso's compile hook needs Keras 3's Trainer.compile, which this "
            "Keras version does not define."
        )
    return owner


def keras_ema_averages(optimizer: Any) -> list[Any]:
    """A built Keras 3 optimizer's moving averages, one per trainable variable
    or None (private, Keras 3.8-3.15)."""
    return list(optimizer._model_variables_moving_average)


def keras_overwrite_with_ema(optimizer: Any) -> None:
    """Copies a Keras 3 optimizer's moving averages into its variables, as
    `apply` does every `ema_overwrite_frequency` steps (private, Keras
    3.8-3.15)."""
    optimizer._overwrite_model_variables_with_average_value(
        optimizer._trainable_variables)


def keras_uses_ema(optimizer: Any) -> bool:
    """Whether a Keras 3 optimizer keeps moving averages (`use_ema`). It reads
    the setting outside `keras_apply_without_ema`, which another replica's
    thread may be in."""
    return bool(_unshadowed(optimizer, "use_ema", False))


@contextlib.contextmanager
def keras_apply_without_ema(optimizer: Any) -> Iterator[None]:
    """While active, a Keras 3 optimizer's `apply` leaves its averages alone.

    tf_lso updates them (`KerasInner`). Keras 3.8-3.15 read `use_ema` once
    per trace, so it stays off until the last replica's call returns.
    """
    with _shadowed(optimizer, "use_ema", False):
        yield


def tf_keras_is_tf_keras() -> bool:
    """Whether `tf.keras` is tf_keras 2.x. It asks `tf.keras.Model`, since
    `TF_USE_LEGACY_KERAS` may have changed after TensorFlow read it."""
    import tensorflow as tf

    return tf.keras.Model.__module__.split(".")[0] == "tf_keras"
