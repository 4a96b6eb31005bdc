"""The alert conditions of one run: what is wrong now, since when, and when it ended (pure).

Alertmanager holds *states*, not events: an alert fires while its sender keeps re-sending it
and resolves when the sender says it ended (``endsAt``). `fold` turns a run's verdicts,
commands, controller outcomes and run markers into such states:
``(state, event) -> (state, alerts)``, where ``alerts`` are the `AlertState`s the event
changed (a new condition, one extended, one that ended). Time is the log's: every start
and end is an event timestamp, so replaying the same records rebuilds the same states (the
alerts sink rebuilds them from the log at every start, `sinks.alertmanager`).

A condition is identified by its kind, incarnation and severity (a command event's: by its
command); its Alertmanager identity is its label set (`AlertState.labels`): ``alertname``
(the kind), ``run``, ``severity``, ``incarnation``, ``rank`` for the kinds labelled with
their first verdict's rank (a dead rank, a straggler), and the run's tags (those of its
incarnation's `RunStarted`). A run therefore has a bounded number of conditions, however
many ranks its verdicts name. Repeated verdicts of one key extend the condition; a
verdict of a key whose condition has already ended opens a new one (a new episode).

When a condition ends is decided by its kind's entry in `sinks.alert_rules.ALERT_RULES`
(restart, run end, quiet period, moment, and 24 h at most), computed from the facts the
state holds whenever alerts are rendered, so the facts may arrive in any order (the
anomalies, commands, controller and runs topics are read independently): a dead rank read
after the restart that cured it is born ended.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Final

import msgspec

from runwatch.schemas.events import (
    AnomalyDetected,
    CommandRejected,
    Event,
    RestartCompleted,
    RestartFailed,
    RestartRequested,
    RunEnded,
    RunStarted,
    Severity,
)
from runwatch.sinks.alert_format import Alert, alert_of
from runwatch.sinks.alert_rules import STALE_S, Ends, rule_of

NS_PER_S: Final = 1_000_000_000

OWN_LABELS: Final = frozenset({"alertname", "run", "severity", "incarnation", "rank", "host"})
"""Labels runwatch sets itself; a run tag of the same name becomes ``tag_<name>``."""

_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_]")


class Condition(msgspec.Struct, frozen=True, kw_only=True):
    """One thing wrong with a run, from its first verdict (or event) to its latest.

    Attributes:
        kind: Anomaly kind or restart event (`sinks.alert_rules.ALERT_KINDS`).
        severity: Of its verdicts (part of its identity).
        incarnation: The gang incarnation it concerns; None for a command outcome whose
            command has not been read (`RunAlerts.commands` resolves it when it is).
        rank: For kinds labelled with a rank, its first verdict's rank; None otherwise.
        command_id: For restart events, the command.
        since_ns: Log time of its first verdict.
        last_ns: Log time of its latest verdict.
        first_id: Alert id of its first verdict (`sinks.alert_format.Alert.alert_id`).
        last_id: Alert id of its latest verdict.
        step: Step of its latest verdict, if any.
        summary: One line, of its latest verdict.
        description: Detail of its latest verdict.
    """

    kind: str
    severity: Severity
    incarnation: int | None
    rank: int | None = None
    command_id: str | None = None
    since_ns: int
    last_ns: int
    first_id: str
    last_id: str
    step: int | None = None
    summary: str
    description: str


class RunAlerts(msgspec.Struct, frozen=True, kw_only=True):
    """What the alert conditions of one run depend on.

    Attributes:
        run_id: The run.
        tags: Incarnation -> the tags of its latest `RunStarted` (labels of its alerts).
        incarnation: Of its latest `RunStarted` read; None before one is read.
        starts: ``(incarnation, ts_ns)`` of every `RunStarted` read.
        ends: ``(incarnation, ts_ns)`` of every `RunEnded` read; the incarnation is the
            latest `RunStarted`'s before it on the runs topic (None: none was read).
        commands: Restart command id -> the incarnation it ends.
        completed: Restart command id -> log time its restart completed.
        conditions: By key (`condition_key`).
        last_ns: Newest log time of the run's events read.
    """

    run_id: str
    tags: dict[int, dict[str, str]] = {}
    incarnation: int | None = None
    starts: tuple[tuple[int, int], ...] = ()
    ends: tuple[tuple[int | None, int], ...] = ()
    commands: dict[str, int] = {}
    completed: dict[str, int] = {}
    conditions: dict[str, Condition] = {}
    last_ns: int = 0


class AlertState(msgspec.Struct, frozen=True, kw_only=True):
    """One alert as Alertmanager should hold it now.

    Attributes:
        run_id: The run.
        kind: The condition's kind (``alertname``).
        severity: Its severity (also a label).
        labels: Its identity in Alertmanager.
        annotations: ``summary``, ``description`` and the ids of its first and latest
            verdicts (the sink adds ``runbook_url``).
        starts_ns: When it began (log time).
        ends_ns: When it ended or will end (log time): its rule's end, or `STALE_S` after
            its latest verdict when nothing ended it yet.
    """

    run_id: str
    kind: str
    severity: Severity
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_ns: int
    ends_ns: int

    @property
    def fingerprint(self) -> tuple[tuple[str, str], ...]:
        """Its identity: the sorted label pairs (as Alertmanager fingerprints them)."""
        return tuple(sorted(self.labels.items()))

    def firing_at(self, now_ns: int) -> bool:
        """True when it has not ended by ``now_ns``."""
        return self.ends_ns > now_ns


Fingerprint = tuple[tuple[str, str], ...]


def condition_key(kind: str, incarnation: int | None, command: str | None, severity: str) -> str:
    """The key of a condition in `RunAlerts.conditions`."""
    if command is not None:
        return f"{kind}|cmd={command}|{severity}"
    return f"{kind}|inc={incarnation}|{severity}"


@functools.lru_cache(maxsize=4096)
def label_name(tag: str) -> str:
    """A run tag's name as an Alertmanager label name (``[a-zA-Z_][a-zA-Z0-9_]*``)."""
    name = _LABEL_CHARS.sub("_", tag)
    if not name or name[0].isdigit() or name.startswith("__") or name in OWN_LABELS:
        name = f"tag_{name}"
    return name


# --------------------------------------------------------------------------- the fold


def fold(state: RunAlerts | None, event: Event) -> tuple[RunAlerts, list[AlertState]]:
    """Apply one event of the run; return the new state and the alerts it changed.

    Args:
        state: The run's state; None before its first event.
        event: A `RunStarted`, `RunEnded`, `AnomalyDetected`, `RestartRequested`,
            `RestartCompleted`, `RestartFailed` or `CommandRejected` of the run (others
            change nothing).

    Returns:
        The new state, and the alerts whose state differs from before the event
        (an alert whose labels changed, because the run's tags did, is returned twice:
        ended under its old labels, and under its new ones).
    """
    before = state if state is not None else RunAlerts(run_id=event.run_id)
    alert = alert_of(event)
    after = _apply(before, event, alert)
    if after is before:
        return after, []
    return after, changed(before, after, event.ts_ns, _affected(before, event, alert))


def apply(state: RunAlerts | None, event: Event) -> RunAlerts:
    """`fold` without the alerts it changed: the new state only.

    A replay's fast path: `alerts_of` renders the alerts once they are needed.
    """
    before = state if state is not None else RunAlerts(run_id=event.run_id)
    return _apply(before, event, alert_of(event))


def _affected(state: RunAlerts, event: Event, alert: Alert | None) -> set[str] | None:
    """Keys of the conditions ``event`` may change; None: any (a run marker, a restart).

    A verdict changes its own condition only, so a storm of verdicts costs O(1) each; the
    events every end depends on (RunStarted, RunEnded, RestartCompleted, a command whose
    completion was read before it) are rare and re-render the run's conditions.
    """
    if isinstance(event, RunStarted | RunEnded | RestartCompleted):
        return None
    if isinstance(event, RestartRequested):
        if event.command_id in state.completed:
            return None
        outcomes = {k for k, c in state.conditions.items() if c.command_id == event.command_id}
        return outcomes | {_key_of(event, alert)} if alert else outcomes
    return {_key_of(event, alert)} if alert else set()


def changed(
    before: RunAlerts, after: RunAlerts, now_ns: int, keys: set[str] | None = None
) -> list[AlertState]:
    """The alerts of ``after`` that differ from ``before``'s; relabelled ones end at ``now_ns``.

    Only the conditions of ``keys`` are compared when it is given (`_affected`).
    """
    old = alerts_of(before, keys)
    new = alerts_of(after, keys)
    out = [a for fp, a in new.items() if old.get(fp) != a]
    for fp, gone in old.items():
        if fp not in new and gone.firing_at(now_ns):
            out.append(msgspec.structs.replace(gone, ends_ns=max(gone.starts_ns, now_ns)))
    return out


def _apply(state: RunAlerts, event: Event, alert: Alert | None) -> RunAlerts:
    last_ns = max(state.last_ns, event.ts_ns)
    if isinstance(event, RunStarted):
        return msgspec.structs.replace(
            state,
            tags={**state.tags, event.incarnation: dict(event.tags)},
            incarnation=event.incarnation,
            starts=tuple(dict.fromkeys((*state.starts, (event.incarnation, event.ts_ns)))),
            last_ns=last_ns,
        )
    if isinstance(event, RunEnded):
        ends = tuple(dict.fromkeys((*state.ends, (state.incarnation, event.ts_ns))))
        return msgspec.structs.replace(state, ends=ends, last_ns=last_ns)
    if isinstance(event, RestartRequested):
        state = msgspec.structs.replace(
            state, commands={**state.commands, event.command_id: event.incarnation}
        )
    elif isinstance(event, RestartCompleted):
        completed = dict(state.completed)
        completed[event.command_id] = min(completed.get(event.command_id, event.ts_ns), event.ts_ns)
        state = msgspec.structs.replace(state, completed=completed)
    if alert is None:
        return state
    return _with_verdict(msgspec.structs.replace(state, last_ns=last_ns), event, alert)


def _identity(event: Event) -> tuple[int | None, str | None]:
    """``(incarnation, command id)`` of the condition an event's alert belongs to."""
    if isinstance(event, AnomalyDetected):
        return event.incarnation, None
    if isinstance(event, RestartRequested):
        return event.incarnation, event.command_id
    if isinstance(event, RestartCompleted | RestartFailed | CommandRejected):
        return None, event.command_id
    return None, None


def _key_of(event: Event, alert: Alert) -> str:
    incarnation, command = _identity(event)
    return condition_key(alert.kind, incarnation, command, alert.severity)


def _with_verdict(state: RunAlerts, event: Event, alert: Alert) -> RunAlerts:
    rule = rule_of(alert.kind)
    incarnation, command = _identity(event)
    rank = alert.rank if rule.rank_label else None
    severity: Severity = alert.severity  # type: ignore[assignment]
    key = condition_key(alert.kind, incarnation, command, severity)
    current = state.conditions.get(key)
    fresh = Condition(
        kind=alert.kind,
        severity=severity,
        incarnation=incarnation,
        rank=rank,
        command_id=command,
        since_ns=alert.ts_ns,
        last_ns=alert.ts_ns,
        first_id=alert.alert_id,
        last_id=alert.alert_id,
        step=alert.step,
        summary=alert.summary,
        description=alert.description,
    )
    if current is not None:
        ended = end_ns(current, state)
        if ended is None or ended >= alert.ts_ns:
            fresh = _extended(current, fresh)
    return msgspec.structs.replace(state, conditions={**state.conditions, key: fresh})


def _extended(current: Condition, verdict: Condition) -> Condition:
    """``current`` with one more verdict (possibly read out of order; idempotent)."""
    if verdict.last_ns < current.last_ns or (
        verdict.last_ns == current.last_ns and verdict.last_id <= current.last_id
    ):
        latest = current
    else:
        latest = verdict
    first = verdict if verdict.since_ns < current.since_ns else current
    return msgspec.structs.replace(
        latest,
        since_ns=first.since_ns,
        first_id=first.first_id,
        rank=first.rank,
        last_ns=max(current.last_ns, verdict.last_ns),
    )


# --------------------------------------------------------------------------- ends and rendering


def incarnation_of(condition: Condition, state: RunAlerts) -> int | None:
    """The condition's incarnation, through its command when it is a command outcome."""
    if condition.incarnation is None and condition.command_id is not None:
        return state.commands.get(condition.command_id)
    return condition.incarnation


_STALE_NS: Final = int(STALE_S * NS_PER_S)


@functools.cache
def _ends_of(kind: str) -> tuple[bool, bool, bool, bool, int]:
    """``(quiet, moment, restart, run_end, hold_ns)`` of a kind's rule (flag tests are slow)."""
    rule = rule_of(kind)
    return (
        Ends.QUIET in rule.ends,
        Ends.MOMENT in rule.ends,
        Ends.RESTART in rule.ends,
        Ends.RUN_END in rule.ends,
        int(rule.hold_s * NS_PER_S),
    )


def end_ns(condition: Condition, state: RunAlerts) -> int:
    """When the condition ends (log time): by its kind's rule, at the latest `STALE_S`."""
    quiet, moment, restart, run_end, hold_ns = _ends_of(condition.kind)
    since = condition.since_ns
    found = [condition.last_ns + _STALE_NS]
    if quiet:
        found.append(condition.last_ns + hold_ns)
    if moment:
        found.append(since + hold_ns)
    mine = incarnation_of(condition, state)
    if restart:
        # another incarnation, or the same one launched again after the run ended
        run_ends = [ts for _, ts in state.ends if ts >= since]
        found += [
            ts
            for inc, ts in state.starts
            if ts >= since and (inc != mine or any(e <= ts for e in run_ends))
        ]
        for command, ts in state.completed.items():
            ended = state.commands.get(command)
            if ts >= since and (ended is None or mine is None or ended >= mine):
                found.append(ts)
    if run_end:
        found += [
            ts
            for inc, ts in state.ends
            if ts >= since and (inc is None or mine is None or inc >= mine)
        ]
    return min(found)


def labels_of(condition: Condition, state: RunAlerts) -> dict[str, str]:
    """The condition's Alertmanager labels (its identity)."""
    labels: dict[str, str] = {}
    incarnation = incarnation_of(condition, state)
    which = state.incarnation if incarnation is None else incarnation
    tags = {} if which is None else state.tags.get(which, {})
    for tag, value in sorted(tags.items()):
        name = label_name(tag)
        if value and name not in labels:
            labels[name] = value
    labels.update(alertname=condition.kind, run=state.run_id, severity=condition.severity)
    if incarnation is not None:
        labels["incarnation"] = str(incarnation)
    if condition.rank is not None:
        labels["rank"] = str(condition.rank)
    return labels


def render(condition: Condition, state: RunAlerts) -> AlertState:
    """The condition as an alert."""
    annotations = {"summary": condition.summary, "description": condition.description}
    if condition.first_id != condition.last_id:
        annotations["first_alert_id"] = condition.first_id
    annotations["alert_id"] = condition.last_id
    return AlertState(
        run_id=state.run_id,
        kind=condition.kind,
        severity=condition.severity,
        labels=labels_of(condition, state),
        annotations=annotations,
        starts_ns=condition.since_ns,
        ends_ns=end_ns(condition, state),
    )


def alerts_of(state: RunAlerts, keys: set[str] | None = None) -> dict[Fingerprint, AlertState]:
    """The run's conditions (those of ``keys``, when given) as alerts, by fingerprint."""
    out: dict[Fingerprint, AlertState] = {}
    if keys is None:
        conditions = list(state.conditions.values())
    else:
        conditions = [state.conditions[k] for k in keys if k in state.conditions]
    for condition in conditions:
        alert = render(condition, state)
        out[alert.fingerprint] = alert
    return out


def prune(state: RunAlerts, now_ns: int, keep_s: float) -> RunAlerts | None:
    """Drop conditions that ended more than ``keep_s`` before ``now_ns``.

    Returns:
        The state without them; None when the run can be forgotten: nothing is left
        and its newest event is older than `sinks.alert_rules.STALE_S`.
    """
    horizon = now_ns - int(keep_s * NS_PER_S)
    kept: Mapping[str, Condition] = {
        k: c for k, c in state.conditions.items() if end_ns(c, state) >= horizon
    }
    if not kept and state.last_ns < now_ns - int(STALE_S * NS_PER_S):
        return None
    if len(kept) == len(state.conditions):
        return state
    return msgspec.structs.replace(state, conditions=dict(kept))
