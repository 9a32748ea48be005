"""The kinds of inner optimizer the tests run with: one table.

Each row is one kind of `wrapping.KINDS`: the name the tests give it (in
test names and parameters), its class, and how to make an optimizer of it.
Tests parametrised by kind take their kinds from here (`NAMES`, or some of
them by name) and make optimizers with `make`/`sgd`.
`inner_optimizer_test.test_the_kinds_table_is_the_registry` fails when
`wrapping.KINDS` has a kind that the table lacks, or the other way round.
"""

import dataclasses
from typing import Any
from typing import Callable

import keras

from tf_lso._src.inner.kinds import keras_optimizer
from tf_lso._src.inner.kinds import tf_keras as tf_keras_kinds

import test_util


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of inner optimizer, as the tests use it."""

    #: Its name in the tests.
    name: str
    #: Its class in the registry.
    kind: type
    #: The module of its optimizer classes (`keras.optimizers`, ...).
    optimizers: Callable[[], Any]

    def make(self, class_name: str, *args: Any, **kwargs: Any) -> Any:
        """An optimizer of this kind: `optimizers().<class_name>(...)`."""
        return getattr(self.optimizers(), class_name)(*args, **kwargs)

    def sgd(self, *args: Any, **kwargs: Any) -> Any:
        """An SGD optimizer of this kind."""
        return self.make("SGD", *args, **kwargs)


KINDS = (
    Kind("keras", keras_optimizer.KerasInner, lambda: keras.optimizers),
    Kind("tf_keras", tf_keras_kinds.TfKerasInner,
         lambda: test_util.tf_keras.optimizers),
    Kind("tf_keras_legacy", tf_keras_kinds.TfKerasLegacyInner,
         lambda: test_util.tf_keras.optimizers.legacy),
)

#: Every kind's name, in the table's order.
NAMES = tuple(kind.name for kind in KINDS)
#: The kinds that wrap tf_keras optimizers (tf.keras on the legacy-Keras
#: route).
TF_KERAS_NAMES = tuple(kind.name for kind in KINDS
                       if issubclass(kind.kind, tf_keras_kinds.TfKerasKind))

_BY_NAME = {kind.name: kind for kind in KINDS}


def get(name: str) -> Kind:
    """The row named `name` (a KeyError for a name the table lacks)."""
    return _BY_NAME[name]


def sgd(name: str, *args: Any, **kwargs: Any) -> Any:
    """An SGD optimizer of the kind named `name`."""
    return get(name).sgd(*args, **kwargs)


def make(name: str, class_name: str, *args: Any, **kwargs: Any) -> Any:
    """An optimizer `class_name` of the kind named `name`."""
    return get(name).make(class_name, *args, **kwargs)


def names(*wanted: str) -> tuple:
    """`wanted`, checked against the table: some of its kinds by name."""
    for name in wanted:
        get(name)
    return wanted
