"""How `python -m tf_lso check` reports its findings: text, JSON or SARIF.

Also which findings: `--select` / `--ignore`.
"""

import json

import tf_lso
from tf_lso._migration import rules

_SARIF_LEVELS = {"error": "error", "warning": "warning", "info": "note"}


def rule_ids(values):
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
                f"{', '.join(sorted(rules.RULES))}")
    return ids


def selected(findings, select, ignore):
    """The findings of the `select`ed rules (all if empty) but `ignore`."""
    return [f for f in findings
            if (not select or f.rule in select) and f.rule not in ignore]


def counts(findings):
    """{severity: how many findings have it}, for every severity."""
    return {s: sum(f.severity == s for f in findings)
            for s in rules.SEVERITIES}


def text(findings, files):
    """Human-readable report: one line a finding, then a summary."""
    lines = [
        f"{f.location()}: {f.severity} {f.rule}: {f.message} See {f.doc}"
        for f in findings
    ]
    by_severity = counts(findings)
    fixable = sum(f.fixable for f in findings)
    lines.append(
        f"{files} file{'s' * (files != 1)} checked: {by_severity['error']} "
        f"error(s), {by_severity['warning']} warning(s), "
        f"{by_severity['info']} info; {fixable} fixable with --fix."
    )
    return "\n".join(lines)


def json_report(findings, files):
    """The report as JSON (for CI)."""
    return json.dumps({
        "files": files,
        "findings": [f.to_json() for f in findings],
        "counts": counts(findings),
    }, indent=2)


def fails(findings, threshold):
    """Whether any finding is at or above severity `threshold` ('never': no)."""
    if threshold == "never":
        return False
    level = rules.SEVERITIES.index(threshold)
    return any(rules.SEVERITIES.index(f.severity) >= level for f in findings)


def sarif(findings, files):
    """The report as SARIF 2.1.0 (code scanning annotations in CI)."""
    del files  # SARIF lists results, not the files without any.
    used = sorted({f.rule for f in findings})
    return json.dumps({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "tf-lso",
                "version": tf_lso.__version__,
                "rules": [{
                    "id": rule_id,
                    "shortDescription": {"text": rules.RULES[rule_id].summary},
                    "defaultConfiguration": {
                        "level": _SARIF_LEVELS[rules.RULES[rule_id].severity]},
                    "properties": {"doc": rules.doc_link(rule_id)},
                } for rule_id in used],
            }},
            "results": [_sarif_result(f, used.index(f.rule))
                        for f in findings],
        }],
    }, indent=2)


def _sarif_result(finding, rule_index):
    message = finding.message
    if finding.cell is not None:
        message = f"[cell {finding.cell}] {message}"
    return {
        "ruleId": finding.rule,
        "ruleIndex": rule_index,
        "level": _SARIF_LEVELS[finding.severity],
        "message": {"text": f"{message} See {finding.doc}"},
        "locations": [{"physicalLocation": {
            "artifactLocation": {"uri": finding.path.replace("\\", "/")},
            "region": {"startLine": finding.line,
                       "startColumn": finding.column},
        }}],
    }
