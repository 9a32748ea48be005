"""The kinds of inner optimizer: one module each.

`wrapping.KINDS` lists them, in the order that decides which one takes an
optimizer that two would accept.
"""
