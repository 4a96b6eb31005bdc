"""`RoundStats`: what a summary line says about each round (benches find a drain's end in it)."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from runwatch.processors.engine import RoundStats


def _lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    prefix = "batch path stats: "
    return [
        json.loads(r.getMessage().split(prefix, 1)[1])
        for r in caplog.records
        if prefix in r.getMessage()
    ]


def test_a_line_lists_each_rounds_end_and_records_and_the_next_starts_empty(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stats = RoundStats(interval_s=1e-9)  # every report is due
    caplog.set_level(logging.INFO, logger="runwatch.processors.engine")
    stats.round_span(100.0, 101.5, 20_000, (7.0, 5.0), (8.2, 6.1))
    stats.round_span(101.6, 101.9, 7, (8.3, 6.15), (8.31, 6.16))
    stats.maybe_report()
    stats.round_span(103.0, 103.1, 1, (9.0, 7.0), (9.01, 7.005))
    stats.maybe_report()
    first, second = _lines(caplog)
    assert first["first_start"] == 100.0 and first["last_end"] == 101.9
    # each round's end, records and the CPU clocks (process, main thread) at its end; the
    # clocks when the line's first round began
    assert first["rounds"] == [[101.5, 20_000, 8.2, 6.1], [101.9, 7, 8.31, 6.16]]
    assert first["first_start_cpu_s"] == [7.0, 5.0]
    assert second["rounds"] == [[103.1, 1, 9.01, 7.005]]
    assert second["first_start_cpu_s"] == [9.0, 7.0]


def test_its_cpu_clocks_are_the_process_and_the_calling_thread() -> None:
    process_s, thread_s = RoundStats.cpu_now()
    sum(i * i for i in range(200_000))  # some CPU on this thread
    later_process_s, later_thread_s = RoundStats.cpu_now()
    assert later_thread_s > thread_s and later_process_s > process_s
    # Another thread's CPU counts in the first clock only. (Comparing the two clocks'
    # values instead failed now and then: read one after the other, a single-threaded
    # process's thread clock can pass the process clock read a few µs before it.)
    burner = threading.Thread(target=lambda: sum(i * i for i in range(2_000_000)))
    burner.start()
    burner.join()
    last_process_s, last_thread_s = RoundStats.cpu_now()
    assert last_process_s - later_process_s > 5 * (last_thread_s - later_thread_s)


def test_off_it_keeps_no_round() -> None:
    stats = RoundStats()
    stats.round_span(100.0, 101.5, 20_000, (7.0, 5.0), (8.2, 6.1))
    assert stats.rounds == [] and stats.span is None


def test_a_line_says_where_its_oldest_record_was(caplog: pytest.LogCaptureFixture) -> None:
    stats = RoundStats(interval_s=1e-9)
    caplog.set_level(logging.INFO, logger="runwatch.processors.engine")
    stats.note_age(120.0, "p.steps", 3)
    stats.note_age(900.0, "p.heartbeats", 11)  # one partition stalled while the rest kept up
    stats.note_age(40.0, "p.steps", 0)
    stats.maybe_report()
    stats.note_age(5.0, "p.steps", 1)
    stats.maybe_report()
    first, second = _lines(caplog)
    assert first["age_ms"]["max"] == 900.0 and first["age_max_at"] == "p.heartbeats:11"
    assert second["age_ms"]["max"] == 5.0 and second["age_max_at"] == "p.steps:1"


def test_off_it_keeps_no_age() -> None:
    stats = RoundStats()
    stats.note_age(900.0, "p.heartbeats", 11)
    assert stats.samples == {} and stats.oldest is None
