"""How `python -m tf_lso check` reports its findings: text or JSON."""

import json

from tf_lso._migration import rules


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
