"""`python -m tf_lso run | check | rule`: see `tf_lso_migration.cli`.

The commands live in `tf_lso_migration`, which imports no TensorFlow. `main`
and `console_main` stay importable from here for older scripts.
"""

import sys

from tf_lso_migration.cli import console_main
from tf_lso_migration.cli import main

__all__ = ("console_main", "main")

if __name__ == "__main__":
    sys.exit(main())
