"""`python -m tf_lso check`: the migration tool. Nothing here is public API.

It only parses code (the standard library's `ast`; `--fix` adds LibCST), so
it imports neither TensorFlow nor Keras: it runs in a lint-only CI job, a
pre-commit hook, or next to the old TensorFlow a code base still uses.
"""
