"""The package's shape: no import cycle, and no package reaches into another's private names.

Function-local imports count (they hid cycles before), imports under ``if TYPE_CHECKING:`` do not.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "hfx"


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[ast.ImportFrom | ast.Import]:
    found: list[ast.ImportFrom | ast.Import] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            walk(child)

    walk(tree)
    return found


def _modules() -> dict[str, ast.AST]:
    return {_module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(ROOT.rglob("*.py"))}


MODULES = _modules()


def _target(module: str, node: ast.ImportFrom | ast.Import) -> list[tuple[str, str | None]]:
    """``(imported module, imported name or None)`` for each hfx name an import statement binds."""
    if isinstance(node, ast.Import):
        return [(alias.name, None) for alias in node.names if alias.name.startswith("hfx")]
    if node.level:  # relative imports are not used in hfx; resolve them anyway
        base = module.split(".")[: -node.level] if not MODULES.get(module + ".__init__") else module.split(".")
        source = ".".join([*base, node.module] if node.module else base)
    else:
        source = node.module or ""
    if not source.startswith("hfx"):
        return []
    return [(f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source, a.name) for a in node.names]


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in MODULES}
    for module, tree in MODULES.items():
        for node in _imports(tree):
            for target, _ in _target(module, node):
                if target in MODULES and target != module:
                    graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _package(module: str) -> str:
    """The package a module belongs to: ``hfx.backends`` for ``hfx.backends._onnx``, ``hfx`` for ``hfx._verify``."""
    is_package = module + ".__init__" in MODULES or (ROOT.parent / module.replace(".", "/") / "__init__.py").exists()
    return module if is_package else module.rpartition(".")[0]


def private_imports() -> list[str]:
    """``module: from X import _name`` for every private name taken from another package."""
    found = []
    for module, tree in MODULES.items():
        for node in _imports(tree):
            for target, name in _target(module, node):
                if name is None or not name.startswith("_") or name.startswith("__"):
                    continue
                if f"{target}" in MODULES and target.endswith("." + name):
                    continue  # importing a private submodule itself: `from hfx.patches import _core` is a module
                if _package(target) != _package(module):
                    found.append(f"{module}: from {target} import {name}")
    return found


def test_hfx_has_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


def test_no_package_imports_another_packages_private_names() -> None:
    assert private_imports() == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize("source", ["from hfx._capture.decompose import _tower", "import hfx._lift"])
def test_imports_are_found_in_functions(source: str) -> None:
    tree = ast.parse(f"def f():\n    {source}\n")
    assert len(_imports(tree)) == 1


def test_type_checking_imports_are_not_edges() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hfx._records import IoSpec\n")
    assert [type(n).__name__ for n in _imports(tree)] == ["ImportFrom"]  # only the typing import
