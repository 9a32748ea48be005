"""Helpers of the migration tool's tests, which run without TensorFlow too.

The nox session `checker` runs those tests in an environment with neither
TensorFlow nor Keras (as a lint-only CI job has), so this module imports
neither, unlike test_util.
"""

import importlib.util

import pytest


def _missing(module):
    return importlib.util.find_spec(module) is None


needs_libcst = pytest.mark.skipif(
    _missing("libcst"),
    reason="--fix needs LibCST: pip install 'libcst>=1.1'")
needs_tensorflow = pytest.mark.skipif(
    _missing("tensorflow"),
    reason="runs TF 2.x code: needs TensorFlow (pip install -e "
    "'.[tensorflow]' in a clone)")
