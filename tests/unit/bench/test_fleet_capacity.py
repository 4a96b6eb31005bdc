"""`bench/fleet.py`'s capacity under load: a rate is kept up with by the rounds' oldest records."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from .conftest import BENCH

_spec = importlib.util.spec_from_file_location("bench_fleet", BENCH / "fleet.py")
assert _spec is not None and _spec.loader is not None
bench_fleet = importlib.util.module_from_spec(_spec)  # not `fleet`: a name of its own
sys.modules[_spec.name] = bench_fleet  # its dataclasses look their module up there
_spec.loader.exec_module(bench_fleet)


def _log(path: Path, *lines: tuple[float, float | None]) -> Path:
    """A worker's log of stats lines ``(t, oldest record's age in ms or None: no round)``."""
    path.write_text(
        "".join(
            "2026-12-04 02:19:01,724 INFO x: batch path stats: "
            + json.dumps({"t": t} if age is None else {"t": t, "age_ms": {"n": 3, "max": age}})
            + "\n"
            for t, age in lines
        )
    )
    return path


def test_the_window_takes_the_oldest_record_of_either_worker_inside_it(tmp_path: Path) -> None:
    a = _log(tmp_path / "a.log", (99.5, 9_000.0), (100.5, 120.0), (101.5, 240.0), (102.5, 5e4))
    b = _log(tmp_path / "b.log", (100.7, 1_300.0), (101.2, None))
    assert bench_fleet.window_age_max_ms([a, b], 100.0, 102.0) == 1_300.0
    assert bench_fleet.window_age_max_ms([a], 100.0, 102.0) == 240.0  # before and after: out


def test_a_window_without_rounds_has_no_age(tmp_path: Path) -> None:
    a = _log(tmp_path / "a.log", (100.5, None), (103.0, 80.0))
    assert bench_fleet.window_age_max_ms([a], 100.0, 102.0) is None
