"""`[tool.tf-lso]` in pyproject.toml: where a team keeps its check settings.

As ruff, mypy and pytest read theirs: the first pyproject.toml with a
`[tool.tf-lso]` table, in the current directory or above it. Its keys are
the defaults of `python -m tf_lso check`'s options of the same names; an
option given on the command line replaces its key.

    [tool.tf-lso]
    select = ["legacy-name", "run-v2"]   # rule ids (default: all)
    ignore = ["loss-scale-call"]
    fail-on = "warning"                  # info, warning, error, never
    exclude = ["build", "third_party/*"] # globs, from this file's directory
    route = "tf-keras"                   # keras3 (default) or tf-keras

TOML is read with `tomllib` (Python 3.11+) or, before 3.11, `tomli` if it
is installed; without either a `[tool.tf-lso]` table is an error that says
so (a pyproject.toml without one is not read at all).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from typing import Any

from tf_lso_migration import rules

FAIL_ON = ("info", "warning", "error", "never")
_TABLE = re.compile(r"""^\s*\[\s*tool\s*\.\s*(["']?)tf-lso\1\s*\]""", re.M)
_LISTS = ("select", "ignore", "exclude")


class ConfigError(ValueError):
    """A `[tool.tf-lso]` table that cannot be used; the message says why."""


@dataclasses.dataclass(frozen=True)
class Config:
    """The settings of one `[tool.tf-lso]` table.

    Attributes:
        path: The pyproject.toml (None: no table found, the defaults).
        settings: Key -> value, for the keys the table gives (`fail-on`
            as `fail_on`).
    """

    path: pathlib.Path | None = None
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def root(self) -> pathlib.Path:
        """The directory `exclude` patterns are relative to."""
        return self.path.parent if self.path else pathlib.Path.cwd()


def _toml_loads():
    """`tomllib.loads`, or tomli's before Python 3.11, or None."""
    try:
        import tomllib
    except ImportError:
        try:
            import tomli as tomllib
        except ImportError:
            return None
    return tomllib.loads


def find(start: pathlib.Path | None = None) -> pathlib.Path | None:
    """The first pyproject.toml with a `[tool.tf-lso]` table, from `start`
    (default: the current directory) up; None if there is none."""
    start = pathlib.Path(start or pathlib.Path.cwd()).resolve()
    for directory in (start, *start.parents):
        path = directory / "pyproject.toml"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        if _TABLE.search(text):
            return path
    return None


def load(path: pathlib.Path | None = None) -> Config:
    """The `Config` of `path`, or of `find()` if None.

    Raises:
        ConfigError: The file cannot be read or parsed, there is no TOML
            reader, or a key or value is not one of those documented.
    """
    path = path or find()
    if path is None:
        return Config()
    loads = _toml_loads()
    if loads is None:
        raise ConfigError(f"{path}: reading [tool.tf-lso] needs Python 3.11+ "
                          "or tomli (pip install tomli)")
    try:
        table = loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{path} cannot be read: {e}") from e
    table = table.get("tool", {}).get("tf-lso", {})
    return Config(path, _validated(table, path))


def _validated(table, path):
    settings = {}
    for key, value in table.items():
        where = f"{path}: [tool.tf-lso] {key}"
        if key in _LISTS:
            if not (isinstance(value, list)
                    and all(isinstance(v, str) for v in value)):
                raise ConfigError(f"{where}: a list of strings, not {value!r}")
            if key != "exclude":
                unknown = sorted(set(value) - set(rules.RULES))
                if unknown:
                    raise ConfigError(
                        f"{where}: unknown rule {unknown[0]!r}; the rules "
                        f"are: {', '.join(rules.RULES)}")
        elif key in ("fail-on", "route"):
            allowed = FAIL_ON if key == "fail-on" else rules.ROUTES
            if value not in allowed:
                raise ConfigError(f"{where}: one of {', '.join(allowed)}, "
                                  f"not {value!r}")
        else:
            raise ConfigError(
                f"{path}: unknown key {key!r} in [tool.tf-lso]; the keys "
                f"are: {', '.join(_LISTS + ('fail-on', 'route'))}")
        settings[key.replace("-", "_")] = value
    return settings
