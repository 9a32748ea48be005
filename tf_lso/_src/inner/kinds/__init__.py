"""The kinds of inner optimizer: one module each, found by being here.

`inner_optimizer.kinds()` imports every module here on first use; each
registers its kind with `@inner_optimizer.register`. Which kind wins where
two accept one optimizer is what the kinds declare (`more_specific_than`),
not the modules' names. A new kind is a new module (see
docs/architecture.md, "Adding an inner optimizer kind").
"""
