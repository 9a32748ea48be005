"""`python -m tf_lso run | check | rule`: see `tf_lso_migration.cli`.

The commands live in `tf_lso_migration`, which imports no TensorFlow (the
`tf-lso` console script runs them from there); this only starts them.
`main` and `console_main` are kept here too, for scripts made before.
"""

import sys

from tf_lso_migration.cli import console_main
from tf_lso_migration.cli import main

__all__ = ("console_main", "main")

if __name__ == "__main__":
    sys.exit(main())
