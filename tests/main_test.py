"""`python -m tf_lso` without TensorFlow, or next to an old TensorFlow.

The checker only parses code, so it runs where linters run: a lint-only CI
job or a pre-commit hook with no TensorFlow, and the code base's own
environment with TensorFlow 2.4-2.15 still installed. The runtime, imported
there, says what to install. Each case runs in a fresh interpreter in which
TensorFlow, Keras and tf_keras cannot be imported (or are an old fake).
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap

import migration_util
import pytest

ROOT = pathlib.Path(__file__).parents[1]
LEGACY = "import tensorflow as tf\ntf.train.experimental.DynamicLossScale()\n"

# Makes `import tensorflow` (keras, tf_keras) fail, as on a machine without.
_BLOCK = textwrap.dedent("""\
    import sys

    class _NotInstalled:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("tensorflow", "keras", "tf_keras"):
                raise ModuleNotFoundError(f"No module named {name!r}",
                                          name=name)
            return None

    sys.meta_path.insert(0, _NotInstalled())
""")


def _python(code, tmp_path, extra_path=None):
    path = [str(ROOT)] + ([str(extra_path)] if extra_path else [])
    code = f"import sys; sys.path[:0] = {path!r}\n" + code
    return subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)


def _cli(args):
    return textwrap.dedent(f"""\
        import runpy
        sys.argv = ["tf_lso"] + {args!r}
        try:
            runpy.run_module("tf_lso", run_name="__main__", alter_sys=True)
        except SystemExit as e:
            print("exit", e.code)
        print("tensorflow imported:", "tensorflow" in sys.modules)
    """)


@migration_util.needs_libcst
def test_check_and_fix_run_without_tensorflow(tmp_path):
    (tmp_path / "train.py").write_text(LEGACY)
    done = _python(_BLOCK + _cli(["check", "train.py"]), tmp_path)
    assert "error legacy-name" in done.stdout, done.stderr
    assert done.stdout.endswith("exit 1\ntensorflow imported: False\n")
    done = _python(_BLOCK + _cli(["check", "--fix", "--write", "train.py"]),
                   tmp_path)
    assert "exit 0" in done.stdout, done.stderr
    assert "tf_lso.experimental.DynamicLossScale()" in (
        tmp_path / "train.py").read_text()


def test_runtime_without_tensorflow_says_what_to_install(tmp_path):
    for use in ("import tf_lso; tf_lso.LossScaleOptimizer",
                "from tf_lso import LossScaleOptimizer",
                "import tf_lso.experimental",
                "import tf_lso; tf_lso.install()"):
        done = _python(_BLOCK + use, tmp_path)
        assert done.returncode == 1, use
        assert done.stderr.strip().splitlines()[-1].startswith(
            "ImportError: tf_lso requires TensorFlow, which could not be "
            "imported"), (use, done.stderr[-500:])
    done = _python(_BLOCK + "import tf_lso; print(tf_lso.__version__)",
                   tmp_path)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr


def test_check_next_to_an_old_tensorflow(tmp_path):
    # The audit starts in the code base's own environment.
    fake = tmp_path / "site"
    (fake / "tensorflow").mkdir(parents=True)
    (fake / "tensorflow" / "__init__.py").write_text('__version__ = "2.4.1"\n')
    (tmp_path / "train.py").write_text(LEGACY)
    done = _python(_cli(["check", "train.py"]), tmp_path, extra_path=fake)
    assert "error legacy-name" in done.stdout, done.stderr
    assert "exit 1" in done.stdout
    done = _python("import tf_lso; tf_lso.LossScaleOptimizer", tmp_path,
                   extra_path=fake)
    assert ("tf_lso requires TensorFlow >= 2.16, but found TensorFlow 2.4.1"
            in done.stderr), done.stderr[-500:]


@migration_util.needs_tensorflow
def test_importing_tf_lso_registers_its_classes_with_keras(tmp_path):
    # With TensorFlow there, `import tf_lso` is enough for Keras to find
    # tf_lso's classes by their registered names (`.keras` files, configs).
    done = _python(textwrap.dedent("""\
        import keras
        import tf_lso
        for name in ("LossScaleOptimizer", "LossScaleOptimizerV1"):
            assert keras.saving.get_registered_object(f"tf_lso>{name}"), name
        print("registered")
    """), tmp_path)
    assert done.stdout == "registered\n", done.stderr[-1000:]


def test_the_command_line_imports_no_tensorflow_even_when_installed(tmp_path):
    (tmp_path / "train.py").write_text(LEGACY)
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "tf_lso", "check",
         "train.py"], capture_output=True, text=True, timeout=120,
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1, done.stderr[-2000:]
    assert "error legacy-name" in done.stdout
    imported = [line.rsplit("|", 1)[-1].strip()
                for line in done.stderr.splitlines()
                if line.startswith("import time:")]
    assert "tf_lso_migration.check" in imported
    assert not [m for m in imported if m.split(".")[0] in (
        "tensorflow", "keras", "tf_keras")]


def test_console_script_and_pre_commit_hooks(tmp_path):
    # What `pip install tf_lso` puts on PATH, and what the pre-commit hooks
    # (.pre-commit-hooks.yaml) run.
    script = shutil.which("tf-lso", path=os.path.dirname(sys.executable))
    assert script, "no tf-lso script: install tf_lso (pip install -e .)"
    (tmp_path / "train.py").write_text(LEGACY)
    done = subprocess.run([script, "check", "train.py", "--format", "json"],
                          capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    assert '"rule": "legacy-name"' in done.stdout
    assert done.stderr == ""  # Quiet: no TensorFlow start-up lines.
    hooks = (ROOT / ".pre-commit-hooks.yaml").read_text()
    entries = re.findall(r"^  entry: (.+)$", hooks, re.M)
    assert entries == ["tf-lso check", "tf-lso check --fix --write"]
    for entry in entries:
        done = subprocess.run([script, *entry.split()[1:], "--help"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr


def test_command_line_errors_are_one_line_and_status_2(tmp_path):
    from tf_lso_migration import cli

    def error(argv):
        done = subprocess.run(
            [sys.executable, "-m", "tf_lso", *argv], capture_output=True,
            text=True, timeout=120, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 2, (argv, done.stderr)
        assert "Traceback" not in done.stderr
        return done.stderr.strip().splitlines()[-1]

    assert error(["run", "missing.py", "--x"]) == (
        "python -m tf_lso run: error: no such file: 'missing.py'")
    # The script's arguments are optional.
    assert error(["run"]) == ("python -m tf_lso run: error: the following "
                              "arguments are required: script")
    assert error(["check", "missing_dir"]) == (
        "python -m tf_lso check: error: no such file or directory: "
        "'missing_dir'")
    assert error(["frobnicate"]).startswith("python -m tf_lso: error: ")
    for command in ("run", "check"):
        with pytest.raises(SystemExit) as done:
            cli.main([command, "--help"])
        assert done.value.code == 0


def test_help_shows_examples(capsys):
    from tf_lso_migration import cli

    for command, example in (
            ([], "python -m tf_lso run old_train.py --epochs 3"),
            (["run"], "python -m tf_lso run old_train.py --epochs 3"),
            (["check"], "python -m tf_lso check --fix --write src/")):
        with pytest.raises(SystemExit):
            cli.main([*command, "--help"])
        assert example in capsys.readouterr().out, command


def test_help_points_to_what_an_installed_tool_has(capsys):
    # A wheel has no docs/ (issue 51): the tool's own rule texts, and the
    # project's migration guide by its title.
    from tf_lso_migration import cli

    with pytest.raises(SystemExit):
        cli.main(["--help"], prog="tf-lso")
    out = capsys.readouterr().out
    assert "docs/" not in out
    assert " ".join(out.split()).endswith(
        "more: `tf-lso rule` lists the rules, `tf-lso rule ID` explains one "
        "and what to write instead; tf_lso's migration guide is \"Migrating "
        "TF 2.1–2.4 loss scaling code to tf_lso\" in the project's "
        "documentation")


# TensorFlow's C++ log lines (absl's format and the older one), and absl's
# notice before them.
_TF_LOG = re.compile(r"^([IWEF]\d{4} \d\d:|\d{4}-\d\d-\d\d [\d:.]+: [IWEF] )"
                     r"|^WARNING: All log messages before absl|cuInit",
                     re.MULTILINE)
_SCRIPT = textwrap.dedent("""\
    import sys
    import warnings

    import tensorflow as tf

    # Still possible: run did not start TensorFlow's runtime.
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    print("logical CPUs:", len(tf.config.list_logical_devices("CPU")))
    print("the script's own stderr", file=sys.stderr)
    warnings.warn("the script's own warning")
    raise RuntimeError("the script's own error")
""")


@migration_util.needs_tensorflow
def test_run_shows_the_script_not_tensorflows_start_up_log(tmp_path):
    # Issue 51: TensorFlow's start-up notices (and on a machine without a
    # GPU an error-level cuInit line) read as tf_lso failing.
    (tmp_path / "script.py").write_text(_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-m", "tf_lso", "run", "script.py"],
                          capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env=env)
    assert done.returncode == 1
    assert done.stdout == "logical CPUs: 2\n"
    assert not _TF_LOG.search(done.stderr), done.stderr
    assert done.stderr.startswith("the script's own stderr\n"), done.stderr
    assert "UserWarning: the script's own warning" in done.stderr
    assert 'File "script.py", line 13, in <module>' in done.stderr
    assert done.stderr.endswith(
        "RuntimeError: the script's own error\n"), done.stderr
    # The traceback is the script's, as `python script.py` shows it: no
    # frame of tf_lso's command line or of runpy above it.
    traceback = done.stderr[done.stderr.index("Traceback"):]
    assert re.findall(r'^  File "([^"]*)"', traceback, re.M) == [
        "script.py"], traceback

    # TF_CPP_MIN_LOG_LEVEL set by the user: TensorFlow logs as it says.
    done = subprocess.run([sys.executable, "-m", "tf_lso", "run", "script.py"],
                          capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**env, "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert done.stdout == "logical CPUs: 2\n"
    assert _TF_LOG.search(done.stderr), done.stderr
    assert done.stderr.endswith(
        "RuntimeError: the script's own error\n"), done.stderr


def test_run_hides_only_tensorflows_log_at_start_up(capfd, monkeypatch):
    from tf_lso_migration import cli

    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    written = (
        b"WARNING: All log messages before absl::InitializeLog() is called "
        b"are written to STDERR\n"
        b"I0000 00:00:1795836741.970703    6506 port.cc:153] oneDNN custom "
        b"operations are on.\n"
        b"a Python warning\n"
        b"2026-11-28 03:32:26.561746: E external/local_xla/xla/stream_execut"
        b"or/cuda/cuda_fft.cc:479] Unable to register cuFFT factory\n"
        b"I0000 00:00:1795836742.018779    6506 cpu_feature_guard.cc:227] "
        b"This TensorFlow binary is optimized\n"
        b"To enable the following instructions: AVX2 FMA, in other "
        b"operations, rebuild TensorFlow.\n"
        b"E0000 00:00:1795836744.636953    6506 cuda_platform.cc:52] failed "
        b"call to cuInit: INTERNAL: CUDA error\n")
    with cli._start_up_log_hidden():
        os.write(2, written)
    assert capfd.readouterr().err == "a Python warning\n"
    with pytest.raises(ImportError):  # Starting failed: all of it shows.
        with cli._start_up_log_hidden():
            os.write(2, written)
            raise ImportError("no TensorFlow")
    assert capfd.readouterr().err == written.decode()
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert ("With TF_CPP_MIN_LOG_LEVEL set in the environment, only what is "
            "below that level is hidden (0: nothing; 1: notices; 2: warnings "
            "too)") in " ".join(capfd.readouterr().out.split())
    # The user's level: what is below it is hidden, also the lines that
    # TensorFlow 2.21 prints whatever the level.
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    with cli._start_up_log_hidden():
        os.write(2, written)
    assert capfd.readouterr().err == written.decode()
    lines = written.decode().splitlines(True)
    for level, kept in (("1", [0, 2, 3, 6]), ("2", [2, 3, 6]), ("3", [2])):
        monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", level)
        with cli._start_up_log_hidden():
            os.write(2, written)
        assert capfd.readouterr().err == "".join(lines[i] for i in kept)


def test_a_closed_pipe_ends_the_check_quietly(tmp_path):
    # `tf-lso check ... | head`: the reader goes away after a few lines.
    (tmp_path / "many.py").write_text(
        "import tensorflow as tf\n"
        + "tf.train.experimental.FixedLossScale(8)\n" * 5000)
    process = subprocess.Popen(
        [sys.executable, "-m", "tf_lso", "check", "many.py"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    first = process.stdout.readline()
    process.stdout.close()  # As `head -1` does.
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 1
    assert first.startswith(b"many.py:2:1: error legacy-name: ")
    assert err == "", err


def test_run_without_tensorflow_says_what_to_install_in_one_line(tmp_path):
    (tmp_path / "train.py").write_text("print('ran')\n")
    done = _python(_BLOCK + _cli(["run", "train.py"]), tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("python -m tf_lso run: error: tf_lso requires "
                           "TensorFlow, which could not be imported"), line
    assert "ran" not in done.stdout
    assert done.stdout.endswith("exit 1\ntensorflow imported: False\n")


def test_version_and_rules_from_the_console_script(tmp_path):
    import tf_lso

    script = shutil.which("tf-lso", path=os.path.dirname(sys.executable))
    assert script, "no tf-lso script: install tf_lso (pip install -e .)"
    done = subprocess.run([script, "--version"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (
        0, f"tf-lso {tf_lso.__version__}\n")
    done = subprocess.run([script, "rule", "run-v2"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("run-v2 (error; routes: keras3, tf-keras)")


# -- Install instructions that work today (issue 42, item 8) -----------------

def _section(text, heading):
    return text.split(f"{heading}\n", 1)[1].split("\n#", 1)[0]


def test_readme_installs_from_what_exists():
    # tf_lso is not on the package index: a clone, or a wheel built there.
    install = " ".join(
        _section((ROOT / "README.md").read_text(), "## Install").split())
    assert 'pip install ".[tensorflow]"' in install
    assert 'pip install --find-links=dist "tf_lso[tensorflow]"' in install
    assert "python -m pip wheel --no-deps -w dist ." in install
    assert re.findall(r'pip install "tf_lso\[', install) == []


def test_pre_commit_snippets_give_a_rev_one_can_use():
    # No tags exist: the snippets say to pin a commit, not "<a tag>".
    docs = _section((ROOT / "docs" / "migration.md").read_text(),
                    "## Checking a code base")
    hooks = (ROOT / ".pre-commit-hooks.yaml").read_text()
    for text in (docs, hooks):
        assert "<a tag" not in text
        assert re.search(r"rev: <a commit SHA of main>", text), text
        assert "pre-commit autoupdate --bleeding-edge" in text


def test_fix_without_libcst_names_what_pip_can_install():
    from tf_lso_migration import fix

    assert "`pip install 'libcst>=1.1'`" in fix._LIBCST_ADVICE


def test_runtime_advice_installs_tensorflow_not_tf_lso_from_an_index(
        tmp_path):
    done = _python(_BLOCK + "import tf_lso; tf_lso.LossScaleOptimizer",
                   tmp_path)
    advice = done.stderr.strip().splitlines()[-1]
    assert "pip install 'tensorflow>=2.16'" in advice
    assert "tf_lso[tensorflow]" not in advice
