"""Importing this module checks that TensorFlow and Keras are usable.

The public packages (`tf_lso`, `tf_lso.experimental`, `tf_lso.callbacks`)
import it before any runtime module, so that a missing or too old
TensorFlow or Keras raises an ImportError that says what to install, not
an error from deep inside. It is the only import in tf_lso that checks
anything. A runtime module, when imported, only registers what it defines
(with Keras, with TensorFlow's ABCs and tensor conversion, or with
`compile_hook`) and changes nothing else. `compat`, which it imports, and
the migration tool import without TensorFlow.
"""

from tf_lso._src import compat

compat.require_tensorflow()
