"""Importing this module checks that TensorFlow and Keras are usable.

The public packages import it before any runtime module, so that a missing
or old TensorFlow or Keras raises an ImportError saying what to install. No
other import checks anything; runtime modules only register what they
define.
"""

from tf_lso._src import compat

compat.require_tensorflow()
