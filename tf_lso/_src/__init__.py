"""Internals of tf_lso. Nothing here is public API; import from `tf_lso`.

Importing this package does nothing: the version check (`version_gate`)
runs where the public API is entered (`tf_lso`, `tf_lso.experimental`,
`tf_lso.callbacks`), so that `compat` imports without TensorFlow. See
docs/architecture.md for the folder map.
"""
