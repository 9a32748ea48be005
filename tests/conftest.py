"""Test set-up: two logical CPUs, configured once before TensorFlow starts.

TensorFlow refuses to change logical devices after it has initialised, so
this runs when pytest imports the conftest, before any test module.

Without TensorFlow (the nox session `checker`, a lint-only environment) only
the migration tool's tests run, and there is nothing to set up.
"""

import importlib.util
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

if importlib.util.find_spec("tensorflow") is not None:
    import tensorflow as tf
    from absl import flags

    _cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
    )
    # absltest's helpers (create_tempdir, ...) read flags; pytest never
    # parses them.
    flags.FLAGS.mark_as_parsed()
    _TEST_SESSION = tf.test.TestCase.test_session
else:
    _TEST_SESSION = None


def pytest_collection_modifyitems(config, items):
    """Drops `tf.test.TestCase.test_session`, which is not a test.

    Every TestCase inherits it; pytest collects it and reports it as
    skipped, which would hide the real skips among dozens of these.
    """
    del config
    if _TEST_SESSION is None:
        return
    items[:] = [
        item for item in items
        if getattr(getattr(item, "obj", None), "__func__", None)
        is not _TEST_SESSION
    ]
