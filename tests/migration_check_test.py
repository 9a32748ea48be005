"""Tests for tf_lso_migration.check and `python -m tf_lso check`."""

import json
import pathlib
import textwrap

import pytest

from tf_lso_migration import check as migration_check
from tf_lso_migration import cli

SNIPPETS = pathlib.Path(__file__).parent / "migration_snippets"


def _found(findings):
    return [(f.line, f.column, f.rule) for f in findings]


def test_every_pattern_in_the_tf23_snippet():
    findings = migration_check.check_file(SNIPPETS / "tf23_patterns.py")
    assert _found(findings) == [
        (7, 1, "legacy-name"),  # from tensorflow.python.training...
        (9, 10, "legacy-name"),  # mixed_precision.experimental.Policy
        (9, 10, "policy-loss-scale"),
        (10, 1, "legacy-name"),  # ...experimental.set_policy
        (14, 1, "optimizer-v2-subclass"),
        (22, 14, "decayed-lr"),
        (28, 11, "legacy-name"),  # tf.keras...experimental.LossScaleOptimizer
        (30, 1, "legacy-name"),  # tf.train...graph_rewrite
        (37, 12, "dtype-name"),
        (42, 58, "aggregate-gradients"),
        (46, 1, "run-v2"),
        (47, 50, "variable-name-suffix"),
        (48, 7, "loss-scale-call"),
        (48, 25, "schedule-call"),
        (48, 43, "skipped-step-iterations"),
        (49, 7, "private-attribute"),
        (49, 23, "private-attribute"),
        (49, 40, "get-gradients"),
    ]
    legacy = [f for f in findings if f.rule == "legacy-name"]
    assert all(f.fixable for f in legacy)
    assert not any(f.fixable for f in findings if f.rule != "legacy-name")
    assert "use `tf_lso.experimental.FixedLossScale`" in legacy[0].message
    assert "`tf_lso.experimental.Policy`" in legacy[1].message
    hooks = [f for f in findings if f.rule == "optimizer-v2-subclass"][0]
    assert "_resource_apply_dense, _set_hyper" in hooks.message


def test_tf24_import_of_the_keras3_name():
    findings = migration_check.check_file(SNIPPETS / "tf24_custom_loop.py")
    assert _found(findings) == [(13, 1, "legacy-name")]
    assert "Keras 3's class" in findings[0].message
    assert "`tf_lso.LossScaleOptimizer`" in findings[0].message


# (source, expected findings); their fixes run in migration_fix_test.py.
SNIPPET_CASES = [
    # Each spelling of a legacy name is reported once, where it is written.
    ("import tensorflow as tf\n"
     "x = tf.keras.mixed_precision.experimental.LossScaleOptimizer\n",
     [(2, 5, "legacy-name")]),
    ("from tensorflow.keras.mixed_precision import experimental as mp\n"
     "mp.LossScaleOptimizer(opt, 'dynamic')\n",
     [(1, 1, "legacy-name")]),
    ("import tensorflow.keras.mixed_precision.experimental as mp\n"
     "mp.Policy('mixed_float16')\n",
     [(1, 1, "legacy-name")]),
    ("import tensorflow as tf\n"
     "mp = tf.keras.mixed_precision.experimental\n"
     "mp.LossScaleOptimizer(opt, 'dynamic')\n",
     [(2, 6, "legacy-name")]),
    ("from tensorflow.mixed_precision.experimental import DynamicLossScale\n",
     [(1, 1, "legacy-name")]),
    ("import keras\n"  # Standalone Keras 2 spelled it the same way.
     "keras.mixed_precision.experimental.Policy('mixed_float16', 'dynamic')\n",
     [(2, 1, "legacy-name"), (2, 1, "policy-loss-scale")]),
    ("import tensorflow.compat.v2 as tf\n"
     "tf.train.experimental.FixedLossScale(8)\n",
     [(2, 1, "legacy-name")]),
    # Not legacy: Keras 3's names, an unrelated `experimental`, no import.
    ("import tensorflow as tf\n"
     "tf.keras.mixed_precision.set_global_policy('mixed_float16')\n"
     "tf.keras.mixed_precision.Policy('mixed_float16')\n"
     "tf.data.experimental.AUTOTUNE\n",
     []),
    ("x = tf.keras.mixed_precision.experimental.Policy('float32')\n", []),
    # iterations only matters next to TF 2.1-2.3's class.
    ("import tensorflow as tf\nprint(opt.iterations)\n", []),
    ("from tensorflow.keras.mixed_precision import experimental as mp\n"
     "opt = mp.LossScaleOptimizer(opt, 'dynamic')\n"
     "step = opt.iterations\n",
     [(1, 1, "legacy-name"), (3, 8, "skipped-step-iterations")]),
    # `self._optimizer` inside a class is the class's own business.
    ("class A:\n    def f(self):\n        return self._optimizer\n", []),
    # (Only in a regex or a comparison with a name: see test_real_code.)
    ("import re\n"
     "re.search('kernel:0', v.name); re.match('10:00', v.name)\n"
     "re.fullmatch('ratio 1:0', v.name)\n",
     [(2, 11, "variable-name-suffix")]),
    ("if v.name in ['dense_1:0', 'w1:0', '%s:0' % name, r'.*/bias:0']: pass\n",
     [(1, 15, "variable-name-suffix"), (1, 28, "variable-name-suffix"),
      (1, 36, "variable-name-suffix"), (1, 51, "variable-name-suffix")]),
    ("from tensorflow.compat.v1.train.experimental import "
     "enable_mixed_precision_graph_rewrite\n",
     [(1, 1, "graph-rewrite")]),
    # tf_lso's own graph rewrite is what the warning recommends.
    ("import tf_lso\n"
     "opt = tf_lso.experimental.enable_mixed_precision_graph_rewrite(opt)\n"
     "from tf_lso.experimental import enable_mixed_precision_graph_rewrite\n",
     []),
]


@pytest.mark.parametrize("source, expected", SNIPPET_CASES)
def test_snippets(source, expected):
    assert _found(migration_check.check_source(source)) == expected


def test_unparsable_source_is_one_finding():
    path = SNIPPETS / "py2_script.py"
    findings = migration_check.check_file(path)
    # The column is where this interpreter's parser points: 1 from Python
    # 3.10, the string after `print` (7) on 3.9.
    with pytest.raises(SyntaxError) as error:
        compile(path.read_text(), str(path), "exec")
    assert error.value.offset in (1, 7)
    assert _found(findings) == [(1, error.value.offset, "unparsable")]
    assert "Missing parentheses" in findings[0].message
    assert findings[0].severity == "error"


def test_notebook_cells_share_imports_and_keep_their_lines():
    findings = migration_check.check_file(SNIPPETS / "notebook.ipynb")
    assert [(f.cell, f.line, f.column, f.rule) for f in findings] == [
        (2, 2, 7, "legacy-name")]
    assert findings[0].location().endswith("notebook.ipynb[cell 2]:2:7")
    assert not findings[0].fixable  # --fix does not rewrite notebooks.


def test_notebook_cell_magics_are_not_python(tmp_path):
    notebook = {"cells": [
        {"cell_type": "code", "source": "%%bash\necho tf.keras\n"},
        {"cell_type": "code", "source": ["import tensorflow as tf\n",
                                         "!ls\n", "x?\n", "tf.train."
                                         "experimental.FixedLossScale(2)"]},
    ]}
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(notebook))
    findings = migration_check.check_file(path)
    assert [(f.cell, f.line, f.rule) for f in findings] == [
        (1, 4, "legacy-name")]


def test_an_indented_magic_alone_in_its_block_keeps_the_notebook(tmp_path):
    # tensorflow/tpu's keras_mnist_tpu.ipynb: a shell escape as the only
    # line of an `if` block; the findings after it are still found.
    notebook = {"cells": [
        {"cell_type": "code", "source": ["import tensorflow as tf\n",
                                         "if IN_COLAB:\n", "    !pip install x\n",
                                         "else:\n", "  %load_ext tensorboard\n"]},
        {"cell_type": "code", "source": "tf.train.experimental."
                                        "FixedLossScale(2)"},
    ]}
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(notebook))
    findings = migration_check.check_file(path)
    assert [(f.cell, f.line, f.rule) for f in findings] == [
        (1, 1, "legacy-name")]


def test_comments_and_continued_lines_are_not_magics(tmp_path):
    # A comment that ends in `?` (at any indent, or after code inside
    # brackets) and a line that continues an expression (`!= b`, `% 3`)
    # are Python, not `name?` help or a magic.
    notebook = {"cells": [{"cell_type": "code", "source": [
        "import tensorflow as tf\n",
        "for i in r:\n",
        "    print(i)\n",
        "# should we log?\n",
        "    print(2 * i)\n",
        "layers = [\n",
        "    tf.keras.layers.Dense(64),  # too small?\n",
        "]\n",
        "ok = (a\n",
        "      != b)\n",
        "n = (a\n",
        "     % 3)\n",
        "tf.train.experimental.FixedLossScale(2)",
    ]}]}
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(notebook))
    findings = migration_check.check_file(path)
    assert [(f.cell, f.line, f.rule) for f in findings] == [
        (0, 13, "legacy-name")]


def test_strings_assigned_magics_and_timed_cells(tmp_path):
    # Review 2's D5: a bracket left open in a docstring is no bracket (the
    # `!nvidia-smi` after it made the notebook unparsable), nor is a magic
    # inside a string one; `x = !cmd` is a magic; the body of a `%%time` or
    # `%%capture` cell is Python, a `%%bash` cell's is not.
    notebook = {"cells": [
        {"cell_type": "code", "source": [
            "import tensorflow as tf\n",
            "def train():\n",
            '    """Steps:\n',
            "    (1) load (2 build\n",
            "!not a magic, in the docstring\n",
            '    """\n',
            "!nvidia-smi\n",
            "gpus = !nvidia-smi -L\n",
            "t = %timeit -o sum(range(10))\n",
            "tf.train.experimental.FixedLossScale(2)"]},
        {"cell_type": "code", "source":
            "%%time\ntf.train.experimental.FixedLossScale(2)"},
        {"cell_type": "code", "source":
            "%%capture out\nx = 1\ntf.train.experimental.FixedLossScale(2)"},
        {"cell_type": "code", "source":
            "%%bash\necho tf.train.experimental.FixedLossScale\n"},
    ]}
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(notebook))
    findings = migration_check.check_file(path)
    assert [(f.cell, f.line, f.rule) for f in findings] == [
        (0, 10, "legacy-name"), (1, 2, "legacy-name"), (2, 3, "legacy-name")]
    assert migration_check.notebook_cells(path.read_text())[0][1].split(
        "\n")[4:9] == ["!not a magic, in the docstring", '    """', "pass",
                       "pass", "pass"]


def test_continued_magics_blank_lines_and_continued_strings(tmp_path):
    # Review 3's D3, as IPython reads them: the lines after a magic or shell
    # line that ends in `\\` are part of it (Colab's `!pip install -q \\`);
    # blank lines before `%%bash` leave it a cell magic; a string continued
    # by `\\` is still a string on the next line, so `!ls` after it is a
    # magic. Each made the notebook unparsable, hiding the last finding.
    cells = [
        "!pip install -q \\\n    tensorflow-datasets \\\n    addons\n",
        "%%capture\n!pip install -q \\\n    tensorflow-addons\n",
        "%%time\nfor i in range(2):\n    !echo a \\\n        b\n",
        "\n%%bash\necho hi (\n",
        "s = 'abc \\\n(def'\n!ls\n",
        "import tensorflow as tf\n"
        "tf.train.experimental.FixedLossScale(2)\n",
    ]
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps({"cells": [
        {"cell_type": "code", "source": source} for source in cells]}))
    [finding] = migration_check.check_file(path)
    assert (finding.cell, finding.line, finding.rule, finding.message) == (
        5, 2, "legacy-name",
        "`tf.train.experimental.FixedLossScale` no longer exists on "
        "TensorFlow 2.16+; use `tf_lso.experimental.FixedLossScale`.")


def test_bad_files_are_findings_not_crashes(tmp_path):
    (tmp_path / "bad.ipynb").write_text("{not json")
    (tmp_path / "latin1.py").write_bytes(b"x = '\xe9'\n")
    (tmp_path / "nul.py").write_bytes(b"x = 1\x00\n")
    paths = [tmp_path / "bad.ipynb", tmp_path / "latin1.py",
             tmp_path / "nul.py", tmp_path / "missing.py"]
    for path in paths:
        [finding] = migration_check.check_file(path)
        assert finding.rule == "unparsable", path


def test_directories_skip_hidden_dirs_caches_and_virtualenvs(tmp_path):
    for name in ("a.py", "sub/b.ipynb", ".git/c.py", "__pycache__/d.py",
                 "venv/e.py", "notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "venv" / "pyvenv.cfg").write_text("")
    found = migration_check.python_files([tmp_path])
    assert sorted(p.relative_to(tmp_path).as_posix() for p in found) == [
        "a.py", "sub/b.ipynb"]


def _write(tmp_path, source):
    path = tmp_path / "old.py"
    path.write_text(textwrap.dedent(source))
    return path


def test_cli_text_report_and_exit_status(tmp_path, capsys):
    path = _write(tmp_path, """\
        import tensorflow as tf
        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(o, 8)
        print(opt.loss_scale())
        """)
    assert cli.main(["check", str(path)]) == 1  # An error (default).
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"{path}:2:7: error legacy-name: `tf.keras.mixed_precision."
        "experimental.LossScaleOptimizer` no longer exists on TensorFlow "
        "2.16+; use `tf_lso.experimental.LossScaleOptimizer`.")
    assert out[1].startswith(f"{path}:3:7: info loss-scale-call: ")
    assert out[2] == ("1 file checked: 1 error(s), 0 warning(s), 1 info; "
                      "1 fixable with --fix. `python -m tf_lso rule ID` "
                      "explains a rule.")
    assert cli.main(["check", str(path), "--fail-on", "never"]) == 0


@pytest.mark.parametrize("fail_on, status", [
    ("info", 1), ("warning", 1), ("error", 0), ("never", 0)])
def test_cli_fail_on_threshold(tmp_path, fail_on, status):
    path = _write(tmp_path, "x = v.name == 'dense/kernel:0'\n")  # A warning.
    assert cli.main(["check", str(path), "--fail-on", fail_on]) == status


def test_cli_clean_code_passes_every_threshold(tmp_path, capsys):
    path = _write(tmp_path, "import tf_lso\nopt = tf_lso.LossScaleOptimizer(o)\n")
    assert cli.main(["check", str(path), "--fail-on", "info"]) == 0
    assert capsys.readouterr().out == (
        "1 file checked: 0 error(s), 0 warning(s), 0 info; "
        "0 fixable with --fix.\n")


def test_cli_json(capsys):
    status = cli.main(["check", str(SNIPPETS), "--format", "json"])
    assert status == 1
    report = json.loads(capsys.readouterr().out)
    assert report["files"] == 4
    assert report["counts"] == {"info": 2, "warning": 8, "error": 11}
    first = report["findings"][0]
    assert first == {
        "path": str(SNIPPETS / "notebook.ipynb"), "cell": 2, "line": 2,
        "column": 7, "rule": "legacy-name", "severity": "error",
        "fixable": False, "message": first["message"],
        # The line and column in the .ipynb file (its JSON text).
        "file_line": 31, "file_column": 12,
    }
    assert [f["rule"] for f in report["findings"]].count("unparsable") == 1


def test_cli_usage_errors(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["check"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["check", "x.py", "--write"])
    assert e.value.code == 2
    assert "--write needs --fix" in capsys.readouterr().err


# -- What real code bases showed (issue 32) --------------------------------

REAL_CODE_CASES = [
    # A private TF 2.x module imported whole is legacy where it is imported.
    ("from tensorflow.python.keras.mixed_precision.experimental import "
     "loss_scale_optimizer as lso\n"
     "opt = lso.LossScaleOptimizer(opt, 'dynamic')\n",
     [(1, 1, "legacy-name")]),
    # A variable name in a regex or compared with a name ...
    ("import re\nre.search('kernel:0', v.name)\n",
     [(2, 11, "variable-name-suffix")]),
    ("if v.name == 'dense/bias:0' or 'w:0' in v.name: pass\n",
     [(1, 14, "variable-name-suffix"), (1, 32, "variable-name-suffix")]),
    ("ok = v.name.endswith('kernel:0')\n",
     [(1, 22, "variable-name-suffix")]),
    # ... but not device strings, graph tensor names, or any other string.
    ("import tensorflow as tf\n"
     "with tf.device('/gpu:0'): pass\n"
     "s = tf.distribute.OneDeviceStrategy('device:GPU:0')\n"
     "t = graph.get_tensor_by_name('Identity:0')\n"
     "if d.name == '/job:worker/replica:0/task:0/device:CPU:0': pass\n"
     "label = 'dense/kernel:0'\n",
     []),
    # Behaviour belongs to the class, whatever the spelling (after --fix).
    ("import tf_lso\n"
     "opt = tf_lso.experimental.LossScaleOptimizer(opt, 'dynamic')\n"
     "step = opt.iterations\n",
     [(3, 8, "skipped-step-iterations")]),
    ("from tf_lso import experimental\n"
     "experimental.Policy('mixed_float16', loss_scale=128)\n",
     [(2, 1, "policy-loss-scale")]),
    # OptimizerV2 hooks that come from a mixin in the same file
    # (tensorflow/addons' AdamW).
    ("import tensorflow as tf\n"
     "class DecoupledWeightDecayExtension:\n"
     "    def _resource_apply_dense(self, grad, var): pass\n"
     "class Extended(DecoupledWeightDecayExtension):\n"
     "    pass\n"
     "class AdamW(Extended, tf.keras.optimizers.Adam):\n"
     "    pass\n",
     [(6, 1, "optimizer-v2-subclass")]),
    # ... or from tensorflow/addons itself.
    ("import tensorflow as tf\n"
     "import tensorflow_addons as tfa\n"
     "class AdamW(tfa.optimizers.DecoupledWeightDecayExtension,\n"
     "            tf.keras.optimizers.Adam):\n"
     "    pass\n",
     [(3, 1, "optimizer-v2-subclass")]),
]


# A `:0` pattern held in a name, in the same function (issue 42).
NAMED_PATTERN_CASES = [
    # A parameter default used as a pattern.
    ("import re\n"
     "def decay(model, regex=r'.*(kernel|weight):0$'):\n"
     "    pattern = re.compile(regex)\n"
     "    return [v for v in model.weights if pattern.match(v.name)]\n",
     [(2, 24, "variable-name-suffix")]),
    # A local bound to a pattern, then matched against a `.name`.
    ("import re\n"
     "def frozen(v):\n"
     "    pat = 'dense_[0-9]+/kernel:0'\n"
     "    return re.match(pat, v.name)\n",
     [(3, 11, "variable-name-suffix")]),
    # A local compared with a `.name`; a module-level constant.
    ("TARGET = 'dense/bias:0'\n"
     "def f(v):\n"
     "    name = 'w:0'\n"
     "    return v.name == name or v.name == TARGET\n",
     [(1, 10, "variable-name-suffix"), (3, 12, "variable-name-suffix")]),
    # Not: bound twice (which one reaches the call?), a device string, a
    # name from another function, a name never used as a pattern, a
    # parameter that shadows a module constant.
    ("import re\n"
     "def f(v, cond):\n"
     "    pat = 'kernel:0'\n"
     "    if cond:\n"
     "        pat = 'kernel'\n"
     "    dev = '/gpu:0'\n"
     "    re.match(pat, v.name); re.match(dev, v.name)\n"
     "def g(v):\n"
     "    other = 'kernel:0'\n"
     "    return re.match(pat, v.name)\n"
     "PAT = 'kernel:0'\n"
     "def h(v, PAT):\n"
     "    return re.match(PAT, v.name)\n",
     []),
    # A lambda's default, and the same constant used twice: one finding.
    ("import re\n"
     "match = lambda v, p='bias:0': re.search(p, v.name) or re.match(p, v.name)\n",
     [(2, 21, "variable-name-suffix")]),
]


@pytest.mark.parametrize("source, expected", NAMED_PATTERN_CASES)
def test_a_pattern_held_in_a_name(source, expected):
    assert _found(migration_check.check_source(source)) == expected


@pytest.mark.parametrize("source, expected", REAL_CODE_CASES)
def test_real_code_cases(source, expected):
    assert _found(migration_check.check_source(source)) == expected


def test_a_name_tf_lso_does_not_provide_is_not_fixable():
    findings = migration_check.check_source(
        "import tensorflow as tf\n"
        "x = tf.keras.mixed_precision.experimental.LossScaleGradientTape\n"
        "from tensorflow.keras.mixed_precision import experimental as mp\n"
        "mp.Policy('float32'); mp.Bogus()\n")
    assert _found(findings) == [(2, 5, "legacy-name"), (3, 1, "legacy-name"),
                                (4, 23, "legacy-name")]
    assert [f.fixable for f in findings] == [False, False, False]
    assert "tf_lso does not provide" in findings[0].message
    assert "`tf.keras.mixed_precision.experimental.Bogus`" in (
        findings[2].message)


def test_info_is_one_note_per_file_and_rule():
    findings = migration_check.check_source(
        "a = opt.loss_scale()\nb = opt.loss_scale()\nc = opt.loss_scale()\n")
    assert _found(findings) == [(1, 5, "loss-scale-call")]
    assert findings[0].message.endswith(" (Also at lines 2, 3.)")


@pytest.mark.parametrize("data, line", [
    (b"# -*- coding: latin-1 -*-\nimport tensorflow as tf\n"
     b"x = tf.train.experimental.FixedLossScale(8)  # \xe9\n", 3),
    (b"\xef\xbb\xbfimport tensorflow as tf\r\n"
     b"x = tf.train.experimental.FixedLossScale(8)\r\n", 2),
])
def test_files_are_read_as_python_reads_them(tmp_path, data, line):
    # A PEP 263 coding line, a UTF-8 byte order mark, CRLF line ends.
    path = tmp_path / "encoded.py"
    path.write_bytes(data)
    assert _found(migration_check.check_file(path)) == [
        (line, 5, "legacy-name")]


def test_suppression_comments():
    findings = migration_check.check_source(
        "import tensorflow as tf\n"
        "a = tf.train.experimental.FixedLossScale(8)  # tf-lso: ignore\n"
        "b = opt.loss_scale()  # tf-lso: ignore[loss-scale-call]\n"
        "c = tf.train.experimental.FixedLossScale(8)  "
        "# tf-lso: ignore[loss-scale-call]\n"
        "d = opt.learning_rate(3)  # tf-lso: ignore[legacy-name, "
        "schedule-call]\n")
    assert _found(findings) == [(4, 5, "legacy-name")]


def test_cli_select_and_ignore(tmp_path, capsys):
    path = _write(tmp_path, """\
        import tensorflow as tf
        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(o, 8)
        print(opt.loss_scale(), opt.learning_rate(3))
        """)

    def rules_found(*args):
        cli.main(["check", str(path), "--format", "json", *args])
        return [f["rule"] for f in json.loads(capsys.readouterr().out)[
            "findings"]]

    assert rules_found() == ["legacy-name", "loss-scale-call",
                             "schedule-call"]
    assert rules_found("--select", "schedule-call,legacy-name") == [
        "legacy-name", "schedule-call"]
    assert rules_found("--ignore", "legacy-name", "--ignore",
                       "loss-scale-call") == ["schedule-call"]
    assert cli.main(["check", str(path), "--ignore", "legacy-name"]) == 0
    with pytest.raises(SystemExit) as e:
        cli.main(["check", str(path), "--select", "no-such-rule"])
    assert e.value.code == 2
    assert "unknown rule 'no-such-rule'" in capsys.readouterr().err


def test_cli_sarif(tmp_path, capsys):
    path = _write(tmp_path, """\
        import tensorflow as tf
        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(o, 8)
        print(opt.loss_scale())
        """)
    assert cli.main(["check", str(path), "--format", "sarif"]) == 1
    sarif = json.loads(capsys.readouterr().out)
    assert sarif["version"] == "2.1.0"
    [run] = sarif["runs"]
    driver = run["tool"]["driver"]
    assert driver["name"] == "tf-lso"
    rule_ids = [rule["id"] for rule in driver["rules"]]
    assert "legacy-name" in rule_ids and "loss-scale-call" in rule_ids
    results = [(r["ruleId"], r["level"],
                r["locations"][0]["physicalLocation"]["region"])
               for r in run["results"]]
    assert results == [
        ("legacy-name", "error", {"startLine": 2, "startColumn": 7}),
        ("loss-scale-call", "note", {"startLine": 3, "startColumn": 7}),
    ]
    uri = run["results"][0]["locations"][0]["physicalLocation"][
        "artifactLocation"]["uri"]
    assert uri == path.as_posix()
    assert run["results"][0]["message"]["text"].startswith(
        "`tf.keras.mixed_precision.experimental.LossScaleOptimizer`")


# -- Input it takes calmly (issue 42) --------------------------------------

def test_a_named_file_that_is_not_python_is_skipped_with_a_notice(
        tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# Not Python: tf.keras.mixed_precision.experimental\n")
    script = tmp_path / "tool"  # A script without a suffix, with a shebang.
    script.write_text("#!/usr/bin/env python3\nimport tensorflow as tf\n"
                      "tf.train.experimental.FixedLossScale(8)\n")
    assert cli.main(["check", str(readme)]) == 0
    out, err = capsys.readouterr()
    assert err == (f"{readme}: skipped: not a Python file or notebook\n"
                   "warning: no Python files or notebooks found\n")
    assert out == ("0 files checked: 0 error(s), 0 warning(s), 0 info; "
                   "0 fixable with --fix.\n")
    assert cli.main(["check", str(readme), str(script)]) == 1
    out, err = capsys.readouterr()
    assert err == f"{readme}: skipped: not a Python file or notebook\n"
    assert out.startswith(f"{script}:3:1: error legacy-name: ")


def test_an_empty_directory_is_a_warning(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert cli.main(["check", str(tmp_path / "empty")]) == 0
    assert capsys.readouterr().err == (
        "warning: no Python files or notebooks found\n")


def test_a_syntax_error_names_the_file(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("def f(:\n")
    [finding] = migration_check.check_file(path)
    assert "<unknown>" not in finding.message
    assert finding.message == (
        f"Not parsed, skipped: invalid syntax ({path.name}, line 1).")


def test_text_findings_are_printed_as_each_file_is_checked(
        tmp_path, capsys, monkeypatch):
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(
            "import tensorflow as tf\ntf.train.experimental.FixedLossScale(8)\n")
    printed_before = []
    real_check_file = migration_check.check_file

    def check_file(path, *args, **kwargs):
        out = capsys.readouterr().out
        printed_before.append(out)
        print(out, end="")  # Back in the captured output.
        return real_check_file(path, *args, **kwargs)

    monkeypatch.setattr(migration_check, "check_file", check_file)
    assert cli.main(["check", str(tmp_path)]) == 1
    assert printed_before[0] == ""
    assert printed_before[1].startswith(f"{tmp_path / 'a.py'}:2:1: error ")


def test_progress_on_a_terminal(tmp_path, capsys, monkeypatch):
    for index in range(3):
        (tmp_path / f"m{index}.py").write_text("x = 1\n")
    monkeypatch.setattr(cli, "_is_terminal", lambda stream: True)
    assert cli.main(["check", "--format", "json", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "checking 1/3 files" in err and "checking 3/3 files" in err
    assert err.endswith("\r\x1b[K")  # The progress line is cleared.


# -- Findings explain themselves (issue 42) ---------------------------------

def test_findings_point_to_the_rule_command_not_to_a_clone(tmp_path, capsys):
    path = _write(tmp_path, """\
        import tensorflow as tf
        opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(o, 8)
        """)
    cli.main(["check", str(path)])
    out = capsys.readouterr().out
    assert "docs/migration.md" not in out
    assert out.splitlines()[-1] == (
        "1 file checked: 1 error(s), 0 warning(s), 0 info; 1 fixable with "
        "--fix. `python -m tf_lso rule ID` explains a rule.")
    cli.main(["check", str(path), "--format", "sarif"])
    sarif = json.loads(capsys.readouterr().out)
    [run] = sarif["runs"]
    [rule] = run["tool"]["driver"]["rules"]
    from tf_lso_migration import rules

    legacy = rules.RULES["legacy-name"]
    assert rule["shortDescription"] == {"text": legacy.summary}
    assert rule["fullDescription"] == {"text": legacy.explanation}
    assert rule["help"]["text"] == legacy.documentation
    assert legacy.explanation in rule["help"]["markdown"]
    assert "docs/migration.md" not in json.dumps(run["results"])
    cli.main(["check", str(path), "--format", "json"])
    [finding] = json.loads(capsys.readouterr().out)["findings"]
    assert "doc" not in finding


def test_rule_command_prints_a_rules_documentation(capsys):
    from tf_lso_migration import rules

    for rule_id, rule in rules.RULES.items():
        assert cli.main(["rule", rule_id]) == 0
        out = capsys.readouterr().out
        assert out == rule.documentation + "\n"
        assert out.startswith(f"{rule_id} ({rule.severity}; ")
        assert rule.summary in " ".join(out.split())
        assert rule.explanation in out
        assert len(rule.explanation) > 80, rule_id  # It explains.
    assert cli.main(["rule"]) == 0  # No id: every rule, one line each.
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == list(rules.RULES)
    with pytest.raises(SystemExit) as done:
        cli.main(["rule", "no-such-rule"])
    assert done.value.code == 2
    assert "unknown rule 'no-such-rule'" in capsys.readouterr().err


def test_help_lists_the_rules_and_version(capsys):
    import tf_lso
    from tf_lso_migration import rules

    for command in (["check"], ["rule"], []):
        with pytest.raises(SystemExit):
            cli.main([*command, "--help"])
        out = capsys.readouterr().out
        assert all(rule_id in out for rule_id in rules.RULES), command
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == (
        f"python -m tf_lso {tf_lso.__version__}\n")


# -- Configuration in pyproject.toml (issue 42) ------------------------------

_MIXED = ("import tensorflow as tf\n"
          "opt = tf.keras.mixed_precision.experimental.LossScaleOptimizer(o, 8)\n"
          "ok = v.name == 'dense/kernel:0'\n")


def _project(tmp_path, monkeypatch, table):
    (tmp_path / "pyproject.toml").write_text(
        "[project]\nname = 'demo'\n\n[tool.tf-lso]\n" + table)
    (tmp_path / "src" / "gen").mkdir(parents=True)
    (tmp_path / "src" / "train.py").write_text(_MIXED)
    (tmp_path / "src" / "gen" / "old.py").write_text(_MIXED)
    (tmp_path / "src" / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "src" / "sub")  # Found from a subdirectory.


def _rules_found(capsys, *args):
    status = cli.main(["check", "--format", "json", *args])
    report = json.loads(capsys.readouterr().out)
    return status, report["files"], [
        (pathlib.Path(f["path"]).name, f["rule"]) for f in report["findings"]]


def test_pyproject_table_sets_the_defaults(tmp_path, monkeypatch, capsys):
    _project(tmp_path, monkeypatch, 'ignore = ["legacy-name"]\n'
             'fail-on = "warning"\nexclude = ["gen"]\n')
    assert _rules_found(capsys, "..") == (
        1, 1, [("train.py", "variable-name-suffix")])
    # The command line overrides each key it gives.
    assert _rules_found(capsys, "..", "--ignore", "variable-name-suffix",
                        "--fail-on", "error") == (
        1, 1, [("train.py", "legacy-name")])
    assert _rules_found(capsys, "..", "--fail-on", "never")[0] == 0
    assert _rules_found(capsys, "..", "--exclude", "nothing")[1] == 2
    # An excluded file is excluded also when named (as pre-commit names it).
    assert _rules_found(capsys, "../gen/old.py")[1:] == (0, [])


def test_pyproject_select_and_route(tmp_path, monkeypatch, capsys):
    _project(tmp_path, monkeypatch, 'select = ["variable-name-suffix", '
             '"legacy-name"]\nroute = "tf-keras"\n')
    # On tf_keras a variable name keeps its ':0'.
    assert _rules_found(capsys, "../train.py") == (
        1, 1, [("train.py", "legacy-name")])
    assert _rules_found(capsys, "../train.py", "--route", "keras3")[2] == [
        ("train.py", "legacy-name"), ("train.py", "variable-name-suffix")]


@pytest.mark.parametrize("table, error", [
    ('selekt = ["legacy-name"]\n',
     "unknown key 'selekt' in [tool.tf-lso]"),
    ('select = "legacy-name"\n',
     "[tool.tf-lso] select: a list of strings"),
    ('ignore = ["no-such-rule"]\n', "unknown rule 'no-such-rule'"),
    ('fail-on = "sometimes"\n', "[tool.tf-lso] fail-on: one of"),
    ('route = "keras2"\n', "[tool.tf-lso] route: one of"),
    ("select = [\n", "cannot be read"),
])
def test_pyproject_errors_are_usage_errors(tmp_path, monkeypatch, capsys,
                                           table, error):
    _project(tmp_path, monkeypatch, table)
    with pytest.raises(SystemExit) as done:
        cli.main(["check", ".."])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert error in err and str(tmp_path / "pyproject.toml") in err, err


def test_pyproject_without_a_toml_reader(tmp_path, monkeypatch, capsys):
    # Python 3.9 and 3.10 have no tomllib: tomli if installed, else this.
    from tf_lso_migration import config

    monkeypatch.setattr(config, "_toml_loads", lambda: None)
    _project(tmp_path, monkeypatch, 'ignore = ["legacy-name"]\n')
    with pytest.raises(SystemExit) as done:
        cli.main(["check", ".."])
    assert done.value.code == 2
    assert ("reading [tool.tf-lso] needs Python 3.11+ or tomli "
            "(pip install tomli)") in capsys.readouterr().err
    # A pyproject.toml without the table is not read at all.
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    assert _rules_found(capsys, "..")[1] == 2


# -- The route a team is on (issue 42) --------------------------------------

_ROUTE_CASES = [
    # (source, findings on keras3, findings on tf-keras)
    ("import tensorflow as tf\n"
     "x = tf.keras.mixed_precision.LossScaleOptimizer(o, dynamic=False)\n"
     "from tensorflow.keras.mixed_precision import LossScaleOptimizer\n",
     [(2, 5, "legacy-name"), (3, 1, "legacy-name")], []),
    # tf_keras has no `experimental` module; TF no loss scale classes.
    ("import tensorflow as tf\n"
     "tf.keras.mixed_precision.experimental.Policy('mixed_float16')\n"
     "tf.mixed_precision.experimental.DynamicLossScale()\n",
     [(2, 1, "legacy-name"), (3, 1, "legacy-name")],
     [(2, 1, "legacy-name"), (3, 1, "legacy-name")]),
    ("import re\nre.match('kernel:0', v.name)\ny = x.dtype.name\n"
     "opt.apply_gradients(g, experimental_aggregate_gradients=False)\n"
     "opt._optimizer\n",
     [(2, 10, "variable-name-suffix"), (3, 5, "dtype-name"),
      (4, 57, "aggregate-gradients"), (5, 1, "private-attribute")], []),
    ("strategy.experimental_run_v2(f)\nopt._decayed_lr(tf.float32)\n"
     "opt.get_gradients(l, p)\nopt.learning_rate(3)\n",
     [(1, 1, "run-v2"), (2, 1, "decayed-lr"), (3, 1, "get-gradients"),
      (4, 1, "schedule-call")],
     [(1, 1, "run-v2"), (2, 1, "decayed-lr"), (3, 1, "get-gradients"),
      (4, 1, "schedule-call")]),
    # OptimizerV2 hooks: tf_keras's `legacy` optimizers still call them.
    ("import tensorflow as tf\n"
     "class A(tf.keras.optimizers.legacy.Adam):\n"
     "    def _resource_apply_dense(self, grad, var): pass\n"
     "class B(tf.keras.optimizers.Adam):\n"
     "    def _resource_apply_dense(self, grad, var): pass\n",
     [(2, 1, "optimizer-v2-subclass"), (4, 1, "optimizer-v2-subclass")],
     [(4, 1, "optimizer-v2-subclass")]),
]


@pytest.mark.parametrize("source, keras3, tf_keras", _ROUTE_CASES)
def test_findings_hold_on_the_route(source, keras3, tf_keras):
    def found(route):
        return _found(migration_check.check_source(
            source, options=migration_check.Options(route=route)))

    assert found("keras3") == keras3 == _found(
        migration_check.check_source(source))  # The default route.
    assert found("tf-keras") == tf_keras


def test_on_tf_keras_the_optimizer_finding_names_tf_keras_class_too():
    # tf_keras's `compile` trains with tf_lso's optimizer too (issue 41).
    source = ("import tensorflow as tf\n"
              "tf.keras.mixed_precision.experimental.LossScaleOptimizer\n"
              "tf.mixed_precision.experimental.DynamicLossScale\n")
    options = migration_check.Options(route="tf-keras")
    optimizer, loss_scale = migration_check.check_source(
        source, options=options)
    note = ("On tf_keras it also trains tf_keras models in "
            "`compile`/`fit` (docs/routes.md); tf_keras's own "
            "`tf.keras.mixed_precision.LossScaleOptimizer` is TF 2.4's API.")
    assert optimizer.message.endswith(note)
    assert note not in loss_scale.message
    assert note not in migration_check.check_source(source)[0].message


def test_route_option_and_rule_docs(tmp_path, capsys):
    path = _write(tmp_path, "ok = v.name == 'dense/kernel:0'\n")
    assert cli.main(["check", "--fail-on", "warning", str(path)]) == 1
    assert cli.main(["check", "--fail-on", "warning", "--route", "tf-keras",
                     str(path)]) == 0
    capsys.readouterr()
    cli.main(["rule", "variable-name-suffix"])
    assert capsys.readouterr().out.startswith(
        "variable-name-suffix (warning; route: keras3)\n")
    cli.main(["rule", "run-v2"])
    assert capsys.readouterr().out.startswith(
        "run-v2 (error; routes: keras3, tf-keras)\n")


# -- LossScaleOptimizer: Keras 3's class or TF 2.4's (issue 60) -------------

LOSS_SCALE_OPTIMIZER_CASES = [
    # Keras 3's own class, as Keras 3 code writes it (valid in TF 2.4 too):
    # not legacy, whatever the spelling.
    ("import keras\n"
     "opt = keras.mixed_precision.LossScaleOptimizer(\n"
     "    keras.optimizers.Adam(), initial_scale=1024)\n"
     "opt.apply(grads)\n",
     []),
    ("import tensorflow as tf\n"
     "from tensorflow.keras.mixed_precision import LossScaleOptimizer\n"
     "opt = LossScaleOptimizer(tf.keras.optimizers.SGD(),\n"
     "                         dynamic_growth_steps=1000)\n"
     "isinstance(opt, tf.keras.mixed_precision.LossScaleOptimizer)\n",
     []),
    # Another object's `loss_scale` says nothing of the optimizer
    # (tensorflow/models' `runtime_config.loss_scale`).
    ("import tensorflow as tf\n"
     "opt = tf.keras.mixed_precision.LossScaleOptimizer(inner)\n"
     "configure(opt, loss_scale=runtime_config.loss_scale)\n",
     []),
    # Before `tf_lso.install()` it is Keras 3's class too.
    ("import keras\n"
     "opt = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Adam())\n"
     "import tf_lso\n"
     "tf_lso.install()\n",
     []),
    # What Keras 3's class lacks is evidence of TF 2.4's API: legacy.
    ("import keras\n"
     "opt = keras.mixed_precision.LossScaleOptimizer(\n"
     "    keras.optimizers.Adam(), dynamic=False, initial_scale=1024)\n",
     [(2, 7, "legacy-name")]),
    # A second positional argument: a bool or a string is TF 2.4's
    # `dynamic` (or TF 2.3's loss scale); a number is Keras 3's
    # `initial_scale`, and a name may be either (review D5).
    ("import tensorflow as tf\n"
     "opt = tf.keras.mixed_precision.LossScaleOptimizer(inner, False)\n"
     "opt2 = tf.keras.mixed_precision.LossScaleOptimizer(inner, 'dynamic')\n",
     [(2, 7, "legacy-name"), (3, 8, "legacy-name")]),
    ("import keras\n"
     "opt = keras.mixed_precision.LossScaleOptimizer(\n"
     "    keras.optimizers.Adam(), 2 ** 12)\n"
     "opt2 = keras.mixed_precision.LossScaleOptimizer(inner, 128, 2000)\n"
     "opt3 = keras.mixed_precision.LossScaleOptimizer(inner, scale)\n",
     []),
    ("from tensorflow.keras.mixed_precision import LossScaleOptimizer\n"
     "opt = LossScaleOptimizer(inner)\n"
     "def step(loss):\n"
     "    return opt.get_scaled_loss(loss)\n",
     [(1, 1, "legacy-name")]),
    # Code written for both classes asks which it has (review D6).
    ("import keras\n"
     "opt = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Adam())\n"
     "def step(tape, loss, vs):\n"
     "    if hasattr(opt, 'get_scaled_loss'):\n"
     "        loss = opt.get_scaled_loss(loss)\n"
     "    else:\n"
     "        loss = opt.scale_loss(loss)\n"
     "    g = tape.gradient(loss, vs)\n"
     "    g = opt.get_unscaled_gradients(g) if hasattr(\n"
     "        opt, 'get_unscaled_gradients') else g\n",
     []),
    # Review 2's D2: an optimizer that the file gives both protocols'
    # calls (a version test picks one) ...
    ("import tensorflow as tf\n"
     "KERAS3 = tf.__version__ >= '2.16'\n"
     "opt = tf.keras.mixed_precision.LossScaleOptimizer(inner)\n"
     "def step(tape, loss, vs):\n"
     "    s = opt.scale_loss(loss) if KERAS3 else opt.get_scaled_loss(loss)\n"
     "    g = tape.gradient(s, vs)\n"
     "    if KERAS3:\n"
     "        opt.apply(g, vs)\n"
     "    else:\n"
     "        opt.apply_gradients(zip(opt.get_unscaled_gradients(g), vs))\n",
     []),
    # ... `getattr(opt, '<method>', None)`, a `try` that catches the
    # AttributeError ...
    ("import keras\n"
     "opt = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Adam())\n"
     "def scale(loss):\n"
     "    if getattr(opt, 'get_scaled_loss', None) is not None:\n"
     "        return opt.get_scaled_loss(loss)\n"
     "    return loss\n"
     "def unscale(grads):\n"
     "    try:\n"
     "        return opt.get_unscaled_gradients(grads)\n"
     "    except (AttributeError, TypeError):\n"
     "        return grads\n",
     []),
    # ... or a method of the file's own class, are no evidence.
    ("import keras\n"
     "class Amp:\n"
     "    def __init__(self, optimizer):\n"
     "        self.optimizer = optimizer\n"
     "    def get_scaled_loss(self, loss):\n"
     "        return self.optimizer.scale_loss(loss)\n"
     "amp = Amp(keras.mixed_precision.LossScaleOptimizer(\n"
     "    keras.optimizers.Adam()))\n"
     "scaled = amp.get_scaled_loss(1.0)\n",
     []),
    # Another optimizer's `scale_loss` says nothing of this one.
    ("import keras\n"
     "opt = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Adam())\n"
     "other.scale_loss(loss)\n"
     "opt.get_scaled_loss(loss)\n",
     [(2, 7, "legacy-name")]),
    # Evidence is what the object built from Keras 3's class gets: a name
    # or attribute the file binds to it (wrapped in place, or under a
    # flag), or a model's `optimizer` where `compile` is given it ...
    ("import tensorflow as tf\n"
     "class Trainer:\n"
     "    def __init__(self, mixed):\n"
     "        self.opt = tf.keras.optimizers.Adam()\n"
     "        if mixed:\n"
     "            self.opt = tf.keras.mixed_precision.LossScaleOptimizer(\n"
     "                self.opt)\n"
     "    def step(self, loss):\n"
     "        if self.mixed:\n"
     "            loss = self.opt.get_scaled_loss(loss)\n"
     "        return loss\n",
     [(6, 24, "legacy-name")]),
    ("import tensorflow as tf\n"
     "class Net(tf.keras.Model):\n"
     "    def train_step(self, data):\n"
     "        return self.optimizer.get_scaled_loss(self.compute_loss(data))\n"
     "opt = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.Adam())\n"
     "Net().compile(optimizer=opt, loss='mse')\n",
     [(5, 7, "legacy-name")]),
    # ... or what an `if isinstance(x, <Keras 3's class>):` holds calls on
    # `x` (review 1's p11, automl's shape) ...
    ("import tensorflow as tf\n"
     "from tensorflow.keras import mixed_precision\n"
     "def step(opt, loss):\n"
     "    if isinstance(opt, mixed_precision.LossScaleOptimizer):\n"
     "        loss = opt.get_scaled_loss(loss)\n"
     "    return loss\n",
     [(4, 24, "legacy-name")]),
    # ... not what another object gets (review 3's D2): tf_lso's or
    # tf_keras's, a parameter or an alias of the same name ...
    ("import keras\n"
     "import tf_lso\n"
     "fit_opt = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Adam())\n"
     "loop_opt = tf_lso.LossScaleOptimizer(keras.optimizers.Adam())\n"
     "scaled = loop_opt.get_scaled_loss(loss)\n",
     []),
    ("import keras\n"
     "opt = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Adam())\n"
     "def unscale(opt, grads):\n"
     "    return opt.get_unscaled_gradients(grads)\n",
     []),
    ("import tensorflow as tf\n"
     "opt = tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.Adam())\n"
     "class Trainer(tf.keras.Model):\n"
     "    def train_step(self, data):\n"
     "        optimizer = self.optimizer\n"
     "        return optimizer.get_scaled_loss(self.compute_loss(data))\n",
     []),
    # ... nor what code that asks which class it has holds: after an early
    # return, under a version test or `isinstance`, in a `try` that
    # catches every error.
    ("import keras\n"
     "opt = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Adam())\n"
     "def unscale(grads):\n"
     "    if not hasattr(opt, 'get_unscaled_gradients'):\n"
     "        return grads\n"
     "    return opt.get_unscaled_gradients(grads)\n",
     []),
    ("import keras\n"
     "import tensorflow as tf\n"
     "LEGACY = int(tf.__version__.split('.')[1]) < 16\n"
     "opt = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD())\n"
     "def unscale(grads):\n"
     "    if LEGACY:\n"
     "        return opt.get_unscaled_gradients(grads)\n"
     "    return grads\n",
     []),
    ("import keras\n"
     "import tf_lso\n"
     "opt = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Adam())\n"
     "def scale(loss):\n"
     "    if isinstance(opt, tf_lso.LossScaleOptimizer):\n"
     "        return opt.get_scaled_loss(loss)\n"
     "    return loss\n",
     []),
    ("import keras\n"
     "opt = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Adam())\n"
     "try:\n"
     "    scaled = opt.get_scaled_loss(loss)\n"
     "except Exception:\n"
     "    scaled = loss\n",
     []),
]


@pytest.mark.parametrize("source, expected", LOSS_SCALE_OPTIMIZER_CASES)
def test_the_keras3_name_is_legacy_only_where_tf24_api_is_used(source,
                                                               expected):
    assert _found(migration_check.check_source(source)) == expected


def test_the_loss_scale_optimizer_finding_names_the_spelling_and_evidence():
    [finding] = migration_check.check_source(
        "import keras\n"
        "opt = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.Adam())\n"
        "grads = opt.get_unscaled_gradients(grads)\n")
    assert finding.severity == "error" and finding.fixable
    assert finding.message == (
        "On TensorFlow 2.16+ `keras.mixed_precision.LossScaleOptimizer` is "
        "Keras 3's class, which has no `get_unscaled_gradients` (line 3): "
        "TF 2.4's class is `tf_lso.LossScaleOptimizer`.")


def test_install_in_a_function_covers_that_function_after_it():
    # Review Q3: `install()` in one function says nothing of another.
    findings = migration_check.check_source(
        "import tensorflow as tf\n"
        "def build():\n"
        "    return tf.train.experimental.DynamicLossScale()\n"
        "def main():\n"
        "    import tf_lso\n"
        "    tf_lso.install()\n"
        "    return tf.train.experimental.FixedLossScale(8)\n",
        collapse=False)
    assert [(f.line, f.severity) for f in findings] == [
        (3, "error"), (7, "info")]
    # Review 2's D3: not "It runs before `tf_lso.install()`": `main` may
    # call `build` after it.
    assert findings[0].message.endswith(
        " It is not in the function that calls `tf_lso.install()` (line 6), "
        "which provides it, so it is not known to run after that call.")


def test_a_function_defined_after_install_in_its_function_runs_after_it():
    # Review 3's D6: a def nested in the function that calls install(),
    # after the call, runs after it; one before it is not known to.
    findings = migration_check.check_source(
        "import tensorflow as tf\n"
        "import tf_lso\n"
        "def main():\n"
        "    def early():\n"
        "        return tf.train.experimental.FixedLossScale(8)\n"
        "    tf_lso.install()\n"
        "    def build():\n"
        "        return tf.train.experimental.DynamicLossScale()\n"
        "    return build(), early()\n",
        collapse=False)
    assert [(f.line, f.rule, f.severity, f.message) for f in findings] == [
        (5, "legacy-name", "error",
         "`tf.train.experimental.FixedLossScale` no longer exists on "
         "TensorFlow 2.16+; use `tf_lso.experimental.FixedLossScale`. It is "
         "in a function defined before `tf_lso.install()` (line 6), which "
         "provides it, so it is not known to run after that call."),
        (8, "legacy-name", "info",
         "`tf.train.experimental.DynamicLossScale` runs as "
         "`tf_lso.experimental.DynamicLossScale` under `tf_lso.install()` "
         "(line 6). `--fix` writes that name, so that the file runs without "
         "`install()` too.")]


def test_a_call_in_keras3s_signature_is_not_rewritten():
    # Review D5: `--fix` would make `2 ** 12` TF 2.4's `dynamic`.
    source = ("import keras\n"
              "opt = keras.mixed_precision.LossScaleOptimizer(\n"
              "    keras.optimizers.Adam(), 2 ** 12)\n"
              "grads = opt.get_unscaled_gradients(grads)\n")
    [finding] = migration_check.check_source(source)
    assert (finding.line, finding.severity, finding.fixable) == (
        2, "error", False)
    assert finding.message.endswith(
        " `--fix` leaves it: the call at line 2 passes Keras 3's "
        "`initial_scale` as its second positional argument, which would be "
        "TF 2.4's `dynamic`.")


def test_under_install_legacy_names_are_notes_on_what_install_does():
    findings = migration_check.check_source(
        "import tensorflow as tf\n"
        "from tensorflow.keras.mixed_precision import experimental as mp\n"
        "import tf_lso\n"
        "tf_lso.install()\n"
        "from tensorflow.keras.mixed_precision import experimental as mp2\n"
        "from tensorflow.python.keras.mixed_precision.experimental import (\n"
        "    loss_scale_optimizer as lso)\n"
        "def build(opt):\n"
        "    opt = tf.train.experimental.DynamicLossScale()\n"
        "    return tf.keras.mixed_precision.LossScaleOptimizer(opt)\n",
        collapse=False)
    assert [(f.line, f.rule, f.severity, f.fixable) for f in findings] == [
        (2, "legacy-name", "error", True),  # Runs before install().
        (5, "legacy-name", "info", True),
        (6, "legacy-name", "error", True),  # Not provided at run time.
        (9, "legacy-name", "info", True),
        (10, "legacy-name", "info", False),  # Keras 3's API: not rewritten.
    ]
    assert findings[0].message.endswith(
        " It runs before `tf_lso.install()` (line 4), which provides it.")
    assert findings[1].message == (
        "`tf.keras.mixed_precision.experimental` runs as "
        "`tf_lso.experimental` under `tf_lso.install()` (line 4). `--fix` "
        "writes that name, so that the file runs without `install()` too.")
    assert findings[3].message.startswith(
        "`tf.train.experimental.DynamicLossScale` runs as "
        "`tf_lso.experimental.DynamicLossScale` under `tf_lso.install()` "
        "(line 4).")
    assert findings[4].message == (
        "Under `tf_lso.install()` (line 4) "
        "`tf.keras.mixed_precision.LossScaleOptimizer` is "
        "`tf_lso.LossScaleOptimizer`, TF 2.4's class, not Keras 3's: its "
        "second positional argument is `dynamic`, and `iterations` counts "
        "the steps it skips. `keras.optimizers.LossScaleOptimizer` stays "
        "Keras 3's.")
    assert findings[2].message.endswith(
        " `tf_lso.install()` (line 4) does not provide TF's private modules.")


# -- Notebooks: where a finding is in the file (issue 42) ---------------------

def _notebook_line(path, text):
    """The 1-based line and column of `text` in the notebook file."""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if text in line:
            return number, line.index(text) + 1
    raise AssertionError(text)


def test_sarif_points_to_the_notebook_files_line(capsys):
    path = SNIPPETS / "notebook.ipynb"
    cli.main(["check", str(path), "--format", "sarif"])
    [result] = json.loads(capsys.readouterr().out)["runs"][0]["results"]
    line, column = _notebook_line(
        path, "tf.keras.mixed_precision.experimental.LossScaleOptimizer")
    assert result["locations"][0]["physicalLocation"]["region"] == {
        "startLine": line, "startColumn": column}
    assert result["message"]["text"].startswith("[cell 2, line 2] ")
    [finding] = migration_check.check_file(path)
    assert (finding.cell, finding.line, finding.column) == (2, 2, 7)
    assert (finding.file_line, finding.file_column) == (line, column)


def test_notebook_lines_in_sources_of_any_shape(tmp_path):
    # One string per cell, escapes before the code, a list whose items hold
    # several lines, and a compact file on one line.
    cells = [
        {"cell_type": "code", "source": "import tensorflow as tf\n"
         "x = '\\t\"\u00e9'; tf.train.experimental.FixedLossScale(2)"},
        {"cell_type": "markdown", "source": ["# tf.train.experimental\n"]},
        {"cell_type": "code", "source": [
            "a = 1\nb = 2\n", "tf.mixed_precision.experimental.LossScale\n"]},
    ]
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps({"cells": cells}, indent=1))
    found = migration_check.check_file(path)
    assert [(f.cell, f.line, f.column) for f in found] == [
        (0, 2, 14), (2, 3, 1)]
    text = path.read_text()
    first = _notebook_line(path, "tf.train.experimental.FixedLossScale")
    # In the file the code's `\\t`, `\\"` and `\\u00e9` are longer.
    assert (found[0].file_line, found[0].file_column) == first
    assert (found[1].file_line, found[1].file_column) == _notebook_line(
        path, "tf.mixed_precision.experimental")
    assert "\\u00e9" in text  # json.dumps escaped it.
    path.write_text(json.dumps({"cells": cells}))  # All on one line.
    found = migration_check.check_file(path)
    assert [(f.file_line, f.file_column) for f in found] == [
        (1, path.read_text().index(
            "tf.train.experimental.FixedLossScale") + 1),
        (1, path.read_text().index("tf.mixed_precision.experim") + 1)]
