"""Importing this module checks that TensorFlow and Keras are usable.

The public packages (`tf_lso`, `tf_lso.experimental`, `tf_lso.callbacks`)
import it before any runtime module, so that a missing or too old
TensorFlow or Keras raises an ImportError that says what to install, not
an error from deep inside. It is the only import in tf_lso with a side
effect; other internal modules (`compat`, the migration tool) import
without TensorFlow.
"""

from tf_lso._src import compat

compat.require_tensorflow()
