"""Loss scales: `LossScale`, `FixedLossScale`, `DynamicLossScale`.

Also their identifiers and configs (`serialization`), the checks of the
numbers users pass (`validation`) and the tensor-like behaviour they share
with a scheduled learning rate (`tensor_like`).
"""
