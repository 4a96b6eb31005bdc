"""The broker package's modules import one another one way, and only public names.

Read from the code with `ast`, like tests/unit/test_layering.py: every import of a
``runwatch.broker`` module by another (at module level, in a function, or under
``TYPE_CHECKING``) is an edge; the graph has no cycle, and no imported name starts with
an underscore.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "runwatch" / "broker"


def _imports(path: Path) -> list[tuple[str, str, int]]:
    """(module, name, line) for every ``from runwatch.broker.X import name`` in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("runwatch.broker."):
                module = node.module.removeprefix("runwatch.broker.")
                out += [(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("runwatch.broker."):
                    out.append((alias.name.removeprefix("runwatch.broker."), "*", node.lineno))
    return out


def _graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    return {m: {dep for dep, _, _ in _imports(PACKAGE / f"{m}.py")} & modules for m in modules}


def test_the_package_has_modules() -> None:
    assert {"config", "lifecycle", "cluster", "process", "locate"} <= set(_graph())


def test_imports_between_modules_go_one_way() -> None:
    graph = _graph()
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        if module in path:
            cycle = " -> ".join((*path[path.index(module) :], module))
            pytest.fail(f"import cycle in runwatch.broker: {cycle}")
        if module in done:
            return
        for dep in sorted(graph[module]):
            visit(dep, (*path, module))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_no_private_name_crosses_a_file(path: Path) -> None:
    crossing = [
        f"{path.name}:{line}: {module}.{name}"
        for module, name, line in _imports(path)
        if name.startswith("_") or any(part.startswith("_") for part in module.split("."))
    ]
    assert not crossing, crossing


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_no_private_attribute_of_another_object_is_used(path: Path) -> None:
    """``other._name`` (not ``self._name``): a private method called from outside its class."""
    used = [
        f"{path.name}:{node.lineno}: .{node.attr}"
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    ]
    assert not used, used
