"""`unparsable`: a file that could not be read or parsed; it was skipped.

The checker reports it itself (`check.check_source`, `check.check_file`):
there is no tree for a rule to visit.
"""

from tf_lso_migration import rule


@rule.register
class Unparsable(rule.Rule):
    """a file that could not be read or parsed as Python 3; it was
    skipped

    Python 2 code, a syntax error, bytes that are not in the file's
    encoding, or a notebook that is not valid JSON: the file is reported
    and skipped, and the run goes on. Port Python 2 code first (`print x`,
    `except E, e`), then check it again.
    """

    id, severity = "unparsable", "error"
    section = "Checking a code base"
