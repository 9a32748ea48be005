"""TF 2.1-2.4's module-level API: policies, the `Model.compile` hook, the
graph rewrite and `install()`. The top of the runtime.
"""
