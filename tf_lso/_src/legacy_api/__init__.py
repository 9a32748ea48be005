"""TF 2.1-2.4's module-level API: policies, compile, install.

`Policy` and `set_policy`, the `Model.compile` hook that wraps optimizers,
`enable_mixed_precision_graph_rewrite`, and `install()`, which puts
tf_lso's names where TF 2.x scripts look for them. The top of the runtime.
"""
