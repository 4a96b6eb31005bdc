"""When alerts go out: grouping per run within a window, and a per-run rate limit.

Pure: time is passed in (monotonic seconds), nothing is sent here. The first alert of a
run opens a window of ``group_wait_s``; when it closes, the window's alerts leave as one
`AlertGroup`. Each alert takes a token from the run's bucket (``max_per_min`` tokens,
refilled continuously); an alert that finds none is *suppressed*: not sent, but counted,
and the count rides on the run's next group. When a run has a count and no alert to carry
it, a notice (a group without alerts) goes out as soon as a token is free, so nothing is
dropped without a trace.

Which verdicts become alerts at all is `pages`: a verdict pages when its severity is at
least the sink's ``--min-severity`` (default ``warning``: a lone grad-norm spike, severity
``info``, is recorded in the anomalies topic and the metrics but pages nobody).

Cause order: an alert with a ``cause_id`` (a restart command's cause verdict, a command
outcome's command) never leaves before its cause. The anomaly, command and controller
topics are read independently, so an effect can arrive first; when its window closes it
is held until the cause has been handled (``known``) or is in the same window (where
causes are put first), for at most ``cause_wait_s`` after it arrived (a cause that never
comes, e.g. one from before a new group started, must not hold a page forever).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple, get_args

from runwatch.schemas.events import Severity
from runwatch.sinks.alert_format import Alert, AlertGroup

SEVERITY_ORDER: tuple[Severity, ...] = get_args(Severity)
"""Severities, least first (the order `schemas.events.Severity` declares them in)."""


def pages(severity: Severity, min_severity: Severity) -> bool:
    """True when a verdict of ``severity`` is at least ``min_severity`` (so it is alerted)."""
    return SEVERITY_ORDER.index(severity) >= SEVERITY_ORDER.index(min_severity)


Source = tuple[str, int, int]
"""``(topic, partition, offset)`` of the record an alert came from."""


class TokenBucket:
    """A token bucket: ``capacity`` tokens, refilled at ``rate_per_s``.

    Args:
        capacity: Most tokens held (the burst).
        rate_per_s: Tokens added per second.
        now_s: Time of creation; the bucket starts full.
    """

    def __init__(self, capacity: float, rate_per_s: float, now_s: float) -> None:
        self.capacity = capacity
        self.rate_per_s = rate_per_s
        self.tokens = capacity
        self.updated_s = now_s

    def _refill(self, now_s: float) -> None:
        elapsed = max(0.0, now_s - self.updated_s)
        self.tokens = min(self.capacity, self.tokens + elapsed * self.rate_per_s)
        self.updated_s = now_s

    def available(self, now_s: float) -> bool:
        """True when a token can be taken now."""
        self._refill(now_s)
        return self.tokens >= 1.0

    def take(self, now_s: float) -> bool:
        """Take one token; False (and nothing taken) when there is none."""
        if not self.available(now_s):
            return False
        self.tokens -= 1.0
        return True


class Release(NamedTuple):
    """What a closed window releases.

    Attributes:
        run_id: The run.
        group: What to deliver; None when everything was suppressed.
        suppressed_ids: Ids suppressed in this window (record them as handled).
    """

    run_id: str
    group: AlertGroup | None
    suppressed_ids: tuple[str, ...]


class _Entry(NamedTuple):
    alert: Alert
    source: Source
    added_s: float


class _Window(NamedTuple):
    opened_s: float
    alerts: list[_Entry]


def causes_first(entries: list[_Entry]) -> list[_Entry]:
    """Arrival order, except that an alert whose cause is also here comes after it."""
    by_id = {e.alert.alert_id: e for e in entries}
    out: list[_Entry] = []
    placed: set[str] = set()

    def place(e: _Entry, path: frozenset[str]) -> None:
        if e.alert.alert_id in placed:
            return
        cause = by_id.get(e.alert.cause_id or "")
        if cause is not None and cause.alert.alert_id not in path:
            place(cause, path | {e.alert.alert_id})
        placed.add(e.alert.alert_id)
        out.append(e)

    for e in entries:
        place(e, frozenset())
    return out


class Grouper:
    """Per-run group windows and rate limits.

    Args:
        group_wait_s: How long the first alert of a run waits for others to join it.
        max_per_min: Alerts per minute per run (also the burst).
        carried: Suppressed counts not yet reported, per run (from the delivery log).
        known: True for an alert id already delivered or suppressed (a cause handled).
        cause_wait_s: Longest an alert waits for its cause.
    """

    def __init__(
        self,
        group_wait_s: float,
        max_per_min: float,
        carried: Mapping[str, int] | None = None,
        *,
        known: Callable[[str], bool] | None = None,
        cause_wait_s: float = 5.0,
    ) -> None:
        if group_wait_s < 0 or max_per_min <= 0 or cause_wait_s < 0:
            raise ValueError("group_wait_s and cause_wait_s must be >= 0 and max_per_min > 0")
        self.group_wait_s = group_wait_s
        self.max_per_min = max_per_min
        self.known = known or (lambda _id: False)
        self.cause_wait_s = cause_wait_s
        self.windows: dict[str, _Window] = {}
        self.buckets: dict[str, TokenBucket] = {}
        self.carried: dict[str, int] = {r: n for r, n in (carried or {}).items() if n > 0}

    def pending_ids(self) -> set[str]:
        """Ids waiting in an open window."""
        return {e.alert.alert_id for w in self.windows.values() for e in w.alerts}

    def add(self, alert: Alert, source: Source, now_s: float) -> bool:
        """Put an alert in its run's window; False when the same id is already waiting."""
        window = self.windows.get(alert.run_id)
        if window is None:
            window = self.windows[alert.run_id] = _Window(now_s, [])
        elif any(e.alert.alert_id == alert.alert_id for e in window.alerts):
            return False
        window.alerts.append(_Entry(alert, source, now_s))
        return True

    def _bucket(self, run_id: str, now_s: float) -> TokenBucket:
        bucket = self.buckets.get(run_id)
        if bucket is None:
            bucket = self.buckets[run_id] = TokenBucket(
                self.max_per_min, self.max_per_min / 60.0, now_s
            )
        return bucket

    def _held(self, entries: list[_Entry], now_s: float) -> set[str]:
        """Ids (in causes-first order) that must wait for a cause not yet handled."""
        here = {e.alert.alert_id for e in entries}
        held: set[str] = set()
        for e in entries:
            cause = e.alert.cause_id
            if cause is None or now_s - e.added_s >= self.cause_wait_s:
                continue
            if cause in held or (cause not in here and not self.known(cause)):
                held.add(e.alert.alert_id)
        return held

    def _release(self, run_id: str, entries: list[_Entry], now_s: float) -> Release:
        bucket = self._bucket(run_id, now_s)
        sent: list[Alert] = []
        suppressed: list[str] = []
        for alert, _, _ in entries:
            if bucket.take(now_s):
                sent.append(alert)
            else:
                suppressed.append(alert.alert_id)
        carried = self.carried.pop(run_id, 0)
        if not sent:
            if carried + len(suppressed):
                self.carried[run_id] = carried + len(suppressed)
            return Release(run_id, None, tuple(suppressed))
        group = AlertGroup(run_id=run_id, alerts=tuple(sent), suppressed=carried)
        if suppressed:
            self.carried[run_id] = len(suppressed)
        return Release(run_id, group, tuple(suppressed))

    def due(self, now_s: float, *, force: bool = False) -> list[Release]:
        """Close the windows that are due (all of them with ``force``), and due notices."""
        out = []
        for run_id in sorted(self.windows):
            window = self.windows[run_id]
            if force or now_s - window.opened_s >= self.group_wait_s:
                entries = causes_first(window.alerts)
                held = set() if force else self._held(entries, now_s)
                del self.windows[run_id]
                if held:
                    self.windows[run_id] = _Window(
                        window.opened_s, [e for e in entries if e.alert.alert_id in held]
                    )
                    entries = [e for e in entries if e.alert.alert_id not in held]
                if entries:
                    out.append(self._release(run_id, entries, now_s))
        for run_id in sorted(self.carried):
            if run_id in self.windows:
                continue
            if self._bucket(run_id, now_s).take(now_s):
                count = self.carried.pop(run_id)
                out.append(
                    Release(run_id, AlertGroup(run_id=run_id, alerts=(), suppressed=count), ())
                )
        return out

    def pending_offsets(self) -> dict[tuple[str, int], int]:
        """Lowest source offset per partition among waiting alerts."""
        out: dict[tuple[str, int], int] = {}
        for window in self.windows.values():
            for _, (topic, partition, offset), _ in window.alerts:
                key = (topic, partition)
                out[key] = min(out.get(key, offset), offset)
        return out
