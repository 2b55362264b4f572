"""The packages' import graph, read from the source (no imports run): no cycles, and the layers point one way.

Every import counts, at module level, inside functions and under `if TYPE_CHECKING:`: an import moved into a function
to dodge a cycle is still a cycle, only one that fails later, at the first call, and a type that two modules need from
each other belongs in a module below both.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("model", "voice", "web")
# What each package may import of the others (voice/ never imports web/; model/ neither of them).
ALLOWED = {"model": {"model"}, "voice": {"model", "voice"}, "web": {"model", "voice", "web"}}
MAX_FLAT_MODULES = 8


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (a `from package import module` names the module)."""
    modules = source_modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in
                node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_reader_finds_a_cycle_hidden_in_a_function() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    inside = ast.parse("def f():\n    import x\nif TYPE_CHECKING:\n    import y\n")
    assert sorted(alias.name for node in _imports(inside) for alias in node.names) == ["x", "y"]


def test_no_import_cycles_in_model_voice_and_web() -> None:
    assert cycles(import_graph()) == []


def package_of(module: str) -> str:
    """The unit a package-level cycle is counted between: a sub-package (`model.chat`), or a flat module of a top
    package (`model.errors`), which is a layer of its own."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Package -> the packages its modules import: a cycle here runs through different modules (chat.loading imports
    bundled, bundled imports chat.engine) and so hides from the module graph."""
    packages: dict[str, set[str]] = {package_of(name): set() for name in graph}
    for name, targets in graph.items():
        packages[package_of(name)] |= {package_of(target) for target in targets} - {package_of(name)}
    return packages


def test_a_package_cycle_through_different_modules_is_found() -> None:
    modules = {"model.chat.loading": {"model.bundled.default"}, "model.bundled.default": {"model.chat.engine"},
               "model.chat.engine": set(), "model.errors": set()}
    assert cycles(modules) == []  # no module imports itself back
    assert cycles(package_graph(modules)) == [["model.bundled", "model.chat"]]


def test_no_import_cycles_between_packages() -> None:
    assert cycles(package_graph(import_graph())) == []


def test_each_package_imports_only_the_layers_below_it() -> None:
    wrong = [
        f"{name} imports {target}"
        for name, targets in import_graph().items()
        for target in targets
        if target.split(".")[0] not in ALLOWED[name.split(".")[0]]
    ]
    assert wrong == []


def test_at_most_eight_modules_flat_at_the_top_of_model_and_voice() -> None:
    for package in ("model", "voice"):
        flat = sorted(path.name for path in (ROOT / package).glob("*.py") if path.name != "__init__.py")
        assert len(flat) <= MAX_FLAT_MODULES, f"{package}/: {flat}"


def test_no_part_of_voice_below_the_run_modes_imports_them() -> None:
    """voice/modes/ drives a session from the command line: a stage or the session importing it points a layer up."""
    wrong = [
        f"{name} imports {target}"
        for name, targets in import_graph().items()
        if name.split(".")[0] == "voice" and name.split(".")[:2] != ["voice", "modes"]
        for target in targets
        if target.split(".")[:2] == ["voice", "modes"]
    ]
    assert wrong == []
