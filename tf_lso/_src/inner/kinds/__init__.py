"""The kinds of inner optimizer: one module each, found by name.

`inner_optimizer.kinds()` imports every module here on first use; each
registers its kind with `@inner_optimizer.register`. A new kind is a new
module (see docs/architecture.md, "Adding an inner optimizer kind").
"""
