"""What a migration rule is, what it sees, and the table of rules.

A rule is one class, whole in one module of `rules/`: its id, severity,
the routes it holds on (`ROUTES`), the section of docs/migration.md that
explains it (the docs anchor), its documentation (the class docstring: the
summary that the docs table shows, then what `tf-lso rule ID` prints), the
AST node types it looks at (`visits`), what it reports on them (`visit`,
and `finish` for what needs the whole file), and its rewrite if it has one
(`fix`). `@register` puts it in `RULES`, the one table that the checker
(`check.py`), the fixer (`fix.py`), the reports (`report.py`) and the
docs-table test read.

Standard library only, as the whole migration tool. Typed: `RULES`,
`Rule` and `Context` are the interface a rule module is written against.
"""

from __future__ import annotations

import ast
import collections
import inspect
import re
import textwrap
import types
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Set
from typing import TYPE_CHECKING
from typing import Any
from typing import Callable
from typing import TypeVar

from tf_lso_migration import legacy_names

if TYPE_CHECKING:
    import libcst

SEVERITIES = ("info", "warning", "error")
ROUTES = legacy_names.ROUTES


class SkipChildren:
    """What `Rule.visit` returns to keep a node's children from every rule.

    For a node that the rule has reported whole (a legacy dotted name), so
    that no part of it is reported again.
    """


class Rule:
    """One thing `python -m tf_lso check` looks for. Subclass and register.

    A subclass's docstring is its documentation: its first paragraph is the
    `summary` (the rule's row in the docs table of rules), the paragraphs
    after it the `explanation` (why, and what to write instead), which
    `tf-lso rule ID` and SARIF's rule help show wherever the tool runs.

    Attributes:
        id: The rule id (`--select`, `# tf-lso: ignore[id]`, reports).
        severity: One of `SEVERITIES`.
        routes: The `ROUTES` on which what it finds holds; on the others
            it is not run.
        section: The heading in docs/migration.md that explains it.
        visits: The `ast` node classes whose nodes `visit` is called with.
        mentions: Words of which a file's text holds one wherever the rule
            can find something; in another file it is not run (a cheap
            test first). Empty: run on every file.
    """

    # Declared, not set: a subclass sets them (`register` checks it did).
    id: str
    severity: str
    section: str
    routes: tuple[str, ...] = ROUTES
    visits: tuple[type[ast.AST], ...] = ()
    mentions: tuple[str, ...] = ()

    def _doc_paragraphs(self) -> list[str]:
        doc = inspect.cleandoc(type(self).__dict__.get("__doc__") or "")
        return [p for p in doc.split("\n\n") if p.strip()]

    @property
    def summary(self) -> str | None:
        """The docstring's first paragraph on one line (the docs row)."""
        paragraphs = self._doc_paragraphs()
        return " ".join(paragraphs[0].split()) if paragraphs else None

    @property
    def explanation(self) -> str:
        """The docstring after its first paragraph (may be empty)."""
        return "\n\n".join(self._doc_paragraphs()[1:])

    @property
    def documentation(self) -> str:
        """The rule's documentation: what `tf-lso rule ID` prints."""
        noun = "route" if len(self.routes) == 1 else "routes"
        fix = ("`--fix` rewrites what it finds, where it can." if self.fixes
               else "`--fix` leaves what it finds to you.")
        return "\n\n".join(filter(None, (
            f"{self.id} ({self.severity}; {noun}: {', '.join(self.routes)})",
            textwrap.fill(f"Finds {self.summary}.", 72),
            self.explanation,
            textwrap.fill(f"{fix} More in tf_lso's migration guide "
                          f"(docs/migration.md in its repository), section "
                          f"\"{self.section}\".", 72),
        )))

    def visit(self, node: ast.AST,
              context: Context) -> type[SkipChildren] | None:
        """Reports what the rule finds at `node` (`context.report`).

        Called once per node of a class in `visits`, in source order; a
        rule sees every such node, also those another rule reported.

        Returns:
            None, or `SkipChildren` to keep the node's children from
            every rule.
        """
        del node, context
        return None

    def finish(self, context: Context) -> None:
        """Reports what needs the whole file; called after every `visit`."""
        del context

    #: Whether the rule rewrites what it finds (`fix`); its findings are
    #: then `fixable` unless it says otherwise.
    fixes: bool = False

    def fix(self, module: libcst.Module, tree: ast.Module,
            cst: types.ModuleType, lines: Set[int],
            route: str) -> libcst.Module:
        """Rewrites a LibCST `module` (parsed from the same code as `tree`).

        Only what the rule reports, as `check` reports it: a rewrite must
        change nothing outside `lines`.

        Args:
            module: The LibCST module.
            tree: Its `ast` tree.
            cst: The `libcst` module.
            lines: The lines (1-based) where the rule's fixable findings
                start that `check` reports with the options given
                (suppression comments, `--select`/`--ignore`); never empty.
            route: The route (`ROUTES`) the code base is on.

        Returns:
            The new module; the same one if there is nothing to change.
        """
        del tree, cst, lines, route
        return module


class AttributeRule(Rule):
    """A rule that reports every use of an attribute `attribute`.

    Attributes:
        attribute: The attribute's name.
        message: What the finding says.
    """

    attribute: str
    message: str
    visits = (ast.Attribute,)

    def visit(self, node: ast.AST,
              context: Context) -> type[SkipChildren] | None:
        if isinstance(node, ast.Attribute) and node.attr == self.attribute:
            context.report(node, self.id, self.message)
        return None


# The table: rule id -> rule instance. `rules/` fills it on import.
RULES: dict[str, Rule] = {}

_RuleClass = TypeVar("_RuleClass", bound="type[Rule]")


def register(rule_class: _RuleClass) -> _RuleClass:
    """Class decorator: adds an instance of `rule_class` to `RULES`.

    Raises:
        ValueError: If its id is taken, or a required attribute is missing
            or not one of the allowed values.
    """
    rule = rule_class()
    missing = [name for name in ("id", "severity", "section", "summary")
               if not isinstance(getattr(rule, name, None), str)]
    if getattr(rule, "severity", None) not in SEVERITIES:
        missing.append("severity")
    if not rule.routes or not set(rule.routes) <= set(ROUTES):
        missing.append("routes")
    if missing:
        raise ValueError(
            f"{rule_class.__name__} needs the string attributes id, "
            f"severity (one of {SEVERITIES}), section and summary, and "
            f"routes (some of {ROUTES}). Missing or invalid: "
            f"{sorted(set(missing))}.")
    if rule.id in RULES:
        raise ValueError(f"A rule with id {rule.id!r} is registered already.")
    RULES[rule.id] = rule
    return rule_class


def unregister(rule_id: str) -> None:
    """Undoes `register` (for tests)."""
    del RULES[rule_id]


def anchor(heading: str) -> str:
    """GitHub's anchor for a markdown heading.

    >>> anchor("Old call → new call")
    'old-call--new-call'
    """
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


# What statements are in: statements, `except` and `case` clauses.
_HOLD_STATEMENTS: tuple[type[ast.AST], ...] = (
    ast.stmt, ast.excepthandler, *(
        [ast.match_case] if hasattr(ast, "match_case") else []))


def statements(tree: ast.AST) -> Iterator[ast.AST]:
    """The statements in `tree` (and `except` and `case` clauses), in the
    order `ast.walk` gives them; not the expressions, which hold none."""
    pending = collections.deque([tree])
    while pending:
        node = pending.popleft()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _HOLD_STATEMENTS):
                pending.append(child)
                yield child


def imported_names(tree: ast.AST,
                   nodes: Iterable[ast.AST] | None = None) -> dict[str, str]:
    """Local name -> canonical dotted name, for every import in `tree`.

    `nodes`: `statements(tree)` (or every node), if the caller has them.
    """
    names: dict[str, str] = {}
    for node in nodes or ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = legacy_names.canonical(alias.name)
                else:
                    top = alias.name.split(".")[0]
                    names[top] = legacy_names.canonical(top)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            module = legacy_names.canonical(node.module)
            for alias in node.names:
                if alias.name != "*":
                    names[alias.asname or alias.name] = f"{module}.{alias.name}"
    return names


def dotted(node: ast.AST,
           names: Mapping[str, str]) -> tuple[str, str] | None:
    """The canonical dotted name an expression spells, and its base's, or None.

    `tf.keras.mixed_precision.experimental.Policy` with `tf` imported gives
    `("tf.keras.mixed_precision.experimental.Policy", "tf")`.
    """
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in names:
        return None
    base = names[node.id]
    return ".".join([base] + parts[::-1]), base


def unprovided_aliases(tree: ast.AST, names: Mapping[str, str],
                       nodes: Iterable[ast.AST] | None = None) -> set[str]:
    """Local names of legacy modules that something unprovided is used through.

    `mp.Bogus` with `mp` a legacy module and no tf_lso `Bogus`: rewriting
    the import of `mp` to tf_lso's module would break `mp.Bogus` (or change
    its error), so `--fix` leaves such an import, and `check` says why.

    Args:
        tree: The parsed module.
        names: `imported_names(tree)`.
        nodes: `list(ast.walk(tree))`, if the caller has it already.

    Returns:
        A set of local names.
    """
    found: set[str] = set()
    for node in nodes or ast.walk(tree):
        if not (isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)):
            continue
        base = names.get(node.value.id)
        if (base in legacy_names.LEGACY_MODULES
                and legacy_names.replacement(f"{base}.{node.attr}") is None):
            found.add(node.value.id)
    return found


#: How a `Context` hands on a finding: (node, rule id, message, fixable,
#: severity or "" for the rule's).
Report = Callable[[ast.AST, str, str, bool, str], None]


class Context:
    """What a rule sees of the file being checked.

    Attributes:
        names: Local name -> canonical dotted name: the imports, and
            assignments of such names seen so far in the walk.
        tree: The parsed file (`ast.Module`).
        classes: Class name -> `ast.ClassDef`, for every class in the file.
        unprovided: `unprovided_aliases` of the file.
        notes: Per-rule state for the file: `notes[rule.id]` is a dict.
        route: The route (`ROUTES`) the code base is on.
        fixes: Whether `--fix` rewrites the file (a notebook it does not):
            if not, no finding is fixable.
    """

    def __init__(self, tree: ast.Module, report: Report,
                 route: str = ROUTES[0],
                 line_name: Callable[[int], str] | None = None,
                 source: str | None = None, fixes: bool = True) -> None:
        nodes = list(statements(tree))  # Imports and classes are statements.
        names = imported_names(tree, nodes)
        self.tree = tree
        self.names = dict(names)
        self.classes = {node.name: node for node in nodes
                        if isinstance(node, ast.ClassDef)}
        self.unprovided = unprovided_aliases(tree, names) if any(
            base in legacy_names.LEGACY_MODULES for base in names.values()
        ) else set()
        self.notes: collections.defaultdict[str, dict[str, Any]] = (
            collections.defaultdict(dict))
        self.route = route
        self.fixes = fixes
        self._report = report
        self._line_name = line_name
        self._source = source

    def mentions(self, *words: str) -> bool:
        """Whether the file's text holds any of `words` (True for none, or
        where the text is not known): `Rule.mentions`' test."""
        if self._source is None or not words:
            return True
        return any(word in self._source for word in words)

    def line(self, number: int) -> str:
        """How a message names line `number` of the file: "line 5", or in
        a notebook "line 2 of cell 1"."""
        if self._line_name is None:
            return f"line {number}"
        return self._line_name(number)

    def report(self, node: ast.AST, rule_id: str, message: str,
               fixable: bool | None = None, severity: str = "") -> None:
        """Reports a finding of rule `rule_id` at `node`.

        Args:
            node: Where (its line and column).
            rule_id: The rule's id.
            message: What was found and what to do.
            fixable: Whether `--fix` rewrites it; default: whether the rule
                has a fix.
            severity: This finding's (one of `SEVERITIES`), where it is not
                the rule's.
        """
        if fixable is None:
            fixable = RULES[rule_id].fixes
        self._report(node, rule_id, message, fixable and self.fixes,
                     severity)

    def resolve(self, node: ast.AST) -> tuple[str, str] | None:
        """`dotted(node, self.names)`."""
        return dotted(node, self.names)
