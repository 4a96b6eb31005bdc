"""`bench/processors.py`'s ``drain_window``: a drain ends with the round that reached its records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import load_script

bench_processors = load_script("processors")


def _log(tmp_path: Path, *lines: dict[str, object]) -> Path:
    path = tmp_path / "worker.log"
    path.write_text(
        "".join(
            f"2026-12-03 14:23:05,431 INFO x: batch path stats: {json.dumps(line)}\n"
            for line in lines
        )
    )
    return path


def _line(
    start_cpu: tuple[float, float], *rounds: tuple[float, int, float, float]
) -> dict[str, object]:
    """A stats line: its rounds ``(end, records, cpu_s, main_cpu_s)``, the clocks at its start.

    Its first round began 0.5 s before the first one ended.
    """
    return {
        "first_start": rounds[0][0] - 0.5,
        "last_end": rounds[-1][0],
        "first_start_cpu_s": list(start_cpu),
        "rounds": [list(r) for r in rounds],
    }


def test_the_drain_ends_with_its_last_round_not_with_the_line_that_holds_it(tmp_path: Path) -> None:
    first = _line((3.0, 2.0), (100.5, 20_000, 3.4, 2.3), (100.9, 20_000, 3.8, 2.6))
    # the backlog's last 8,000 records end at 101.1; the line also holds a round of Ticks
    # that came after an idle fetch wait of almost a second
    second = _line((3.85, 2.65), (101.1, 8_000, 4.0, 2.75), (102.05, 4, 4.3, 2.8))
    log = _log(tmp_path, first, {"t": 101.5}, second)  # a line without rounds (idle) too
    window = bench_processors.drain_window(log, 48_000)
    assert window is not None
    assert (window.start_s, window.end_s) == (100.0, 101.1)
    # the CPU from the first round's start to that round's end, not to the later Ticks'
    assert window.cpu_s == pytest.approx(1.0) and window.main_cpu_s == pytest.approx(0.75)


def test_no_window_while_the_rounds_do_not_count_the_backlog_yet(tmp_path: Path) -> None:
    line = _line((3.0, 2.0), (100.5, 20_000, 3.4, 2.3))
    assert bench_processors.drain_window(_log(tmp_path, line), 48_000) is None


def test_two_workers_drain_until_their_rounds_together_reach_the_backlog(tmp_path: Path) -> None:
    # worker a began first (100.1); worker b's round at 100.8 brings the rounds to the
    # backlog's 30,000 records, so a's later round of Ticks (101.5) is neither time nor
    # CPU of it
    a = _line((5.0, 4.0), (100.6, 15_000, 5.5, 4.4), (101.5, 3, 5.9, 4.5))
    b = _line((7.0, 6.0), (100.8, 15_000, 7.6, 6.5))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    window = bench_processors.drain_window(
        [_log(tmp_path / "a", a), _log(tmp_path / "b", b)], 30_000
    )
    assert window is not None
    assert (window.start_s, window.end_s) == (100.1, 100.8)
    assert window.cpu_s == pytest.approx(0.5 + 0.6)  # each worker's own, to its last round
    assert window.main_cpu_s == pytest.approx(0.4 + 0.5)
