"""Inner optimizers: the optimizer that a loss scale optimizer wraps.

`inner_optimizer` is the interface, and each kind is a module in `kinds/`.
`wrapping` picks the kind. `forwarding` reads and writes the inner
optimizer's attributes through the wrapper.
"""
