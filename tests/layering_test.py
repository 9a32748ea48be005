"""The import structure of tf_lso: concept folders, one way, no circles.

The runtime (`tf_lso/_src/`) is a stack of concept folders; a module may
import its own folder and the folders below it, never one above:

    legacy_api -> optimizer -> inner -> scaling -> gradients -> compat

Within a folder, and across the whole package, imports form no circle
(imports inside functions count: they are circles too, only later). The
migration tool (the package `tf_lso_migration`, beside `tf_lso`) imports
neither tf_lso nor TensorFlow (one exception: `run` imports tf_lso to call
`tf_lso.install()`); of the runtime, only `legacy_api` reads its table of
legacy names. Every file is read with `ast`, so nothing here imports the
modules, except the one test that imports every migration module in a
fresh interpreter, to see what that imports.
"""

import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tf_lso"
MIGRATION = ROOT / "tf_lso_migration"
# Bottom first. A module's layer is its folder's (or its own name's).
LAYERS = ("compat", "gradients", "scaling", "inner", "optimizer",
          "legacy_api")
# Runtime modules outside the stack, and what they may import.
GATES = {"tf_lso._src.version_gate": {"tf_lso._src.compat"}}
THIRD_PARTY_RUNTIME = ("tensorflow", "keras", "tf_keras", "numpy")
# The migration tool's imports of tf_lso (and TensorFlow), each inside a
# function: `run` runs a script with `tf_lso.install()` in effect.
MIGRATION_RUNS_THE_RUNTIME = {("tf_lso_migration.cli", "tf_lso"),
                              ("tf_lso_migration.cli", "tensorflow")}


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path, top_level_only=False):
    """Every module `path` imports (at the top or inside a function).

    `top_level_only`: only the imports that run on importing the module
    (not those in a function or a class).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found = set()
    for node in _top_level(tree) if top_level_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) -
                                          node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.add(base)
            # `from package import module` imports the module.
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _top_level(tree):
    """The nodes of `tree` outside any function or class body."""
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                 ast.ClassDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))


def _ours(module):
    return module.split(".")[0] in ("tf_lso", "tf_lso_migration")


def graph(top_level_only=False):
    """{tf_lso or tf_lso_migration module: the modules of both it imports},
    plus third parties."""
    modules = {module_name(p): p
               for package in (PACKAGE, MIGRATION)
               for p in package.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        edges[name] = {
            target for target in imports_of(path, top_level_only)
            if (target in modules or not _ours(target))
            # A package is set up before its modules: importing it (or
            # a name from its __init__) is no dependency of theirs.
            and not (name == target or name.startswith(target + "."))
        }
    return edges


def layer(module):
    """The index in LAYERS of a runtime module, or None outside the stack."""
    parts = module.split(".")
    if parts[:2] != ["tf_lso", "_src"] or len(parts) < 3:
        return None
    return LAYERS.index(parts[2]) if parts[2] in LAYERS else None


def upward_imports(edges):
    """(importer, imported) pairs that point up the stack."""
    wrong = []
    for source, targets in edges.items():
        source_layer = layer(source)
        if source_layer is None:
            continue
        for target in targets:
            target_layer = layer(target)
            if target_layer is not None and target_layer > source_layer:
                wrong.append((source, target))
    return sorted(wrong)


def circles(edges):
    """Every import circle among tf_lso's modules, each as a list."""
    found, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for target in sorted(edges.get(node, ())):
            if target not in edges or not _ours(target):
                continue
            if state.get(target) == "open":
                found.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def test_the_checks_catch_what_they_are_for():
    bad = {
        "tf_lso._src.scaling.a": {"tf_lso._src.optimizer.b"},
        "tf_lso._src.optimizer.b": {"tf_lso._src.scaling.a"},
    }
    assert upward_imports(bad) == [
        ("tf_lso._src.scaling.a", "tf_lso._src.optimizer.b")]
    assert circles(bad) == [["tf_lso._src.optimizer.b",
                             "tf_lso._src.scaling.a",
                             "tf_lso._src.optimizer.b"]]
    assert not circles({"tf_lso.a": {"tf_lso.b"}, "tf_lso.b": set()})


def test_every_runtime_module_is_in_a_layer():
    outside = [m for m in graph() if m.startswith("tf_lso._src.")
               and layer(m) is None and m not in GATES]
    assert not outside, (
        f"{outside}: put each in a folder of {LAYERS}, or add it to GATES.")


def test_imports_point_down_the_stack():
    assert upward_imports(graph()) == []


def test_no_import_circles():
    assert circles(graph()) == []


@pytest.mark.parametrize("gate", sorted(GATES))
def test_gates_import_only_what_they_check_with(gate):
    ours = {t for t in graph()[gate] if t.startswith("tf_lso")}
    assert ours <= GATES[gate]


def test_the_migration_tool_imports_no_runtime():
    edges, on_import = graph(), graph(top_level_only=True)
    migration = [m for m in edges if m.split(".")[0] == "tf_lso_migration"]
    assert "tf_lso_migration.check" in migration  # The walk found them.
    for module in migration:
        for target in edges[module]:
            top = target.split(".")[0]
            if (module, target) in MIGRATION_RUNS_THE_RUNTIME:
                assert target not in on_import[module], (module, target)
                continue
            assert top != "tf_lso", (module, target)
            assert top not in THIRD_PARTY_RUNTIME, (module, target)


def test_only_legacy_api_reads_the_migration_table():
    for module, targets in graph().items():
        if not module.startswith("tf_lso._src"):
            continue
        read = {t for t in targets if t.split(".")[0] == "tf_lso_migration"}
        if read:
            assert layer(module) == LAYERS.index("legacy_api"), module
            assert read <= {"tf_lso_migration",
                            "tf_lso_migration.legacy_names"}, (module, read)


# Imports every module of the migration tool, found by walking the package,
# and prints which of these the imports brought in.
_IMPORT_EVERY_MIGRATION_MODULE = textwrap.dedent("""\
    import importlib
    import pkgutil
    import sys

    import tf_lso_migration

    names = ["tf_lso_migration"] + [
        info.name for info in pkgutil.walk_packages(
            tf_lso_migration.__path__, "tf_lso_migration.")]
    for name in names:
        importlib.import_module(name)
    print(len(names), sorted(
        m for m in ("tensorflow", "keras", "tf_keras", "tf_lso")
        if m in sys.modules))
""")


def test_importing_the_migration_tool_imports_no_tensorflow():
    # By construction, not by how the interpreter was started: in a fresh
    # interpreter where TensorFlow (when the environment has it) could be
    # imported, importing each migration module brings in none of these.
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_EVERY_MIGRATION_MODULE],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    count, imported = done.stdout.split(" ", 1)
    # Every module, packages included: the walk missed none.
    assert int(count) == len(list(MIGRATION.rglob("*.py")))
    assert imported.strip() == "[]", done.stdout


def test_the_architecture_page_maps_every_module():
    page = (ROOT / "docs" / "architecture.md").read_text()
    folder_map = page[page.index("## Folder map"):page.index("## What a")]
    for path in [*PACKAGE.rglob("*.py"), *MIGRATION.rglob("*.py")]:
        parts = path.relative_to(ROOT).parts
        if path.name == "__init__.py" or "kinds" in parts or (
                "rules" in parts):
            continue  # Kinds and rules have tables of their own.
        assert path.name in folder_map, path
    for folder in ("gradients", "scaling", "inner", "kinds", "optimizer",
                   "legacy_api", "tf_lso_migration", "rules"):
        assert f"{folder}/" in folder_map, folder


def _private(name):
    return name.startswith("_") and not (
        name.startswith("__") and name.endswith("__"))


# TensorFlow's and Keras's own protocol: tf_lso's classes implement these
# methods (TensorFlow calls them on any trackable), so a call of one on
# another object is TensorFlow's seam, not one between tf_lso's modules.
TF_PROTOCOL = frozenset({
    "_trackable_children", "_lookup_dependency", "_deferred_dependencies",
    "_create_or_restore_slot_variable", "_serialize_to_tensors",
    "_restore_from_tensors", "_create_all_weights",
})


def private_seams(sources):
    """Uses of a private name that another module defines.

    `sources` maps module names to their source. A name is private if it
    starts with one underscore; a module "defines" the names it binds (def,
    class, assignment, an attribute assigned through `self` or `cls`). A use
    is a `from ... import`, an attribute read or written on anything but
    `self` or `cls`, or a string literal passed to `getattr`, `hasattr`,
    `setattr` or `delattr`: a class's own and inherited members, through
    `self`, are the class's business, not a seam between modules. Names
    are matched by spelling: a module's use of a name it defines itself is
    taken as its own. A private name that no module of ours defines
    belongs to TensorFlow or Keras, which compat.py alone reaches (see its
    tests); so do the `TF_PROTOCOL` methods.

    Returns:
        Sorted `(module, name, defining modules)` triples.
    """
    def through_self(node):
        return (isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls"))

    defined, used = {}, {}
    for module, source in sources.items():
        defined[module], used[module] = set(), set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                 ast.ClassDef)):
                defined[module].add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx,
                                                           ast.Store):
                defined[module].add(node.id)
            elif isinstance(node, ast.Attribute):
                if through_self(node):
                    if isinstance(node.ctx, ast.Store):
                        defined[module].add(node.attr)
                else:
                    used[module].add(node.attr)
            elif isinstance(node, ast.ImportFrom):
                used[module].update(alias.name for alias in node.names)
            elif (isinstance(node, ast.Call)
                  and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "hasattr", "setattr",
                                       "delattr")
                  and len(node.args) > 1
                  and isinstance(node.args[1], ast.Constant)
                  and isinstance(node.args[1].value, str)
                  and not (isinstance(node.args[0], ast.Name)
                           and node.args[0].id in ("self", "cls"))):
                used[module].add(node.args[1].value)
    found = []
    for module, names in used.items():
        for name in sorted(filter(_private, names - TF_PROTOCOL)):
            if name in defined[module]:
                continue
            owners = sorted(m for m in defined if name in defined[m])
            if owners:
                found.append((module, name, tuple(owners)))
    return sorted(found)


def test_the_private_seam_check_catches_a_private_seam():
    sources = {
        "a": "def _helper(): pass\nclass A:\n    def _own(self): pass\n",
        "b": "import a\na._helper()\n",
        "c": "from a import _helper\n",
        "d": "class D(A):\n    def f(self):\n        return self._own()\n",
        "e": "def f(x):\n    return x._keras_private\n",
        # Through a string; written on another object.
        "f": "def f(x):\n    return getattr(x, '_own')\n",
        "g": "def f(x):\n    x._own = 1\n",
        # TensorFlow's protocol methods are TensorFlow's.
        "i": "class I:\n    def _trackable_children(self): pass\n",
        "j": "def f(x):\n    return x._trackable_children()\n",
    }
    assert private_seams(sources) == [
        ("b", "_helper", ("a",)), ("c", "_helper", ("a",)),
        ("f", "_own", ("a",)), ("g", "_own", ("a",))]


def test_no_module_of_the_runtime_uses_another_ones_private_names():
    # compat.py calls TensorFlow's and Keras's private APIs, some of which
    # share a name with the Trackable methods tf_lso's classes implement
    # (`_trackable_children`, ...): those are TensorFlow's, not seams.
    sources = {module_name(path): path.read_text()
               for path in (PACKAGE / "_src").rglob("*.py")
               if path.name != "compat.py"}
    assert private_seams(sources) == []
