"""`skipped-step-iterations`: `iterations` next to TF 2.1-2.3's optimizer.

TF 2.2/2.3's experimental LossScaleOptimizer did not count skipped steps
in `iterations`; TF 2.4 and tf_lso do. Reported at each read of an
`iterations` attribute, in a file that uses that class (under any of its
names).
"""

import ast

from tf_lso_migration import legacy_names
from tf_lso_migration import rule

_EXPERIMENTAL_LSO = "tf_lso.experimental.LossScaleOptimizer"


@rule.register
class SkippedStepIterations(rule.Rule):
    """`iterations` read next to TF 2.1-2.3's LossScaleOptimizer, which
    did not count skipped steps; TF 2.4 and tf_lso do

    TF 2.2/2.3's experimental LossScaleOptimizer left `iterations`
    unchanged on a step it skipped for a non-finite gradient; TF 2.4,
    tf_keras and tf_lso count every step. Learning rate schedules, step
    counters and logs keyed on `opt.iterations` include skipped steps now;
    `opt.skipped_steps` (tf_lso) counts those. Reported at each read of
    `iterations` in a file that uses TF 2.1-2.3's class.
    """

    id, severity = "skipped-step-iterations", "warning"
    section = "Differences from TF 2.1–2.3 (experimental class)"
    visits = (ast.Attribute, ast.Name)
    mentions = ("LossScaleOptimizer",)  # The class, under any name.

    def visit(self, node, context):
        notes = context.notes[self.id]
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            return
        found = context.resolve(node)
        if found and legacy_names.behaviour(found[0]) == _EXPERIMENTAL_LSO:
            notes["uses_experimental_lso"] = True
        elif (isinstance(node, ast.Attribute) and node.attr == "iterations"
              and isinstance(node.ctx, ast.Load)
              and (found is None or not legacy_names.is_legacy(found[0]))):
            notes.setdefault("reads", []).append(node)

    def finish(self, context):
        notes = context.notes[self.id]
        if not notes.get("uses_experimental_lso"):
            return
        for node in notes.get("reads", ()):
            context.report(node, self.id, "TF 2.2/2.3's experimental "
                           "LossScaleOptimizer did not advance `iterations` "
                           "on skipped steps; TF 2.4 and tf_lso do. Step "
                           "counts, schedules and logs keyed on it include "
                           "skipped steps now.")
