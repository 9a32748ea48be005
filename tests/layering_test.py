"""The import structure of tf_lso: concept folders, one way, no circles.

The runtime (`tf_lso/_src/`) is a stack of concept folders; a module may
import its own folder and the folders below it, never one above:

    legacy_api -> optimizer -> inner -> scaling -> gradients -> compat

Within a folder, and across the whole package, imports form no circle
(imports inside functions count: they are circles too, only later). The
migration tool (`tf_lso/_migration/`) imports neither the runtime nor
TensorFlow; of the runtime, only `legacy_api` reads its table of legacy
names. Every file is read with `ast`, so nothing here imports the modules.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "tf_lso"
# Bottom first. A module's layer is its folder's (or its own name's).
LAYERS = ("compat", "gradients", "scaling", "inner", "optimizer",
          "legacy_api")
# Runtime modules outside the stack, and what they may import.
GATES = {"tf_lso._src.version_gate": {"tf_lso._src.compat"}}
THIRD_PARTY_RUNTIME = ("tensorflow", "keras", "tf_keras", "numpy")


def module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path):
    """Every module `path` imports (at the top or inside a function)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
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


def graph():
    """{tf_lso module: the tf_lso modules it imports}, plus third parties."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges = {}
    for name, path in modules.items():
        edges[name] = {
            target for target in imports_of(path)
            if (target in modules or target.split(".")[0] != "tf_lso")
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
            if target not in edges or not target.startswith("tf_lso"):
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
    edges = graph()
    for module, targets in edges.items():
        if not module.startswith("tf_lso._migration"):
            continue
        for target in targets:
            assert not target.startswith("tf_lso._src"), (module, target)
            assert target.split(".")[0] not in THIRD_PARTY_RUNTIME, (
                module, target)


def test_only_legacy_api_reads_the_migration_table():
    for module, targets in graph().items():
        if any(t.startswith("tf_lso._migration") for t in targets) and (
                module.startswith("tf_lso._src")):
            assert layer(module) == LAYERS.index("legacy_api"), module


def test_the_architecture_page_maps_every_module():
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    folder_map = page[page.index("## Folder map"):page.index("## What a")]
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).parts
        if path.name == "__init__.py" or "kinds" in parts or (
                "rules" in parts):
            continue  # Kinds and rules have tables of their own.
        assert path.name in folder_map, path
    for folder in ("gradients", "scaling", "inner", "kinds", "optimizer",
                   "legacy_api", "_migration", "rules"):
        assert f"{folder}/" in folder_map, folder
