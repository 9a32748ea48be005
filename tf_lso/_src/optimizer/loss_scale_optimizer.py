"""`tf_lso.LossScaleOptimizer`: TF 2.4's tf.keras.mixed_precision class."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any
from typing import NoReturn

import keras
import tensorflow as tf

from tf_lso._src import compat
from tf_lso._src.gradients import packing
from tf_lso._src.gradients import replicas
from tf_lso._src.inner import forwarding
from tf_lso._src.inner import inner_optimizer as inner_lib
from tf_lso._src.inner import wrapping
from tf_lso._src.optimizer import apply_step
from tf_lso._src.optimizer import checkpointing
from tf_lso._src.optimizer import config as optimizer_config
from tf_lso._src.optimizer import gradient_report as gradient_report_lib
from tf_lso._src.optimizer import settings as settings_lib
from tf_lso._src.optimizer import training_health
from tf_lso._src.scaling import loss_scale as loss_scale_lib


@keras.saving.register_keras_serializable(package="tf_lso")
class LossScaleOptimizer(
    checkpointing.LayoutCheckpointing,
    forwarding.InnerOptimizerForwarding,
    keras.optimizers.LossScaleOptimizer,
):
    """An optimizer that applies loss scaling to prevent numeric underflow.

    TF 2.4's `tf.keras.mixed_precision.LossScaleOptimizer` on Keras 3, and an
    instance of Keras 3's `LossScaleOptimizer`, which `model.compile` never
    wraps again. Scale the loss with `get_scaled_loss`, compute gradients,
    unscale them with `get_unscaled_gradients` and pass them to
    `apply_gradients`. With a dynamic loss scale, a step whose gradients
    hold an Inf or NaN is skipped (no variable or slot changes; `iterations`
    advances) and the scale halves. After `dynamic_growth_steps` finite
    steps in a row it doubles.

    Args:
        inner_optimizer: The optimizer to wrap: a Keras 3 optimizer, or in
            custom training loops a tf_keras one.
        dynamic: Whether the loss scale changes during training (a bool).
        initial_scale: The starting loss scale, positive and finite as a
            float32. Defaults to 2**15 if `dynamic`, else required.
        dynamic_growth_steps: Finite steps before the scale doubles, an
            integer of at least 1. Defaults to 2000 if `dynamic`, else must
            be None.
        name: The optimizer's name; in `get_config()` only if passed.
        max_consecutive_skips: None, or an int K >= 1: the (K+1)-th step in
            a row skipped raises an error naming the variables whose
            gradients were not finite.
        print_overflows: Whether each skipped step prints to stderr which
            gradients were not finite, and whether the loss was. Not under
            `jit_compile=True`.
        stop_on_nonfinite_loss: Whether the first step skipped because the
            loss itself was not finite raises, after it is recorded: a lower
            loss scale cannot help there. Not under `jit_compile=True` (use
            `LossScaleMonitor`).
        **kwargs: Keras 3's base optimizer arguments, at their defaults
            only: set them on the inner optimizer.

    Raises:
        TypeError: For an unsupported or loss scale `inner_optimizer`, or a
            `dynamic` that is not a bool.
        ValueError: For invalid scale arguments, an unsupported strategy, an
            `inner_optimizer` wrapped already, a base optimizer argument, or
            an unknown keyword.

    >>> opt = tf_lso.LossScaleOptimizer(tf.keras.optimizers.SGD(1.0),
    ...                                 initial_scale=8)
    >>> var = tf.Variable(2.0)
    >>> with tf.GradientTape() as tape:
    ...     scaled_loss = opt.get_scaled_loss(var * 3.0)
    >>> grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, [var]))
    >>> _ = opt.apply_gradients(zip(grads, [var]))
    >>> float(var), float(opt.loss_scale)
    (-1.0, 8.0)
    """

    # What reprs show: the class as users name it. `__module__` stays
    # tf_lso._src's, where Keras serialization and pickling find it.
    _public_name = "tf_lso.LossScaleOptimizer"

    def __new__(cls, *args: Any, **kwargs: Any) -> LossScaleOptimizer:
        # Around a tf_keras optimizer: an instance of a subclass that is
        # also a tf_keras loss scale optimizer (wrapping.wrapper_class).
        inner = args[0] if args else kwargs.get(
            "inner_optimizer", kwargs.get("optimizer"))
        return super().__new__(wrapping.wrapper_class(cls, inner))

    def __init__(
        self,
        inner_optimizer: Any,
        dynamic: bool = True,
        initial_scale: float | None = None,
        dynamic_growth_steps: int | None = None,
        *,
        name: str | None = None,
        max_consecutive_skips: int | None = None,
        print_overflows: bool = False,
        stop_on_nonfinite_loss: bool = False,
        **kwargs: Any,
    ) -> None:
        inner = wrapping.wrap(inner_optimizer, "inner_optimizer")
        settings_lib.check_dynamic(dynamic)  # Before the strategy check.
        settings_lib.check_keras_keywords(kwargs)
        replicas.check_strategy_supported()
        loss_scale = settings_lib.loss_scale_from_settings(
            dynamic, initial_scale, dynamic_growth_steps
        )
        self._init_wrapper(inner, loss_scale, name, max_consecutive_skips,
                           print_overflows, stop_on_nonfinite_loss)

    def _init_wrapper(self, inner: inner_lib.InnerOptimizer,
                      loss_scale: loss_scale_lib.LossScale,
                      name: str | None = None,
                      max_consecutive_skips: int | None = None,
                      print_overflows: bool = False,
                      stop_on_nonfinite_loss: bool = False) -> None:
        # Keras requires its constructor first. It assigns defaults such as
        # `clipnorm=None`, which the forwarded properties ignore until
        # `forwarding.start_forwarding`, last.
        keras.optimizers.Optimizer.__init__(self, learning_rate=0.0,
                                            name=name)
        self._given_name = name  # Only a name passed is config.
        self._loss_scale = loss_scale
        # The protocol's Python state. The step gets it as arguments.
        # Each thread's last scaled loss. get_scaled_loss and scale_loss
        # set it, and the thread's next apply takes it.
        self._seen_losses = SeenLosses()
        # The gradients get_unscaled_gradients returned. They are never
        # unscaled again. In a graph the apply also reuses their stacks.
        self._handed_out = packing.HandedOut()
        # The losses get_scaled_loss and scale_loss returned. They are
        # never scaled again.
        self._scaled_losses = packing.Identities()
        # Not checkpointed: the layout stays TF 2.4's.
        self._overflow = training_health.OverflowRecord(
            max_consecutive_skips, print_overflows, stop_on_nonfinite_loss)
        self._step = apply_step.ApplyStep(inner, loss_scale, self._overflow)
        self._checkpoint = checkpointing.Layout(inner, loss_scale, self._step)
        forwarding.start_forwarding(self, inner)
        training_health.warn_if_bfloat16_policy(self.dynamic)
        wrapping.claim(inner)  # Last: a failed construction claims nothing.

    def __repr__(self) -> str:
        cls = type(self)
        name = cls.__dict__.get("_public_name",  # Not a subclass's.
                                f"{cls.__module__}.{cls.__qualname__}")
        return f"<{name} object at {id(self):#x}>"

    # -- Loss scale state ---------------------------------------------------

    def _settings(self) -> settings_lib.OptimizerSettings:
        # A custom LossScale has no TF 2.4 settings, not even `dynamic`.
        return (settings_lib.describe(self._loss_scale)
                or settings_lib.NO_SETTINGS)

    @property
    def dynamic(self) -> bool | None:
        """Whether the loss scale is updated during training; None for a
        custom `LossScale` (`tf_lso.experimental.LossScaleOptimizer` only)."""
        return self._settings().dynamic

    @property
    def loss_scale(self) -> tf.Tensor:
        """The current loss scale as a float32 scalar tensor."""
        self._seen_losses.unscaling()  # Code may unscale by hand with it.
        return self._loss_scale()

    @property
    def dynamic_counter(self) -> tf.Variable | None:
        """The int64 count of finite steps since the last change, or None."""
        return self._settings().counter

    @property
    def skipped_steps(self) -> tf.Variable:
        """The int64 number of steps skipped for non-finite gradients.

        A tf_lso addition. `.keras` and `.weights.h5` files keep it;
        `tf.train.Checkpoint`s keep TF 2.4's layout, so add it as an entry
        of its own. Under a strategy, read it with
        `int(opt.skipped_steps.numpy())`.
        """
        return self._step.skipped_steps

    @property
    def skipped_steps_at_floor(self) -> tf.Variable:
        """The int64 number of steps skipped with the loss scale at 1 or below.

        There backing off cannot help: the gradients overflow unscaled
        (`LossScaleMonitor` warns when it grows). A tf_lso addition, not in
        checkpoints.

        >>> opt = tf_lso.LossScaleOptimizer(tf.keras.optimizers.SGD(1.0),
        ...                                 initial_scale=1)
        >>> var = tf.Variable(1.0)
        >>> _ = opt.apply_gradients([(tf.constant(float("inf")), var)])
        >>> int(opt.skipped_steps_at_floor.numpy()), float(opt.loss_scale)
        (1, 1.0)
        """
        return self._overflow.floor_skips

    @property
    def last_overflow(self) -> training_health.Overflow | None:
        """The last skipped step as a `tf_lso.Overflow`, or None; not in
        checkpoints. Eager only: a RuntimeError inside a `tf.function`."""
        return self._overflow.last()

    @property
    def max_consecutive_skips(self) -> int | None:
        """Skipped steps in a row allowed before an error, or None."""
        return self._overflow.max_consecutive_skips

    @property
    def print_overflows(self) -> bool:
        """Whether skipped steps print their offending variables."""
        return self._overflow.print_overflows

    @property
    def stop_on_nonfinite_loss(self) -> bool:
        """Whether a step skipped for a non-finite loss raises an error."""
        return self._overflow.stop_on_nonfinite_loss

    @property
    def nonfinite_loss_steps(self) -> tf.Variable:
        """The int64 number of steps skipped because the loss was not finite.

        Steps whose loss the optimizer saw (`get_scaled_loss`,
        `scale_loss`, `minimize`, `fit`) hold an Inf or NaN on any replica:
        a bug or bad data, which no loss scale helps. A tf_lso addition, not
        in checkpoints.

        >>> opt = tf_lso.LossScaleOptimizer(tf.keras.optimizers.SGD(1.0))
        >>> var = tf.Variable(1.0)
        >>> with tf.GradientTape() as tape:
        ...     scaled_loss = opt.get_scaled_loss(tf.math.log(0.0) * var)
        >>> grads = opt.get_unscaled_gradients(tape.gradient(scaled_loss, [var]))
        >>> _ = opt.apply_gradients(zip(grads, [var]))
        >>> int(opt.nonfinite_loss_steps.numpy()), opt.last_overflow.cause
        (1, 'loss')
        """
        return self._overflow.loss_skips

    def gradient_report(
        self,
        grads: Sequence[packing.Gradient],
        variables: Sequence[tf.Variable] | None = None,
        *,
        scaled: bool = False,
    ) -> gradient_report_lib.GradientReport:
        """A `tf_lso.GradientReport`: how gradients sit in float16's range.

        Underflow is silent: a scaled gradient element below float16's
        range becomes 0 and the step learns less. The report is at the
        current loss scale: call it before `apply_gradients`, which may
        change the scale. It changes nothing.

        Args:
            grads: Gradients (tensors, `IndexedSlices` or `None`), unscaled
                as `get_unscaled_gradients` returns them unless `scaled`.
            variables: Their variables, for the names (default: positions).
            scaled: Whether `grads` are still scaled, as
                `tape.gradient(scaled_loss, ...)` returns them.

        >>> opt = tf_lso.LossScaleOptimizer(tf.keras.optimizers.SGD(),
        ...                                 initial_scale=2**10)
        >>> report = opt.gradient_report([tf.constant([0.0, 2**-30, 1.0,
        ...                                            2.0])])
        >>> report.zero_share, report.below_normal_share, report.headroom
        (array([0.25], dtype=float32), array([0.5], dtype=float32),
         array([4.], dtype=float32))
        """
        grads = list(grads)
        names = ([training_health.variable_name(v) for v in variables]
                 if variables is not None
                 else [str(i) for i in range(len(grads))])
        scale = self._loss_scale()
        statistics = gradient_report_lib.gradient_statistics(
            packing.pack(grads), 1.0 if scaled else scale)
        return gradient_report_lib.host_report(scale, names, statistics)

    @property
    def initial_scale(self) -> float | None:
        """The initial loss scale (a Python float); None if `dynamic` is."""
        return self._settings().initial_scale

    @property
    def dynamic_growth_steps(self) -> int | None:
        """Finite steps between increases (a Python int), or None if fixed."""
        return self._settings().growth_steps

    def build(self, var_list: Sequence[tf.Variable]) -> None:
        """Creates the inner optimizer's variables for `var_list`."""
        self._inner.build(list(var_list))
        compat.keras_set_trainable_variables(self, var_list)
        self.built = True

    def finalize_variable_values(self, var_list: Sequence[tf.Variable]) -> None:
        """Forwards to the inner optimizer (Keras 3's EMA)."""
        self._inner.finalize(var_list)

    # -- Scaling ------------------------------------------------------------

    def get_scaled_loss(
        self, loss: tf.Tensor | Callable[[], tf.Tensor]
    ) -> tf.Tensor | Callable[[], tf.Tensor]:
        """Multiplies `loss`, a float tensor, by the loss scale cast to its
        dtype. A zero-argument callable gives one that scales when called."""
        if callable(loss):

            def scaled_loss() -> tf.Tensor:
                return self._scaled(loss())

            return scaled_loss
        return self._scaled(loss)

    def _scaled(self, loss: Any, by_scale_loss: bool = False) -> tf.Tensor:
        if loss in self._scaled_losses:
            # Scaled here already (`minimize(lambda: opt.get_scaled_loss(
            # ...))` scales its loss again): once is enough.
            return loss
        loss = _float_tensor(loss)
        # Seen before scaling: whether it is finite, and how its gradients
        # reach the apply (see `SeenLoss`).
        self._seen_losses.see(loss, by_scale_loss)
        scaled = packing.scale_by(loss, self._loss_scale())
        self._scaled_losses.add([scaled])
        return scaled

    def get_unscaled_gradients(
        self, grads: Sequence[packing.Gradient]
    ) -> list[packing.Gradient]:
        """Divides a list of gradients by the loss scale, in order; `None`
        stays `None` and `IndexedSlices` stay `IndexedSlices`.

        A gradient this method returned before is returned as it is, never
        unscaled twice. It cannot tell the new values of Keras 3's
        `overwrite_with_gradient` variables (float8) from gradients;
        `minimize`, `fit` and `apply` pass those through unchanged.
        """
        self._seen_losses.unscaled()
        grads = list(grads)
        if not any(map(self._handed_out.issued, grads)):
            packed = packing.pack(grads).unscaled(self._loss_scale())
            return self._handed_out.remember(packed.unpack(), packed)
        return self._handed_out.remember(self._unscaled_unless_issued(grads))

    def _unscaled_unless_issued(
            self, grads: list[packing.Gradient]) -> list[packing.Gradient]:
        """`grads`, each unscaled unless `get_unscaled_gradients` handed it
        out (unscaled already)."""
        todo = [i for i, grad in enumerate(grads)
                if grad is not None and not self._handed_out.issued(grad)]
        unscaled = packing.pack([grads[i] for i in todo]).unscaled(
            self._loss_scale()).unpack()
        grads = list(grads)
        for i, grad in zip(todo, unscaled):
            grads[i] = grad
        return grads

    def _run_step(self, grads: list[packing.Gradient],
                  var_list: Sequence[tf.Variable], scaled: bool,
                  **step_arguments: Any) -> Any:
        """Runs the step on `grads`, still multiplied by the loss scale if
        `scaled`, and ends the thread's last scaled loss. Those
        `get_unscaled_gradients` handed out are not scaled; if only some
        are, the others are unscaled here."""
        issued = [self._handed_out.issued(g) for g in grads]
        if scaled and any(issued):
            present = [g is not None for g in grads]
            if issued != present:
                grads = self._unscaled_unless_issued(grads)
            scaled = False
        return self._step(
            grads, var_list, scaled=scaled,
            unpacked_from=None if scaled else self._handed_out.take(grads),
            loss_nonfinite=self._seen_losses.take(), **step_arguments)

    def scale_loss(self, loss: tf.Tensor) -> tf.Tensor:
        """Keras 3's loss scaling: scales `loss` for the next apply.

        `Model.fit` calls it and passes the *scaled* gradients to
        `apply_gradients`, which unscales them itself, unless
        `get_unscaled_gradients` was called in between.
        """
        return self._scaled(loss, by_scale_loss=True)

    # -- Applying -----------------------------------------------------------

    def apply_gradients(
        self,
        grads_and_vars: Iterable[tuple[packing.Gradient, tf.Variable]],
        name: str | None = None,
        experimental_aggregate_gradients: bool = True,
    ) -> tf.Variable:
        """Applies unscaled gradients, or skips the step if any is not finite.

        On a finite step the inner optimizer applies the gradients (its
        clipping sees them unscaled) and the loss scale advances. A
        non-finite gradient on any replica skips the step: no variable or
        slot changes, the loss scale backs off, `iterations` still grows.

        Args:
            grads_and_vars: Pairs of (unscaled gradient, variable).
            name: Passed to the inner optimizer's `apply_gradients` where
                that takes a name (Keras 3's does not).
            experimental_aggregate_gradients: Whether the inner optimizer sums
                gradients across replicas (False after your own all-reduce).

        Returns:
            The inner optimizer's `iterations`; in a `tf.compat.v1` graph,
            the op that runs the step.

        Raises:
            ValueError: In a cross-replica context or under an unsupported
                strategy.
            RuntimeError: In a `tf.compat.v1` graph, unless the inner
                optimizer is a tf_keras legacy one (only those update
                variables there).
        """
        # TF 2.x's protocol hands in unscaled gradients. Keras 3's
        # `scale_loss` then `apply_gradients` hands in scaled ones.
        seen = self._seen_losses.last()
        scaled = seen is not None and seen.still_scaled
        if not scaled:
            self._seen_losses.warn_if_not_unscaled()
        grads_and_vars = tuple(grads_and_vars)
        step_op = self._run_step(
            [g for g, _ in grads_and_vars], [v for _, v in grads_and_vars],
            scaled, name=name, aggregate=experimental_aggregate_gradients)
        return self.iterations if step_op is None else step_op

    def apply(
        self,
        grads: Sequence[packing.Gradient],
        trainable_variables: Sequence[tf.Variable] | None = None,
    ) -> None:
        """Keras 3's `apply`: applies *scaled* gradients.

        It unscales them, except those `get_unscaled_gradients` returned.
        Once that has unscaled the last loss's gradients, other gradients are
        taken as computed from its output, so unscaled, with a
        `LossScalingWarning` (once).

        Args:
            grads: Gradients of a loss scaled with `scale_loss` (or
                `get_scaled_loss`).
            trainable_variables: The variables, in the same order; by
                default those the optimizer was built with.
        """
        if trainable_variables is None:
            if not self.built:
                raise ValueError(
                    "apply() without `trainable_variables` needs a built "
                    "optimizer. Call `optimizer.build(variables)` first or "
                    "pass `trainable_variables`."
                )
            trainable_variables = compat.keras_trainable_variables(self)
        grads = list(grads)
        # Keras 3's protocol hands in scaled gradients, unless
        # `get_unscaled_gradients` unscaled the last loss's.
        seen = self._seen_losses.last()
        scaled = seen is None or not seen.unscaled
        if not scaled and not all(self._handed_out.issued(g)
                                  for g in grads if g is not None):
            self._seen_losses.warn_taken_as_unscaled()
        self._run_step(grads, trainable_variables, scaled)

    def stateless_apply(
        self, optimizer_variables: Any, grads: Any, trainable_variables: Any
    ) -> NoReturn:
        """Raises a ValueError, as Keras 3's optimizers do on TensorFlow."""
        raise ValueError(
            "stateless_apply is not supported with the TensorFlow backend "
            "(as it is incompatible with tf.distribute). Use apply() or "
            "apply_gradients()."
        )

    def minimize(
        self,
        loss: tf.Tensor | Callable[[], tf.Tensor],
        var_list: Sequence[tf.Variable] | Callable[[], Sequence[tf.Variable]],
        grad_loss: tf.Tensor | None = None,
        name: str | None = None,
        tape: tf.GradientTape | None = None,
    ) -> tf.Variable:
        """Scales the loss, differentiates, unscales and applies; returns
        what `apply_gradients` returns.

        Args:
            loss: A zero-argument callable returning the loss, or a loss
                tensor computed under `tape`.
            var_list: The variables to update, or a callable returning them.
            grad_loss: Optional gradient of the loss.
            name: Optional name for the apply step.
            tape: The `tf.GradientTape` that recorded a tensor `loss`
                (required then: a ValueError without it).
        """
        grads_and_vars = self._compute_gradients(loss, var_list, grad_loss, tape)
        return self.apply_gradients(grads_and_vars, name=name)

    def _compute_gradients(self, loss: Any, var_list: Any,
                           grad_loss: Any = None, tape: Any = None
                           ) -> list[tuple[Any, Any]]:
        if not callable(loss) and tape is None:
            raise ValueError(
                "`tape` is required when a `Tensor` loss is passed. Pass the "
                "GradientTape that computed the loss, or pass the loss as a "
                "zero-argument callable."
            )
        tape = tape if tape is not None else tf.GradientTape()
        with tape:
            if callable(loss):
                if not callable(var_list):
                    # A Keras 3 variable is watched through its tf.Variable.
                    tape.watch([
                        v.value if isinstance(v, keras.Variable) else v
                        for v in tf.nest.flatten(var_list)
                    ])
                seen = self._seen_losses.last()
                loss = loss()
                if (self._seen_losses.scaled_in_another_graph_since(seen)
                        and loss not in self._scaled_losses):
                    raise _scaled_in_a_nested_function()
            scaled_loss = self.get_scaled_loss(loss)
        if callable(var_list):
            var_list = var_list()
        var_list = tf.nest.flatten(var_list)
        grads = tape.gradient(scaled_loss, var_list, output_gradients=grad_loss)
        unscaled = self.get_unscaled_gradients(grads)
        if any(packing.overwrites(v) for v in var_list):
            # New values, not gradients of the loss: as they came.
            unscaled = [g if packing.overwrites(v) else u
                        for g, u, v in zip(grads, unscaled, var_list)]
        return list(zip(unscaled, var_list))

    def get_gradients(
        self, loss: tf.Tensor, params: Sequence[tf.Variable]
    ) -> list[packing.Gradient]:
        """The unscaled gradients of `loss` for `params`, by `tf.gradients`.
        Not eagerly (a RuntimeError): use a `tf.GradientTape` there."""
        if tf.executing_eagerly():
            raise RuntimeError(
                "`get_gradients()` is not supported when eager execution is "
                "enabled. Call it inside a tf.function, or use a "
                "tf.GradientTape with get_scaled_loss/get_unscaled_gradients."
            )
        scaled_loss = self.get_scaled_loss(loss)
        grads = tf.gradients(scaled_loss, params)
        return self.get_unscaled_gradients(grads)

    # -- Config -------------------------------------------------------------

    def get_config(self) -> dict[str, Any]:
        """Returns TF 2.4's config: `inner_optimizer`, `dynamic`,
        `initial_scale`, `dynamic_growth_steps`, plus `name` if one was
        passed and tf_lso's settings if set. The scale's state is not config.
        """
        return optimizer_config.tf24_config(
            self._inner.serialize(), self._settings(),
            self._optional_config())

    def _optional_config(self) -> dict[str, Any]:
        return optimizer_config.optional_config(
            self._given_name, self.max_consecutive_skips,
            self.print_overflows, self.stop_on_nonfinite_loss)

    @classmethod
    def from_config(
        cls, config: dict[str, Any], custom_objects: dict | None = None
    ) -> LossScaleOptimizer:
        """Creates an optimizer from a TF 2.4, TF <= 2.3 or Keras 3 config.

        Args:
            config: `get_config()`'s output, a TF <= 2.3 config (`optimizer`
                and `loss_scale`) or Keras 3's `LossScaleOptimizer`'s.
            custom_objects: Optional dict of the inner optimizer's custom
                classes.

        Raises:
            ValueError: For a TF <= 2.3 config whose loss scale has no TF 2.4
                equivalent.
        """
        config = optimizer_config.upgrade_legacy_config(config, cls.__name__)
        inner_optimizer = wrapping.deserialize(
            config.pop(optimizer_config.INNER_OPTIMIZER), custom_objects
        )
        # Keywords, so that a subclass whose __init__ takes **kwargs and
        # forwards them (as Horovod-style wrappers do) round-trips.
        return cls(inner_optimizer=inner_optimizer, **config)


@dataclasses.dataclass
class SeenLoss:
    """A thread's last scaled loss, as the thread's next apply reads it.

    The apply uses `nonfinite` and `unscale_due` only in the graph the loss
    was scaled in. `nonfinite` is a tensor of that graph. `unscale_due`
    warns only where the gradients are surely the loss's. The other fields
    hold in every graph of the thread, because Keras 3 code may scale a
    loss in one `tf.function` and apply in another, or eagerly.
    """

    graph: Any  # The graph the loss was scaled in; None eagerly.
    nonfinite: tf.Tensor  # Whether the loss had an Inf or NaN.
    by_scale_loss: bool  # Keras 3's scale_loss, not get_scaled_loss.
    unscale_due: bool  # get_scaled_loss's gradients still need unscaling.
    unscaled: bool = False  # get_unscaled_gradients was called since.

    @property
    def still_scaled(self) -> bool:
        """Whether the apply gets `scale_loss`'s gradients still scaled."""
        return self.by_scale_loss and not self.unscaled

    def in_its_graph(self) -> bool:
        return self.graph is _graph()


def _graph() -> Any:
    return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


class SeenLosses:
    """The loss each thread scaled last, kept until the thread's next apply.

    Per thread: each replica of a `MirroredStrategy` runs in its own thread,
    and the threads take turns at every `merge_call`, which may come between
    one replica's `scale_loss` and its apply.
    """

    # Threads that never apply leave their entry; past this, the oldest go.
    _MAX_ENTRIES = 64

    def __init__(self) -> None:
        self._entries: dict[int, SeenLoss] = {}  # By thread id.
        self._warned: set[str] = set()  # The methods warned about, once.

    def see(self, loss: tf.Tensor, by_scale_loss: bool = False) -> None:
        """Keeps `loss` (the float loss before scaling) for this thread."""
        thread = threading.get_ident()
        self._entries.pop(thread, None)
        if len(self._entries) >= self._MAX_ENTRIES:
            self._entries.pop(next(iter(self._entries)))
        nonfinite = tf.logical_not(tf.reduce_all(tf.math.is_finite(loss)))
        self._entries[thread] = SeenLoss(_graph(), nonfinite, by_scale_loss,
                                         unscale_due=not by_scale_loss)

    def last(self) -> SeenLoss | None:
        """This thread's last scaled loss, or None."""
        return self._entries.get(threading.get_ident())

    def scaled_in_another_graph_since(self, seen: SeenLoss | None) -> bool:
        """Whether this thread scaled a loss since `seen` was `last()`, in
        another graph (a nested `tf.function`'s)."""
        entry = self.last()
        return entry is not seen and entry is not None and (
            not entry.in_its_graph())

    def unscaling(self) -> None:
        """Says that code may unscale the last loss's gradients by hand."""
        entry = self.last()
        if entry is not None and entry.in_its_graph():
            entry.unscale_due = False

    def unscaled(self) -> None:
        """Says that `get_unscaled_gradients` unscaled the last loss's
        gradients."""
        entry = self.last()
        if entry is not None:
            entry.unscaled = True
        self.unscaling()

    def warn_taken_as_unscaled(self) -> None:
        """Warns once that `apply` takes gradients as unscaled: after
        `get_unscaled_gradients`, others are most likely computed from its
        output (clipped, say)."""
        if "apply" in self._warned:
            return
        self._warned.add("apply")
        training_health.warn(
            "apply() takes the gradients of a scaled loss (Keras 3's "
            "protocol) and unscales them, but get_unscaled_gradients already "
            "unscaled the gradients of the loss scaled last, and these are "
            "not what it returned: tf_lso takes them as unscaled (computed "
            "from its output) and applies them as they are, as "
            "apply_gradients does. If they are still scaled, call apply() "
            "without get_unscaled_gradients, or pass it what "
            f"get_unscaled_gradients returned. {training_health.SILENCE}")

    def warn_if_not_unscaled(self) -> None:
        """Warns once, at `apply_gradients`, if `get_scaled_loss`'s
        gradients were not unscaled. It adds nothing to a traced step."""
        entry = self.last()
        if (entry is None or not entry.in_its_graph() or not entry.unscale_due
                or "apply_gradients" in self._warned):
            return
        entry.unscale_due = False
        self._warned.add("apply_gradients")
        training_health.warn(
            "apply_gradients got gradients, but the loss that get_scaled_loss "
            "scaled before it never went through get_unscaled_gradients: if "
            "these are the gradients of that scaled loss, each step is the "
            "loss scale (2**15 by default) times too large, or is skipped. "
            "Unscale them first: grads = opt.get_unscaled_gradients("
            "tape.gradient(scaled_loss, vars)); opt.apply_gradients(zip("
            f"grads, vars)). {training_health.SILENCE}")

    def take(self) -> tf.Tensor | None:
        """Ends this thread's last loss. Returns whether it was not finite
        (a bool tensor), or None if none was seen here since the last apply.
        """
        entry = self._entries.pop(threading.get_ident(), None)
        if entry is None or not entry.in_its_graph():
            return None
        return entry.nonfinite



def _scaled_in_a_nested_function() -> ValueError:
    """The error for a `minimize` loss function that scaled its loss in a
    `tf.function` of its own: the output is a new tensor, which cannot be
    told apart from an unscaled loss."""
    return ValueError(
        "minimize()'s loss function scaled its loss (get_scaled_loss or "
        "scale_loss) inside a tf.function of its own, so the loss it returns "
        "cannot be told apart from an unscaled one, and minimize would scale "
        "it again (TF 2.4 did, silently: steps the loss scale times too "
        "large). minimize scales the loss itself: return the unscaled loss "
        "from the function.")


def _float_tensor(loss: Any) -> tf.Tensor:
    """`loss` as a float tensor, or a TypeError that says what it was."""
    try:
        tensor = tf.convert_to_tensor(loss)
    except (TypeError, ValueError):
        tensor = None
    if tensor is None or not tensor.dtype.is_floating:
        what = (f"of dtype {tensor.dtype.name}" if tensor is not None
                else f"of type {type(loss).__name__}")
        raise TypeError(
            f"The loss to scale must be a float tensor. Received: "
            f"loss={loss!r} {what}. Pass the loss the model computed (cast "
            "an integer one with tf.cast(loss, tf.float32)).")
    return tensor


# What `LossScaleMonitor` (callbacks.py) reads of an optimizer, beyond its
# public properties: seams of this package, not the optimizer's API.


def gradient_reports(
        optimizer: LossScaleOptimizer) -> gradient_report_lib.GradientReportRecord:
    """The step's `GradientReportRecord`: turned on and asked by the monitor."""
    return optimizer._step.report


def last_gradient_report(
        optimizer: LossScaleOptimizer) -> gradient_report_lib.GradientReport | None:
    """The report stored by the last requested step, or None. Eager."""
    return optimizer._step.report.last(optimizer._overflow.variable_names)


def overflow_record(
        optimizer: LossScaleOptimizer) -> training_health.OverflowRecord:
    """The optimizer's `OverflowRecord` (the monitor's stop message)."""
    return optimizer._overflow
