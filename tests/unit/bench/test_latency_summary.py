"""`bench/latency.py`'s summary: a run behind for most of its load is counted apart."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import load_script

latency = load_script("latency")


def _run(p99_ms: float, rounds: dict[str, Any]) -> dict[str, Any]:
    """One run's result with the fields `summary` reads."""
    return {
        "loaded_read_p99_ms": p99_ms,
        "loaded_read_p50_ms": p99_ms / 3,
        "loaded_judged": 800,
        "loaded_spikes": 800,
        "generator_short": False,
        "worker_lag_records_at_end": 0,
        "rounds_loaded": rounds,
        "capacity_events_per_s": 250_000.0,
        "load_basis_events_per_s": 200_000,
        "load_offered_share_of_drain": 0.64,
        "drain_cpu_us_per_event": 3.3,
        "paced_cpu_us_per_event": 4.5,
        "paced_over_drain_cpu": 1.36,
        "drain_main_thread_us_per_event": 3.0,
        "paced_main_thread_us_per_event": 4.1,
        "worker_main_thread_runqueue_wait_share": 0.1,
        "loadavg_1m": [1.0, 2.0],
    }


@pytest.mark.parametrize(
    ("age_p50_ms", "overloaded"),
    [
        pytest.param(60.0, 0, id="kept-up"),
        pytest.param(1_000.0, 0, id="at-the-kept-up-age"),
        pytest.param(1_520.0, 1, id="behind"),
    ],
)
def test_a_run_whose_rounds_began_over_a_second_behind_at_p50_is_overloaded(
    age_p50_ms: float, overloaded: int
) -> None:
    total = latency.summary(
        [_run(241.0, {"age_ms": {"p50": 60.0}}), _run(660.0, {"age_ms": {"p50": age_p50_ms}})]
    )
    assert total["loaded_round_age_p50_ms"] == [60.0, age_p50_ms]
    assert total["overloaded"] == overloaded
    assert total["held"] == 1


def test_a_run_without_rounds_has_no_age_and_is_not_counted() -> None:
    total = latency.summary([_run(241.0, {})])
    assert total["loaded_round_age_p50_ms"] == [None]
    assert total["overloaded"] == 0
