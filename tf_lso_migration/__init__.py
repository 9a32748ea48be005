"""tf_lso's migration tool: `python -m tf_lso check`, `rule`, and the CLI.

Nothing here is public API. A package of its own, beside `tf_lso`, and
standard library only (`--fix` adds LibCST): importing any module here
imports neither TensorFlow, Keras nor `tf_lso`, whatever is installed (a
module of `tf_lso` could not promise that: importing it runs
`tf_lso/__init__.py`, which imports the runtime so that Keras finds
tf_lso's classes by name). So the checker runs in a lint-only CI job, a
pre-commit hook, or next to the old TensorFlow a code base still uses;
tests/layering_test.py holds every module here to it.

What the runtime needs without TensorFlow lives here too, once: the table
of legacy names (`legacy_names`, which `tf_lso.install()` reads) and the
version of the distribution (`tf_lso.__version__` is this one).
"""

__version__ = "0.1.0.dev0"
