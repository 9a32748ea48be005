"""Internals of tf_lso. Nothing here is public API; import from `tf_lso`."""

from tf_lso._src import compat

compat.require_tensorflow()
