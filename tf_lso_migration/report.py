"""How `python -m tf_lso check` reports its findings: text, JSON or SARIF.

Also how it reads `--select` / `--ignore` values. Each rule's own
documentation (`Rule.documentation`) goes with the tool: `tf-lso rule ID`
prints it and SARIF carries it, so no finding points to a file that only a
clone of tf_lso has.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from collections.abc import Sequence
from typing import TYPE_CHECKING

import tf_lso_migration
from tf_lso_migration import rules

if TYPE_CHECKING:
    from tf_lso_migration.check import Finding
    from tf_lso_migration.rule import Rule

_SARIF_LEVELS = {"error": "error", "warning": "warning", "info": "note"}


def rule_ids(values: Iterable[str]) -> set[str]:
    """The rule ids in `--select`/`--ignore` values (comma-separated).

    Raises:
        ValueError: For an id that is not a rule, naming the rules.
    """
    ids = {part.strip() for value in values for part in value.split(",")
           if part.strip()}
    for rule_id in sorted(ids):
        if rule_id not in rules.RULES:
            raise ValueError(
                f"unknown rule {rule_id!r}; the rules are: "
                f"{', '.join(rules.RULES)}")
    return ids


def counts(findings: Sequence[Finding]) -> dict[str, int]:
    """{severity: how many findings have it}, for every severity."""
    return {s: sum(f.severity == s for f in findings)
            for s in rules.SEVERITIES}


def line(finding: Finding) -> str:
    """One finding as a line of the text report."""
    return (f"{finding.location()}: {finding.severity} {finding.rule}: "
            f"{finding.message}")


def summary(findings: Sequence[Finding], files: int, command: str) -> str:
    """The text report's last line; `command` runs the CLI (for `rule`)."""
    by_severity = counts(findings)
    fixable = sum(f.fixable for f in findings)
    text = (f"{files} file{'s' * (files != 1)} checked: "
            f"{by_severity['error']} error(s), {by_severity['warning']} "
            f"warning(s), {by_severity['info']} info; {fixable} fixable with "
            "--fix.")
    if findings:
        text += f" `{command} rule ID` explains a rule."
    return text


def json_report(findings: Sequence[Finding], files: int) -> str:
    """The report as JSON (for CI)."""
    return json.dumps({
        "files": files,
        "findings": [f.to_json() for f in findings],
        "counts": counts(findings),
    }, indent=2)


def fails(findings: Sequence[Finding], threshold: str) -> bool:
    """Whether any finding is at or above severity `threshold` ('never': no)."""
    if threshold == "never":
        return False
    level = rules.SEVERITIES.index(threshold)
    return any(rules.SEVERITIES.index(f.severity) >= level for f in findings)


def sarif(findings: Sequence[Finding], files: int) -> str:
    """The report as SARIF 2.1.0 (code scanning annotations in CI)."""
    del files  # SARIF lists results, not the files without any.
    used = sorted({f.rule for f in findings})
    return json.dumps({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "tf-lso",
                "version": tf_lso_migration.__version__,
                "rules": [_sarif_rule(rules.RULES[rule_id])
                          for rule_id in used],
            }},
            "results": [_sarif_result(f, used.index(f.rule))
                        for f in findings],
        }],
    }, indent=2)


def _sarif_rule(rule: Rule) -> dict[str, object]:
    return {
        "id": rule.id,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": rule.explanation or rule.summary},
        "help": {"text": rule.documentation,
                 "markdown": rule.documentation},
        "defaultConfiguration": {"level": _SARIF_LEVELS[rule.severity]},
        "properties": {"routes": list(rule.routes)},
    }


def _sarif_result(finding: Finding, rule_index: int) -> dict[str, object]:
    message = finding.message
    region: dict[str, int | None] = {"startLine": finding.line,
                                      "startColumn": finding.column}
    if finding.cell is not None:  # The line and column in the .ipynb file.
        message = f"[cell {finding.cell}, line {finding.line}] {message}"
        region = {"startLine": finding.file_line,
                  "startColumn": finding.file_column}
    return {
        "ruleId": finding.rule,
        "ruleIndex": rule_index,
        "level": _SARIF_LEVELS[finding.severity],
        "message": {"text": message},
        "locations": [{"physicalLocation": {
            "artifactLocation": {"uri": finding.path.replace("\\", "/")},
            "region": region,
        }}],
    }
