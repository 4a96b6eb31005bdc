"""processors/core imports no kafka, faust, torch or aiokafka, and reads no clock."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[3] / "processors" / "core"
FORBIDDEN = {"kafka", "faust", "torch", "aiokafka", "mode", "confluent_kafka"}
CLOCK_CALLS = {"time", "monotonic", "perf_counter", "time_ns", "monotonic_ns", "now", "utcnow"}


def _modules(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


FILES = sorted(CORE.glob("**/*.py"))


def test_core_files_found() -> None:
    assert len(FILES) > 10


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_forbidden_imports(path: Path) -> None:
    imported = _modules(ast.parse(path.read_text()))
    assert not imported & FORBIDDEN, f"{path.name} imports {imported & FORBIDDEN}"
    assert "time" not in imported and "datetime" not in imported, f"{path.name} reads a clock"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_clock_calls(path: Path) -> None:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in CLOCK_CALLS:
            base = node.value
            assert not (isinstance(base, ast.Name) and base.id in {"time", "datetime"}), (
                f"{path.name} calls {base.id}.{node.attr}"
            )
