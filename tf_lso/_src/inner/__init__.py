"""Inner optimizers: the optimizer a loss scale optimizer wraps.

`inner_optimizer` is the interface and the learning rate as a tensor when
it follows a schedule (`ScheduledLearningRate`); each kind is one module in
`kinds/`; `wrapping` lists the kinds and wraps an optimizer in its kind.
`forwarding` reads and writes the inner optimizer's attributes through the
wrapper.
"""
