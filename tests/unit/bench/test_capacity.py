"""`bench/capacity.py`: a rate is kept up with by the rounds' oldest records; the search."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import load_script

capacity = load_script("capacity")


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
    assert capacity.window_age_max_ms([a, b], 100.0, 102.0) == 1_300.0
    assert capacity.window_age_max_ms([a], 100.0, 102.0) == 240.0  # before and after: out


def test_a_window_without_rounds_has_no_age(tmp_path: Path) -> None:
    a = _log(tmp_path / "a.log", (100.5, None), (103.0, 80.0))
    assert capacity.window_age_max_ms([a], 100.0, 102.0) is None


class Worker:
    """Keeps up with any rate up to ``limit`` events/s; the generator achieves 99 % of a rate."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.asked: list[float] = []

    def __call__(self, rate: float):
        self.asked.append(rate)
        age_ms = 200.0 if rate <= self.limit else 5_000.0
        return capacity.Offered(0.99 * rate, age_ms)


def test_the_first_rate_kept_up_with_is_the_capacity_at_what_the_generator_achieved() -> None:
    worker = Worker(limit=75_000)
    found = capacity.search(worker, 100_000)
    assert worker.asked == pytest.approx([100_000, 85_000, 72_250])
    assert found["capacity_under_load_events_per_s"] == round(0.99 * 72_250)
    assert [t["kept_up"] for t in found["capacity_tries"]] == [False, False, True]


def test_no_rate_kept_up_with_leaves_none_and_the_lowest_tried() -> None:
    worker = Worker(limit=1_000)
    found = capacity.search(worker, 100_000)
    assert len(worker.asked) == capacity.TRIES
    assert found["capacity_under_load_events_per_s"] is None
    assert found["capacity_lowest_tried_events_per_s"] == round(0.99 * 100_000 * 0.85**4)


def test_a_window_without_rounds_is_not_kept_up_with() -> None:
    # no round began in the window's second half: the worker was stuck, not idle
    assert not capacity.Offered(50_000.0, None).kept_up
    assert not capacity.Offered(50_000.0, capacity.KEPT_UP_AGE_MS).kept_up
    assert capacity.Offered(50_000.0, capacity.KEPT_UP_AGE_MS - 1).kept_up


def test_the_line_says_when_no_rate_was_kept_up_with() -> None:
    found = capacity.search(Worker(limit=1_000), 100_000)
    line = capacity.describe(found, found["capacity_lowest_tried_events_per_s"])
    assert line.startswith("capacity under load: 99,000 events/s: oldest record 5000.0 ms; ")
    assert line.endswith(
        "-> 51,679 events/s (none kept up with: the lowest rate tried, an upper bound)"
    )
    kept = capacity.describe(capacity.search(Worker(limit=90_000), 100_000), 84_150)
    assert kept.endswith("84,150 events/s: oldest record 200.0 ms (kept up) -> 84,150 events/s")


def test_the_oldest_record_of_a_window_says_where_it_was(tmp_path: Path) -> None:
    def line(t: float, age: float, at: str) -> str:
        body = {"t": t, "age_ms": {"n": 3, "max": age}, "age_max_at": at}
        return "2026-12-04 02:19:01,724 INFO x: batch path stats: " + json.dumps(body) + "\n"

    a = tmp_path / "a.log"
    a.write_text(line(100.5, 80.0, "f.steps:3") + line(101.5, 19_900.0, "f.steps:11"))
    b = tmp_path / "b.log"
    b.write_text(line(100.7, 120.0, "f.heartbeats:2") + line(103.0, 5e4, "f.steps:0"))
    assert capacity.window_oldest([a, b], 100.0, 102.0) == (19_900.0, "f.steps:11")
    assert capacity.window_oldest([b], 101.0, 102.0) is None
