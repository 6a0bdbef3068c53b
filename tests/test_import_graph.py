"""The package's import graph, read from the source: no cycles, and no layer imports one above it.

Layers, bottom to top: base (settings, hashing, errors, CPU facts) < store < search (spaces and strategies, which
know records but nothing of building or timing) < compile < tune < kernels <
the public surface (the package itself, cli, doctor, the cpp/python façades). Imports inside functions
count too: a lazy import that goes upward is still a dependency the lower layer cannot stand without.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import tuneforge

PACKAGE = Path(tuneforge.__file__).parent
LAYERS = ("base", "store", "search", "compile", "tune", "kernels", "surface")
PACKAGES = ("store", "search", "compile", "tune", "kernels")
BASE = {"_version", "dataclass_lite", "errors", "forksafe", "parsing", "settings_schema", "config", "config_values",
        "hashing", "cpuinfo", "warn_once", "supervisor"}


def module_name(path: Path) -> str:
    parts = ["tuneforge", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 2 and parts[1] in PACKAGES:
        return parts[1]
    if len(parts) == 2 and parts[1] in PACKAGES:
        return parts[1]  # the sub-package's own __init__
    if len(parts) == 2 and parts[1] in BASE:
        return "base"
    return "surface"


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported(path: Path, known: set[str]) -> Iterator[tuple[str, int]]:
    """(module, line) of every tuneforge module `path` imports, at any depth of its code."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tuneforge"):
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            if not base.startswith("tuneforge"):
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield (full if full in known else base), node.lineno


def graph() -> dict[str, dict[str, int]]:
    found = modules()
    edges: dict[str, dict[str, int]] = {}
    for name, path in found.items():
        targets = edges.setdefault(name, {})
        for target, line in imported(path, set(found)):
            if target in found and target != name:
                targets.setdefault(target, line)
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def test_the_package_has_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    upward = []
    for module, targets in graph().items():
        mine = LAYERS.index(layer_of(module))
        for target, line in targets.items():
            if LAYERS.index(layer_of(target)) > mine:
                upward.append(f"{module}:{line} imports {target} ({layer_of(module)} -> {layer_of(target)})")
    assert upward == []


@pytest.mark.parametrize("edges, expected", [
    ({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}, [["a", "b", "c"]]),
    ({"a": {"b": 1}, "b": {}, "c": {"c": 1}}, []),
    ({"a": {"b": 1}, "b": {"a": 1}, "c": {"d": 1}, "d": {"c": 1}}, [["a", "b"], ["c", "d"]]),
])
def test_cycle_finder_finds_what_it_should(edges: dict[str, dict[str, int]], expected: list[list[str]]) -> None:
    assert sorted(cycles(edges)) == expected


def test_layers_are_read_from_the_source() -> None:
    edges = graph()
    assert "tuneforge.store.artifacts" in edges["tuneforge.store.default"]
    assert layer_of("tuneforge.store.records") == "store" and layer_of("tuneforge.config") == "base"
    assert layer_of("tuneforge.cli") == "surface" and layer_of("tuneforge.kernels.gemm.op") == "kernels"


def private_imports(path: Path) -> list[str]:
    """`from tuneforge.x import _name` in the module at `path`: another module's underscore names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{node.module}.{alias.name} (line {node.lineno})" for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tuneforge")
            for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]


def test_no_module_imports_another_modules_private_names() -> None:
    found = {name: hits for name, path in modules().items() if (hits := private_imports(path))}
    assert found == {}, "make these public (no leading underscore) or keep them in their module"


def test_private_imports_are_found(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from tuneforge.compile.cpp import _hidden, public\nfrom os import _exit\n")
    assert private_imports(module) == ["tuneforge.compile.cpp._hidden (line 1)"]
