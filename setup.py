"""Packaging for tf_lso.

TensorFlow is not a hard requirement, so that an environment that already has
`tensorflow` or `tensorflow-cpu` keeps it: pick one with an extra
(`tf_lso[tensorflow]` or `tf_lso[cpu]`) or install TensorFlow yourself.
Importing tf_lso without TensorFlow 2.16+ and Keras 3.8+ raises an ImportError
saying what to install.

Two packages: `tf_lso` (the runtime and its public API) and
`tf_lso_migration` (the migration tool and the `tf-lso` command, standard
library only, so that it runs where TensorFlow is not installed).
"""

import pathlib
import re

import setuptools

_HERE = pathlib.Path(__file__).parent


def _version():
    # Where `tf_lso.__version__` comes from (importable without TensorFlow).
    text = (_HERE / "tf_lso_migration" / "__init__.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


setuptools.setup(
    name="tf_lso",
    version=_version(),
    description=(
        "TensorFlow's legacy mixed-precision loss scaling API "
        "(LossScaleOptimizer, LossScale classes) on TensorFlow 2.16+ and "
        "Keras 3."
    ),
    long_description=(_HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    packages=setuptools.find_packages(include=[
        "tf_lso", "tf_lso.*", "tf_lso_migration", "tf_lso_migration.*"]),
    # PEP 561: type checkers read the packages' own annotations.
    package_data={"tf_lso": ["py.typed"], "tf_lso_migration": ["py.typed"]},
    python_requires=">=3.9",
    install_requires=[],
    extras_require={
        # The ranges the test matrix covers (noxfile.py). Keras before 3.8
        # trains wrongly under tf.distribute (keras-team/keras#19891).
        "tensorflow": ["tensorflow>=2.16,<2.22", "keras>=3.8,<3.16"],
        "cpu": ["tensorflow-cpu>=2.16,<2.22", "keras>=3.8,<3.16"],
        # The legacy-Keras route (TF_USE_LEGACY_KERAS=1, docs/routes.md):
        # pip picks the tf_keras of the installed TensorFlow's minor.
        "tfkeras": ["tf-keras>=2.16,<2.22"],
        "test": [
            "absl-py",
            "hypothesis",
            "pytest",
            # The suite in two processes on the CI machine's two cores
            # (noxfile.py's PARALLEL).
            "pytest-xdist",
            "tensorboard",
            "tf-keras>=2.16,<2.22",
            "libcst>=1.1",
            "matplotlib",
        ],
        # `python -m tf_lso check --fix` (the check itself needs nothing).
        "migrate": ["libcst>=1.1"],
        # What the examples use beyond TensorFlow: matplotlib for
        # plot_training_health.py, TensorBoard for tf.summary in
        # legacy/checkpoint_loop.py (TensorFlow 2.16+ no longer installs it).
        "examples": ["matplotlib", "tensorboard"],
    },
    entry_points={
        # `tf-lso check PATH...` (also `python -m tf_lso ...`): started from
        # the migration tool, so `check` imports no TensorFlow.
        "console_scripts": ["tf-lso = tf_lso_migration.cli:console_main"],
    },
    license="Apache-2.0",
)
