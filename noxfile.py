"""The TensorFlow/Keras pairs tf_lso supports, each a nox session.

    nox -t ci      # lint, the type check, the migration tool without
                   # TensorFlow, the packages as installed, then the oldest
                   # and the newest pair, on both routes (the README's test
                   # command)
    nox -s tests   # every pair of the matrix, on both routes
    nox -s lint    # ruff (configured in ruff.toml)
    nox -s typecheck  # mypy (configured in pyproject.toml), no TensorFlow
    nox -s checker # `python -m tf_lso check` and its tests, no TensorFlow
    nox -s legacy_keras  # the legacy-Keras route (TF_USE_LEGACY_KERAS=1)
                         # alone
    nox -s package # wheel + sdist, twine check, a clean install's smoke test
    nox -s "tests(tf2.18.1-keras3.8.0)"   # one pair; `-- -k name` picks tests
    nox -s older_pythons   # the oldest pair on Python 3.9 and 3.10 (needs
                           # python3.9 and python3.10 on PATH)
    nox -s benchmarks   # docs/performance.md, measured anew (over an hour);
                        # `-- ablation.py --mirrored` runs one benchmark

Each session installs exact versions of TensorFlow, Keras and tf_keras
together with tf_lso's own `tensorflow` and `test` extras, so pip fails the
session if setup.py's declared ranges ever stop accepting a tested pair.
tests/packaging_test.py checks that the matrix covers setup.py's ranges and
matches the tables in README.md and docs/index.md.
"""

import pathlib
import shutil

import nox

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["lint", "typecheck", "checker", "package", "tests"]
RUFF = "ruff==0.16.9"
MYPY = "mypy==2.4.1"

# (TensorFlow, Keras, tf_keras, tags). Every TensorFlow minor version from 2.16
# to 2.21 with the lowest Keras it accepts (3.8 at least: see MIN_KERAS in
# tf_lso/_src/compat.py), and the newest Keras with the oldest, a middle and
# the newest TensorFlow. tf_keras matches the TensorFlow minor version.
MATRIX = (
    ("2.16.2", "3.8.0", "2.16.0", ("ci",)),  # the oldest supported pair
    ("2.16.2", "3.15.1", "2.16.0", ()),
    ("2.17.1", "3.8.0", "2.17.0", ()),
    ("2.18.1", "3.8.0", "2.18.0", ()),
    ("2.18.1", "3.15.1", "2.18.0", ()),
    ("2.19.1", "3.8.0", "2.19.0", ()),
    ("2.20.0", "3.10.0", "2.20.1", ()),
    ("2.21.0", "3.12.0", "2.21.0", ()),
    ("2.21.0", "3.15.1", "2.21.0", ("ci",)),  # the newest
)


@nox.session(python="3.11", tags=["ci"])
def lint(session):
    """Lints the whole tree with ruff (ruff.toml); seconds, before any test."""
    session.install(RUFF)
    session.run("ruff", "check", ".")


@nox.session(python="3.11", tags=["ci"])
def typecheck(session):
    """Type-checks tf_lso and tf_lso_migration with a pinned mypy.

    Configured in pyproject.toml ([tool.mypy]). Only mypy is installed:
    TensorFlow, Keras, tf_keras and LibCST ship no types (and TensorFlow
    installs about 2 GB), so the configuration takes their names, and
    NumPy's, as `Any` whether or not they are installed; the session takes
    seconds and every run agrees. Every annotated function is checked; the
    bodies of unannotated ones are not.
    """
    session.install(MYPY)
    session.run("mypy", *session.posargs)


# The migration tool's tests; the rest of the suite needs TensorFlow.
CHECKER_TESTS = (
    "tests/migration_check_test.py",
    "tests/migration_fix_test.py",
    "tests/migration_rules_test.py",
    "tests/migration_mixed_precision_test.py",
    "tests/legacy_names_test.py",
    "tests/layering_test.py",
    "tests/main_test.py",
)


@nox.session(python="3.11", tags=["ci"])
def checker(session):
    """The migration tool with neither TensorFlow nor Keras installed.

    As a lint-only CI job or a pre-commit hook has it: tf_lso alone, with
    LibCST for `--fix`. The tests that run TF 2.x code skip here (they run
    in the `tests` sessions).
    """
    session.install("-e", ".[migrate]", "pytest")
    session.run(
        "python", "-c", "import importlib.util, sys; sys.exit(any("
        "importlib.util.find_spec(m) for m in ('tensorflow', 'keras', "
        "'tf_keras')))",
    )  # Fails if any of them is installed: the session would prove nothing.
    session.run("python", "-m", "pytest", "-q", *CHECKER_TESTS,
                *session.posargs)


# Builds the distributions and checks them as users install them.
BUILD = "build==1.3.0"
TWINE = "twine==6.2.0"
_SMOKE = """
import importlib.resources
import keras
import tensorflow as tf
import tf_lso

assert importlib.resources.files("tf_lso").joinpath("py.typed").is_file()
opt = tf_lso.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=8)
var = tf.Variable(2.0)
with tf.GradientTape() as tape:
    loss = opt.get_scaled_loss(var * 3.0)
grads = opt.get_unscaled_gradients(tape.gradient(loss, [var]))
opt.apply_gradients(zip(grads, [var]))
assert float(var) == -1.0, float(var)
print("smoke test passed:", tf_lso.__version__)
"""


@nox.session(python="3.11", tags=["ci"])
def package(session):
    """The wheel and sdist as users get them.

    Builds both (`python -m build`), checks their metadata and that the
    README renders as the package page (`twine check --strict`), installs
    the wheel with its `tensorflow` extra into a new virtualenv, and runs a
    smoke test there: an import, one training step, the `py.typed` marker,
    and both spellings of the command line.
    """
    session.install(BUILD, TWINE)
    dist = pathlib.Path(session.create_tmp()) / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", "--outdir", str(dist), ".")
    wheels, sdists = list(dist.glob("*.whl")), list(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        session.error(f"expected one wheel and one sdist, got {wheels + sdists}")
    session.run("twine", "check", "--strict", *map(str, wheels + sdists))
    venv = dist.parent / "clean-venv"
    shutil.rmtree(venv, ignore_errors=True)
    session.run("python", "-m", "venv", str(venv))
    bin_dir = venv / "bin"
    tensorflow, keras, _, _ = MATRIX[-1]
    session.run(str(bin_dir / "pip"), "install", "-q",
                f"{wheels[0]}[tensorflow]", f"tensorflow=={tensorflow}",
                f"keras=={keras}", external=True)
    env = {"TF_CPP_MIN_LOG_LEVEL": "3"}
    session.run(str(bin_dir / "python"), "-c", _SMOKE, external=True, env=env)
    session.run(str(bin_dir / "python"), "-m", "tf_lso", "check", "--help",
                external=True, silent=True)
    session.run(str(bin_dir / "tf-lso"), "check", "--help", external=True,
                silent=True)


@nox.session(python="3.11")
@nox.parametrize(
    ("tensorflow", "keras", "tf_keras"),
    [
        nox.param(tf, keras, tf_keras, id=f"tf{tf}-keras{keras}", tags=tags)
        for tf, keras, tf_keras, tags in MATRIX
    ],
)
def tests(session, tensorflow, keras, tf_keras):
    """Runs the whole test suite on one TensorFlow/Keras pair, then the
    legacy-Keras route's tests in the same virtualenv."""
    _run_suite(session, tensorflow, keras, tf_keras)
    _run_legacy_keras(session)


# The legacy-Keras route: `TF_USE_LEGACY_KERAS=1` before TensorFlow starts,
# so `tf.keras` is tf_keras 2.x (elsewhere these tests skip).
LEGACY_KERAS_TESTS = ("tests/legacy_keras_route_test.py",)

# Two pytest processes (pytest-xdist), which take tests from each other's
# queue when theirs runs out: the CI machine's two cores. Each process sets
# up its own two logical CPUs and its one MirroredStrategy
# (tests/conftest.py, tests/test_util.py).
PARALLEL = ("-n", "2", "--dist", "worksteal")


@nox.session(python="3.11")
@nox.parametrize(
    ("tensorflow", "keras", "tf_keras"),
    [
        nox.param(tf, keras, tf_keras, id=f"tf{tf}-keras{keras}")
        for tf, keras, tf_keras, _ in MATRIX
    ],
)
def legacy_keras(session, tensorflow, keras, tf_keras):
    """The legacy-Keras route's tests alone, on one pair."""
    _install(session, tensorflow, keras, tf_keras)
    _run_legacy_keras(session)


def _run_legacy_keras(session):
    # `-- -k name` may pick none of the route's tests (pytest's status 5).
    session.run("python", "-m", "pytest", "-q", *PARALLEL,
                *LEGACY_KERAS_TESTS, *session.posargs,
                env={"TF_USE_LEGACY_KERAS": "1"},
                success_codes=[0, 5] if session.posargs else [0])


@nox.session(python=["3.9", "3.10"])
def older_pythons(session):
    """Runs the whole test suite on the oldest pair under Python 3.9 and 3.10.

    setup.py accepts them (as TensorFlow 2.16 does); CI machines have only
    Python 3.11, so this session is not in `-t ci`.
    """
    tensorflow, keras, tf_keras, _ = MATRIX[0]
    _run_suite(session, tensorflow, keras, tf_keras)


def _run_suite(session, tensorflow, keras, tf_keras):
    """Installs one pair, then runs tests/ (`-- args` go to pytest)."""
    _install(session, tensorflow, keras, tf_keras)
    session.run("python", "-m", "pytest", "-q", *PARALLEL, "tests",
                *session.posargs)


CANDIDATE_SHAPES = ("10 independent vars", "MLP 100 layers x 32 (200 vars)",
                    "Keras Dense 100 layers x 32 (200 vars)")
BENCHMARKS = (
    ("step_time.py",),
    ("ablation.py",),
    ("ablation.py", "--marker", "candidates", "--shapes", *CANDIDATE_SHAPES,
     "--variants", "tf_lso_keras", "tf_lso_legacy", "cond_check"),
    ("hlo_summary.py",),
    ("ablation.py", "--mirrored"),
    ("ablation.py", "--mirrored", "--eager"),
)


@nox.session(python="3.11")
def benchmarks(session):
    """Runs benchmarks/ on the newest pair; they rewrite docs/performance.md.

    A benchmark run by hand only prints its table; here each is asked to
    write its part of the page (`--output`).
    """
    tensorflow, keras, tf_keras, _ = MATRIX[-1]
    _install(session, tensorflow, keras, tf_keras)
    for script, *args in [session.posargs] if session.posargs else BENCHMARKS:
        session.run("python", f"benchmarks/{script}", *args,
                    "--output", "docs/performance.md")


def _install(session, tensorflow, keras, tf_keras):
    """Exact TensorFlow, Keras and tf_keras with tf_lso's own extras, so pip
    fails the session if setup.py's ranges stop accepting the pair."""
    session.install(
        f"tensorflow=={tensorflow}",
        f"keras=={keras}",
        f"tf-keras=={tf_keras}",
        "-e",
        ".[tensorflow,test]",
    )
