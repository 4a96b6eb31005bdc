"""Verdict identity and construction: deterministic ids, provenance and log time.

A verdict's id is a hash of what it is about (run, kind, step, rank) and of the detector
configuration that produced it, so replaying the same log with the same configuration gives
the same ids, and a sink or the audit can match a replayed verdict with the recorded one.
Its ``ts_ns`` is the triggering event's and its ``seq`` the source offset, so the encoded
verdict is byte-identical across replays.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

from runwatch.schemas.events import (
    AnomalyDetected,
    AnomalyKind,
    Provenance,
    RestartAction,
    Severity,
)
from runwatch.schemas.kinds import KINDS

_SEP = "\x1f"


class EpisodeFields(NamedTuple):
    """The fields a spike episode's verdict adds (see `AnomalyDetected`)."""

    peak_step: int
    duration_steps: int
    recovered: bool
    decided_step: int


def _digest(*parts: object) -> str:
    text = _SEP.join("" if part is None else str(part) for part in parts)
    return hashlib.blake2b(text.encode(), digest_size=10).hexdigest()


def verdict_id(
    run_id: str,
    kind: str,
    step: int,
    rank: int | None,
    config_hash: str,
    *,
    incarnation: int = 0,
    attempt: int = 0,
    replica_group: int | None = None,
) -> str:
    """The deterministic id of an anomaly verdict.

    Args:
        run_id: The run.
        kind: The anomaly kind.
        step: The step it concerns.
        rank: The rank it concerns, None for run-wide verdicts.
        config_hash: Hash of the detector configuration.
        incarnation: The gang incarnation; a step redone by a later incarnation is a new
            verdict.
        attempt: How many times the run has resumed within what the detector has seen;
            a step redone after a rollback is a new verdict.
        replica_group: The replica group a replica verdict concerns; None (every other
            verdict) leaves the id as it always was.

    Returns:
        20 hex characters.
    """
    parts: tuple[object, ...] = (run_id, kind, step, rank, config_hash, incarnation, attempt)
    if replica_group is not None:
        parts = (*parts, "group", replica_group)
    return _digest("anomaly", *parts)


def command_id(run_id: str, incarnation: int, action: RestartAction, cause_verdict_id: str) -> str:
    """The deterministic id of a restart command.

    Args:
        run_id: The run.
        incarnation: The incarnation the command ends.
        action: ``respawn`` or ``rollback``.
        cause_verdict_id: The anomaly that caused it.

    Returns:
        20 hex characters.
    """
    return _digest("command", run_id, incarnation, action, cause_verdict_id)


def make_anomaly(
    *,
    run_id: str,
    kind: AnomalyKind,
    step: int,
    ts_ns: int,
    source: Provenance,
    config_hash: str,
    incarnation: int,
    attempt: int = 0,
    rank: int | None = None,
    value: float | None = None,
    baseline: float | None = None,
    scale: float | None = None,
    z: float | None = None,
    threshold: float | None = None,
    detail: str = "",
    severity: Severity | None = None,
    ranks: tuple[int, ...] = (),
    rank_count: int = 0,
    launch_id: str = "",
    replica_group: int | None = None,
    episode: EpisodeFields | None = None,
    shadow: bool = False,
) -> AnomalyDetected:
    """Build an anomaly verdict with its deterministic id, log time and provenance.

    Args:
        run_id: The run.
        kind: What was detected.
        step: The step it concerns.
        ts_ns: The triggering event's timestamp (log time, never the wall clock).
        source: Log position of the triggering event; its offset becomes ``seq``.
        config_hash: Hash of the detector configuration.
        incarnation: The gang incarnation the detector knew.
        attempt: Resume counter of the detector (see `verdict_id`).
        rank: The rank, None for run-wide verdicts.
        value: The observed value.
        baseline: The median it was judged against.
        scale: The robust spread it was judged against.
        z: The robust z-score.
        threshold: The threshold crossed.
        detail: One human-readable line.
        severity: How much it matters; None: the kind's (`schemas.kinds.KindSpec.severity`).
        ranks: Every rank a run-wide scan found at fault (at most
            `schemas.events.MAX_LISTED_RANKS`); empty for one rank or none.
        rank_count: How many ranks in all (``ranks`` may list fewer).
        launch_id: The launch of the run's latest RunStarted (empty: none); the policy
            binds the command it makes of the verdict to it.
        replica_group: The replica group it concerns (replica verdicts), part of its id.
        episode: For a spike episode's verdict, ``(peak_step, duration_steps, recovered,
            decided_step)``; None for other verdicts.
        shadow: Recorded in shadow mode (`config.is_shadow`).

    Returns:
        The verdict.
    """
    return AnomalyDetected(
        run_id=run_id,
        ts_ns=ts_ns,
        seq=source.offset,
        verdict_id=verdict_id(
            run_id,
            kind,
            step,
            rank,
            config_hash,
            incarnation=incarnation,
            attempt=attempt,
            replica_group=replica_group,
        ),
        kind=kind,
        step=step,
        rank=rank,
        value=value,
        baseline=baseline,
        scale=scale,
        z=z,
        threshold=threshold,
        detail=detail,
        source=source,
        config_hash=config_hash,
        incarnation=incarnation,
        severity=KINDS[kind].severity if severity is None else severity,
        ranks=ranks,
        rank_count=rank_count,
        launch_id=launch_id,
        replica_group=replica_group,
        **({} if episode is None else episode._asdict()),
        shadow=shadow,
    )


__all__ = ["EpisodeFields", "command_id", "make_anomaly", "verdict_id"]
