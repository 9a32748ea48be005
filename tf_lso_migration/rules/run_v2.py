"""`run-v2`: `strategy.experimental_run_v2`, removed in TensorFlow 2.16."""

from tf_lso_migration import rule


@rule.register
class RunV2(rule.AttributeRule):
    """`strategy.experimental_run_v2`, removed in TensorFlow 2.16

    `tf.distribute` strategies no longer have `experimental_run_v2`; its
    replacement `strategy.run(fn, args=..., kwargs=...)` takes the same
    arguments.
    """

    id, severity = "run-v2", "error"
    section = "Other things you will hit"
    attribute = "experimental_run_v2"
    message = ("`experimental_run_v2` was removed; call "
               "`strategy.run(fn, args=...)`.")
