"""`RoundStats`: what a summary line says about each round (benches find a drain's end in it)."""

from __future__ import annotations

import json
import logging

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
    stats.round_span(100.0, 101.5, 20_000)
    stats.round_span(101.6, 101.9, 7)
    stats.maybe_report()
    stats.round_span(103.0, 103.1, 1)
    stats.maybe_report()
    first, second = _lines(caplog)
    assert first["first_start"] == 100.0 and first["last_end"] == 101.9
    assert first["rounds"] == [[101.5, 20_000], [101.9, 7]]
    assert second["rounds"] == [[103.1, 1]]


def test_off_it_keeps_no_round() -> None:
    stats = RoundStats()
    stats.round_span(100.0, 101.5, 20_000)
    assert stats.rounds == [] and stats.span is None
