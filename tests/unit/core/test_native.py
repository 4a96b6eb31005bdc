"""The compiled and the pure copies of the core's kernels: same outputs, and the switch.

`processors.core.native` picks, per compiled module, the mypyc build or the pure source.
These tests run `tests.unit.core.native_verdicts` in two fresh interpreters, one with
``RUNWATCH_PURE_PYTHON=1``, and require the same bytes from both; where ``make compiled`` has
built the kernels (``make venv`` does) the default run is the compiled one, so the comparison
is compiled against pure. The selection rules are checked on a scratch folder.
"""

from __future__ import annotations

import ast
import json
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from runwatch.common.settings import CoreSettings
from runwatch.processors.core import native
from tests.unit.core.interpreter import run_python

ROOT = Path(__file__).resolve().parents[3]


def run_verdicts(pure: bool) -> tuple[dict[str, str], list[str]]:
    env = {"RUNWATCH_PURE_PYTHON": "1" if pure else "0"}
    out = run_python(["-m", "tests.unit.core.native_verdicts"], env).splitlines()
    return json.loads(out[0]), out[1:]


def test_compiled_and_pure_copies_give_the_same_bytes() -> None:
    default_active, default_lines = run_verdicts(pure=False)
    pure_active, pure_lines = run_verdicts(pure=True)
    assert set(pure_active) == set(native.COMPILED_MODULES)
    assert all(state.startswith("pure (RUNWATCH_PURE_PYTHON=1") for state in pure_active.values())
    expected = {
        stem: "compiled" if native.pure_reason(stem, False) is None else "pure"
        for stem in native.COMPILED_MODULES
    }
    assert {stem: state.split(" ")[0] for stem, state in default_active.items()} == expected
    assert any(line.startswith("verdict ") for line in pure_lines)  # the curves do alarm
    assert any(line.startswith("loose ") and " [] " not in line for line in pure_lines)
    assert default_lines == pure_lines


def make_folder(tmp_path: Path, source: str, compiled: bool, digest_of: str | None) -> Path:
    (tmp_path / "window.py").write_text(source)
    if compiled:
        (tmp_path / f"window{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    if digest_of is not None:
        digest = native.source_digest(tmp_path / "window.py") if digest_of == source else "0" * 64
        (tmp_path / native.MANIFEST).write_text(json.dumps({"window": digest}))
    return tmp_path


def test_rule_1_the_switch_forces_the_pure_source(tmp_path: Path) -> None:
    folder = make_folder(tmp_path, "x = 1\n", compiled=True, digest_of="x = 1\n")
    assert native.pure_reason("window", True, folder) == "RUNWATCH_PURE_PYTHON=1"
    assert native.pure_reason("window", False, folder) is None  # rule 4


def test_rule_2_no_compiled_copy_runs_pure(tmp_path: Path) -> None:
    folder = make_folder(tmp_path, "x = 1\n", compiled=False, digest_of="x = 1\n")
    assert native.pure_reason("window", False, folder) == "not compiled"


@pytest.mark.parametrize("manifest", ["other source", None])
def test_rule_3_a_source_edited_since_the_build_runs_pure(
    tmp_path: Path, manifest: str | None
) -> None:
    folder = make_folder(tmp_path, "x = 2\n", compiled=True, digest_of=manifest)
    reason = native.pure_reason("window", False, folder)
    assert reason is not None and reason.startswith("stale: window.py changed")


def test_rule_3_an_edit_to_another_module_of_the_group_sends_it_to_its_source_too(
    tmp_path: Path,
) -> None:
    """The group's modules call each other's compiled copies: one stale, all pure."""
    folder = make_folder(tmp_path, "x = 1\n", compiled=True, digest_of="x = 1\n")
    other = native.COMPILED_MODULES[1]
    (folder / f"{other}.py").write_text("y = 1\n")
    digests = json.loads((folder / native.MANIFEST).read_text())
    (folder / native.MANIFEST).write_text(json.dumps(digests | {other: "0" * 64}))
    reason = native.pure_reason("window", False, folder)
    assert reason == f"stale: {other}.py, compiled with it, changed since (run `make compiled`)"
    digests[other] = native.source_digest(folder / f"{other}.py")
    (folder / native.MANIFEST).write_text(json.dumps(digests))
    assert native.pure_reason("window", False, folder) is None


def test_the_switch_reads_only_1() -> None:
    assert CoreSettings.from_env({"RUNWATCH_PURE_PYTHON": "1"}).pure_python
    assert not CoreSettings.from_env({"RUNWATCH_PURE_PYTHON": "0"}).pure_python
    assert not CoreSettings.from_env({}).pure_python


def test_the_package_says_which_copy_runs() -> None:
    import runwatch.processors.core as core

    every = all(state == "compiled" for state in native.ACTIVE.values())
    assert every == core.COMPILED


@pytest.mark.parametrize("stem", native.COMPILED_MODULES)
def test_no_compiled_module_defines_a_class_with_class_keywords(stem: str) -> None:
    """mypyc drops a class's keywords (a Struct's ``frozen=True``, ``tag``, ``gc=False``)
    without a word, so a compiled module must define none: its structs live elsewhere."""
    tree = ast.parse((ROOT / "runwatch/processors/core" / f"{stem}.py").read_text())
    keyworded = [
        f"{node.name} (line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.keywords
    ]
    assert keyworded == []
