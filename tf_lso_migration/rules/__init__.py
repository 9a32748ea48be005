"""The rules of `python -m tf_lso check`: one module each.

Importing this package imports every module in it; each registers its rule
with `@rule.register`, and `RULES` (rule id -> rule) is the table that the
checker, the fixer, the reports and the docs-table test read. A new rule is
a new module here (see docs/architecture.md, "Adding a migration rule").
"""

import importlib
import pkgutil

from tf_lso_migration.rule import ROUTES
from tf_lso_migration.rule import RULES
from tf_lso_migration.rule import SEVERITIES
from tf_lso_migration.rule import anchor

__all__ = ("ROUTES", "RULES", "SEVERITIES", "anchor")

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
    importlib.import_module(f"{__name__}.{_info.name}")
