"""Incarnations: a RunStarted starts a gang with a fresh rank table; a RunEnded suspends.

Its state: ``incarnation``, ``launch_id``, ``live``, ``status``, ``thresholds`` (the run's
own detector overrides), ``started_ns``, ``expected_ranks`` and ``step_hint``. A
heartbeat of a suspended run (``live`` false) only advances log time: `fold_liveness`
runs no heartbeat detector for it.
"""

from __future__ import annotations

import msgspec

from runwatch.processors.core.bounds import check_incarnation
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.detectors.base import LivenessDetector
from runwatch.processors.core.liveness_state import LivenessState
from runwatch.processors.core.rank_table import RankTable
from runwatch.schemas.events import AnomalyDetected, Provenance, RunEnded, RunStarted


def on_run_started(
    state: LivenessState, event: RunStarted, source: Provenance, cfg: DetectorConfig
) -> tuple[LivenessState, list[AnomalyDetected]]:
    """A new incarnation: every other detector starts again from its defaults.

    Rule 1: the rank table is fresh, as wide as the announced world; the expected ranks
    are known.
    Rule 2: log time restarts at the new gang's clock, not the old incarnation's: a time
    one bad record pushed ahead must not carry into the next incarnation (issue 19,
    finding 2).
    Rule 3: the newest step known so far stays, as the hint for verdicts before the new
    gang's first heartbeat; the heartbeat count, the verdicts raised and their counts stay.

    Raises:
        BoundError: An incarnation past the bound of `processors.core.bounds`.
    """
    check_incarnation(event.incarnation, state.incarnation, "RunStarted incarnation")
    fresh = LivenessState(
        run_id=state.run_id,
        last_offset=source.offset,
        last_index=source.index,
        incarnation=event.incarnation,
        thresholds=dict(event.thresholds),
        log_time_ns=event.ts_ns,
        started_ns=event.ts_ns,
        expected_ranks=event.world_size,
        known_ranks=event.world_size,
        step_hint=max(state.step_hint, state.run_step),
        table=RankTable.of_width(event.world_size),
        heartbeats=state.heartbeats,
        raised=state.raised,
        anomaly_counts=state.anomaly_counts,
        launch_id=event.launch_id,
    )
    return fresh, []


def on_run_ended(
    state: LivenessState, event: RunEnded, source: Provenance, cfg: DetectorConfig
) -> tuple[LivenessState, list[AnomalyDetected]]:
    """The run ended: every check is suspended until the next RunStarted; a hang ends."""
    return msgspec.structs.replace(
        state,
        last_offset=source.offset,
        last_index=source.index,
        live=False,
        status=event.status,
        hung=False,
        log_time_ns=max(state.log_time_ns, event.ts_ns),
    ), []


INCARNATION = LivenessDetector(
    "incarnation",
    (
        "incarnation",
        "launch_id",
        "live",
        "status",
        "thresholds",
        "started_ns",
        "expected_ranks",
        "step_hint",
    ),
    events=((RunStarted, on_run_started), (RunEnded, on_run_ended)),
)
"""The incarnation detector (it raises nothing)."""

__all__ = ["INCARNATION", "on_run_ended", "on_run_started"]
