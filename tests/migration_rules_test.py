"""Tests for tf_lso_migration.rule and rules/: the table of rules.

A toy rule registered here proves that a rule is one class: the checker,
the fixer, the reports and `--select` find it in the table.
"""

import ast
import doctest
import json
import pathlib
import re

import migration_util
import pytest

from tf_lso_migration import rule as rule_lib
from tf_lso_migration import rules

MIGRATION = pathlib.Path(__file__).parents[1] / "docs" / "migration.md"


def test_doctests():
    assert doctest.testmod(rule_lib).failed == 0


def test_every_rule_links_to_a_section_of_the_migration_guide():
    headings = re.findall(r"^#+ (.+)$", MIGRATION.read_text(), re.M)
    anchors = {rules.anchor(h) for h in headings}
    for rule in rules.RULES.values():
        assert rules.anchor(rule.section) in anchors, rule
        assert rule.severity in rules.SEVERITIES
        row = f"| `{rule.id}` | {rule.severity} | {rule.summary} |"
        assert row in MIGRATION.read_text(), rule.id
        # The last column: the routes it holds on.
        [line] = [line for line in MIGRATION.read_text().splitlines()
                  if line.startswith(row)]
        assert line.endswith(f" | {', '.join(rule.routes)} |"), rule.id


def test_rule_ids_are_their_modules_names():
    # One module per rule, named after it: where a reader looks for one.
    for rule in rules.RULES.values():
        module = type(rule).__module__
        assert module == f"tf_lso_migration.rules.{rule.id.replace('-', '_')}"


class ToyRule(rule_lib.Rule):
    """Flags `toy_old(...)`; `--fix` renames it `toy_new`."""

    id = "toy-rule"
    severity = "warning"
    section = "Other things you will hit"
    summary = "`toy_old`, which a toy rule renames"
    visits = (ast.Call,)
    fixes = True

    def visit(self, node, context):
        if isinstance(node.func, ast.Name) and node.func.id == "toy_old":
            context.report(node, self.id, "`toy_old` is gone; use `toy_new`.")

    def fix(self, module, tree, cst, lines, route):
        del tree, route
        position = cst.metadata.PositionProvider

        class Rename(cst.CSTTransformer):
            METADATA_DEPENDENCIES = (position,)

            def leave_Name(self, original_node, updated_node):
                if (updated_node.value == "toy_old" and self.get_metadata(
                        position, original_node).start.line in lines):
                    return updated_node.with_changes(value="toy_new")
                return updated_node

        return cst.metadata.MetadataWrapper(module).visit(Rename())


@pytest.fixture
def toy_rule():
    rule_lib.register(ToyRule)
    yield rules.RULES["toy-rule"]
    rule_lib.unregister("toy-rule")


SOURCE = "x = toy_old(1)  # toy\ny = toy_old(2)  # tf-lso: ignore[toy-rule]\n"


def test_a_registered_rule_is_checked_selected_and_reported(toy_rule):
    from tf_lso_migration import check
    from tf_lso_migration import report

    findings = check.check_source(SOURCE, "toy.py")
    assert [(f.line, f.rule, f.severity, f.fixable) for f in findings] == [
        (1, "toy-rule", "warning", True)]
    assert report.rule_ids(["toy-rule"]) == {"toy-rule"}
    assert check.check_source(SOURCE, options=check.Options(
        ignore={"toy-rule"})) == []
    assert check.check_source(SOURCE, "toy.py", options=check.Options(
        route="tf-keras")) == findings  # Every route (the default).
    sarif = json.loads(report.sarif(findings, 1))
    [rule] = sarif["runs"][0]["tool"]["driver"]["rules"]
    assert rule["id"] == "toy-rule"
    assert rule["help"]["text"] == toy_rule.documentation == (
        "toy-rule (warning; routes: keras3, tf-keras)\n\n"
        "Finds `toy_old`, which a toy rule renames.\n\n"
        "`--fix` rewrites what it finds, where it can. More in tf_lso's "
        "migration\nguide (docs/migration.md in its repository), section "
        "\"Other things you\nwill hit\".")


@migration_util.needs_libcst
def test_a_registered_rule_fixes(toy_rule):
    from tf_lso_migration import fix

    del toy_rule
    # Line 2's comment suppresses its finding, so its fix too.
    assert fix.fix_source(SOURCE) == SOURCE.replace(
        "x = toy_old", "x = toy_new")


def test_registering_checks_the_rule():
    class Nameless(rule_lib.Rule):
        severity = "warning"

    with pytest.raises(ValueError, match="needs the string attributes"):
        rule_lib.register(Nameless)

    class Taken(ToyRule):
        id = "legacy-name"

    with pytest.raises(ValueError, match="registered already"):
        rule_lib.register(Taken)


def test_a_rule_runs_only_on_files_that_mention_one_of_its_words(
        toy_rule, monkeypatch):
    from tf_lso_migration import check

    visited = []
    monkeypatch.setattr(toy_rule, "mentions", ("toy_old",))
    monkeypatch.setattr(toy_rule, "visit",
                        lambda node, context: visited.append(node.lineno))
    check.check_source("x = toy_new(1)\n")
    assert visited == []
    check.check_source("x = toy_new(1)\ny = toy_old(2)\n")
    assert visited == [1, 2]


def _snippets():
    """Every source the migration tests check, by name."""
    import migration_fix_test
    import migration_mixed_precision_test as mixed

    snippets = dict(migration_fix_test._test_snippets())
    for cases in ("CASES", "PATH_CASES", "OUTPUT_CASES"):
        for index, (source, _) in enumerate(getattr(mixed, cases)):
            snippets[f"{cases}[{index}]"] = source
    for path in sorted(mixed.FIXTURES.glob("*.py")):
        snippets[path.name] = path.read_text()
    return snippets


def test_the_words_rules_mention_change_no_finding(monkeypatch):
    # Each rule's words are a test before it runs: with none, every rule
    # runs on every file, and finds the same.
    from tf_lso_migration import check

    snippets = _snippets()
    before = {name: check.check_source(source, collapse=False)
              for name, source in snippets.items()}
    assert sum(len(found) for found in before.values()) > 150
    assert {r.id for r in rules.RULES.values() if r.mentions} == {
        "legacy-name", "variable-name-suffix", "skipped-step-iterations",
        "clip-before-unscale", "unscale-once", "bfloat16-loss-scale",
        "float16-output"}
    for rule in rules.RULES.values():
        monkeypatch.setattr(rule, "mentions", ())
    for name, source in snippets.items():
        assert check.check_source(source, collapse=False) == before[name], (
            name)
