"""What an alert says: built from a verdict or a restart event, rendered for each receiver.

Pure functions only. An `Alert` is made from an `AnomalyDetected` (its id is the verdict
id), a `RestartRequested` or a controller outcome (`RestartCompleted`, `RestartFailed`,
`CommandRejected`; their id is ``<event>:<command id>``, since one command has several).
A `AlertGroup` is what one webhook delivery carries: one run's alerts of a group window,
plus the count of alerts the rate limiter suppressed since the run's previous delivery.
(Alertmanager gets alert *states* instead: `sinks.alert_conditions`.)
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec

from runwatch.schemas.events import (
    AnomalyDetected,
    CommandRejected,
    Event,
    RestartCompleted,
    RestartFailed,
    RestartRequested,
    event_name,
)


class Alert(msgspec.Struct, frozen=True, kw_only=True):
    """One thing a human should hear about.

    Attributes:
        alert_id: Dedupe key: the verdict id, or ``<event>:<command id>``.
        run_id: The run.
        kind: Anomaly kind, or the event name (``restart_requested``, ...).
        severity: ``critical``, ``warning`` or ``info``.
        step: The step concerned, if any.
        rank: The rank concerned, if any.
        summary: One short line.
        description: Detail.
        ts_ns: Log time of the event.
        detail: What happened, without the run, kind or step already said elsewhere (the
            console line's text).
        cause_id: The alert this one follows from (a restart's cause verdict, a command
            outcome's ``restart_requested:<command id>``); it is delivered after it.
    """

    alert_id: str
    run_id: str
    kind: str
    severity: str
    step: int | None
    rank: int | None
    summary: str
    description: str
    ts_ns: int
    detail: str = ""
    cause_id: str | None = None


class AlertGroup(msgspec.Struct, frozen=True, kw_only=True):
    """One delivery: a run's alerts, and what the rate limiter held back before them.

    Attributes:
        run_id: The run.
        alerts: The alerts, in arrival order (may be empty: a suppression notice).
        suppressed: Alerts of the run suppressed since its previous delivery.
    """

    run_id: str
    alerts: tuple[Alert, ...]
    suppressed: int = 0


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _anomaly(event: AnomalyDetected) -> Alert:
    where = f"step {event.step}" + ("" if event.rank is None else f" rank {event.rank}")
    summary = f"{event.kind} in run {event.run_id} at {where}"
    bits = [event.detail] if event.detail else []
    figures = (
        f"value {_fmt(event.value)}, baseline {_fmt(event.baseline)}, z {_fmt(event.z)}, "
        f"threshold {_fmt(event.threshold)}"
    )
    bits.append(f"{figures}, incarnation {event.incarnation}")
    return Alert(
        alert_id=event.verdict_id,
        run_id=event.run_id,
        kind=event.kind,
        severity=event.severity,  # chosen by the detector (processors.core.verdicts)
        step=event.step,
        rank=event.rank,
        summary=summary,
        description="; ".join(bits),
        ts_ns=event.ts_ns,
        detail=event.detail or figures,
    )


def _restart(event: RestartRequested) -> Alert:
    upto = "latest" if event.max_checkpoint_step is None else f"<= {event.max_checkpoint_step}"
    return Alert(
        alert_id=f"{event_name(event)}:{event.command_id}",
        run_id=event.run_id,
        kind=event_name(event),
        severity="warning",
        step=None,
        rank=None,
        summary=f"{event.action} of run {event.run_id} requested after {event.cause_kind}",
        description=(
            f"incarnation {event.incarnation} ends; resume from checkpoint {upto}; "
            f"cause verdict {event.cause_verdict_id}; command {event.command_id}"
        ),
        ts_ns=event.ts_ns,
        detail=(
            f"{event.action} after {event.cause_kind} ({event.cause_verdict_id}), "
            f"resume from checkpoint {upto}, incarnation {event.incarnation} ends"
        ),
        cause_id=event.cause_verdict_id,
    )


def _outcome(event: RestartCompleted | RestartFailed | CommandRejected) -> Alert:
    kind = event_name(event)
    if isinstance(event, RestartCompleted):
        severity = "info"
        summary = f"run {event.run_id} restarted from checkpoint step {event.checkpoint_step}"
        description = (
            f"world size {event.world_size}, {event.duration_s:.1f} s, "
            f"checkpoint {event.checkpoint_path or '-'}"
        )
        detail = f"from checkpoint step {event.checkpoint_step}, {description}"
    elif isinstance(event, RestartFailed) and event.covered:
        severity = "info"  # redundant, not failed: a group restart in progress answers it
        summary = f"command for run {event.run_id} covered by a group restart in progress"
        description = detail = event.reason
    else:
        severity = "critical"
        summary = f"{kind.replace('_', ' ')} for run {event.run_id}"
        description = detail = event.reason
    return Alert(
        alert_id=f"{kind}:{event.command_id}",
        run_id=event.run_id,
        kind=kind,
        severity=severity,
        step=None,
        rank=None,
        summary=summary,
        description=f"{description}; command {event.command_id}",
        ts_ns=event.ts_ns,
        detail=detail,
        cause_id=f"restart_requested:{event.command_id}",
    )


def alert_of(event: Event) -> Alert | None:
    """The alert an event raises; None for events that raise none."""
    if isinstance(event, AnomalyDetected):
        return _anomaly(event)
    if isinstance(event, RestartRequested):
        return _restart(event)
    if isinstance(event, RestartCompleted | RestartFailed | CommandRejected):
        return _outcome(event)
    return None


def rfc3339(ts_ns: int) -> str:
    """``2024-05-01T12:00:00.123456Z`` for nanoseconds since the epoch."""
    moment = datetime.fromtimestamp(ts_ns / 1e9, tz=UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def console_line(a: Alert) -> str:
    """``<time> <SEVERITY> run=R <kind>[ step=S][ rank=K]: <detail> [<alert id>]``.

    Each fact once: the run, kind, step and rank are fields; the text says only what
    happened (the verdict's own detail, or its figures when it has none).
    """
    where = "" if a.step is None else f" step={a.step}"
    where += "" if a.rank is None else f" rank={a.rank}"
    head = f"{rfc3339(a.ts_ns)} {a.severity.upper():8} run={a.run_id} {a.kind}{where}"
    return f"{head}: {a.detail or a.summary} [{a.alert_id}]"


def console_lines(group: AlertGroup, max_per_min: float) -> list[str]:
    """One human-readable line per alert, then one for the suppressed count, if any."""
    lines = [console_line(a) for a in group.alerts]
    if group.suppressed:
        lines.append(
            f"{'':27} {'NOTICE':8} run={group.run_id}: {group.suppressed} alert(s) suppressed "
            f"by the rate limit ({max_per_min:g}/min)"
        )
    return lines


def runwatch_payload(group: AlertGroup, *, max_per_min: float) -> dict[str, Any]:
    """The group in runwatch's own JSON shape."""
    return {
        "source": "runwatch",
        "run": group.run_id,
        "suppressed": group.suppressed,
        "max_alerts_per_min": max_per_min,
        "alerts": [
            {
                "id": a.alert_id,
                "kind": a.kind,
                "severity": a.severity,
                "step": a.step,
                "rank": a.rank,
                "summary": a.summary,
                "description": a.description,
                "ts_ns": a.ts_ns,
                "time": rfc3339(a.ts_ns),
            }
            for a in group.alerts
        ],
    }
