"""Inner optimizers: the optimizer a loss scale optimizer wraps.

`inner_optimizer` is the interface and the registry of kinds; each kind is
one module in `kinds/`. `forwarding` reads and writes the inner optimizer's
attributes through the wrapper; `keras_slots` maps TF 2.x checkpoint names
onto Keras 3 optimizers.
"""
