"""Test set-up: two logical CPUs, configured once before TensorFlow starts.

TensorFlow refuses to change logical devices after it has initialised, so
this runs when pytest imports the conftest, before any test module.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
)

from absl import flags  # noqa: E402

# absltest's helpers (create_tempdir, ...) read flags; pytest never parses them.
flags.FLAGS.mark_as_parsed()


def pytest_collection_modifyitems(config, items):
    """Drops `tf.test.TestCase.test_session`, which is not a test.

    Every TestCase inherits it; pytest collects it and reports it as
    skipped, which would hide the real skips among dozens of these.
    """
    del config
    items[:] = [
        item for item in items
        if getattr(getattr(item, "obj", None), "__func__", None)
        is not tf.test.TestCase.test_session
    ]
