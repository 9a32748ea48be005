"""The loss scale optimizers and what they hold.

The two public classes (TF 2.4's and TF 2.1-2.3's), one step of them
(`apply_step`), their settings and configs, their checkpoint layout, the
record of skipped steps (`training_health`) and `LossScaleMonitor`.
"""
