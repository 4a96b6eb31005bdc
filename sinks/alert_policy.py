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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, get_args

from schemas.events import Severity
from sinks.alert_format import Alert, AlertGroup

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


class _Window(NamedTuple):
    opened_s: float
    alerts: list[tuple[Alert, Source]]


class Grouper:
    """Per-run group windows and rate limits.

    Args:
        group_wait_s: How long the first alert of a run waits for others to join it.
        max_per_min: Alerts per minute per run (also the burst).
        carried: Suppressed counts not yet reported, per run (from the delivery log).
    """

    def __init__(
        self, group_wait_s: float, max_per_min: float, carried: Mapping[str, int] | None = None
    ) -> None:
        if group_wait_s < 0 or max_per_min <= 0:
            raise ValueError("group_wait_s must be >= 0 and max_per_min > 0")
        self.group_wait_s = group_wait_s
        self.max_per_min = max_per_min
        self.windows: dict[str, _Window] = {}
        self.buckets: dict[str, TokenBucket] = {}
        self.carried: dict[str, int] = {r: n for r, n in (carried or {}).items() if n > 0}

    def pending_ids(self) -> set[str]:
        """Ids waiting in an open window."""
        return {a.alert_id for w in self.windows.values() for a, _ in w.alerts}

    def add(self, alert: Alert, source: Source, now_s: float) -> bool:
        """Put an alert in its run's window; False when the same id is already waiting."""
        window = self.windows.get(alert.run_id)
        if window is None:
            window = self.windows[alert.run_id] = _Window(now_s, [])
        elif any(a.alert_id == alert.alert_id for a, _ in window.alerts):
            return False
        window.alerts.append((alert, source))
        return True

    def _bucket(self, run_id: str, now_s: float) -> TokenBucket:
        bucket = self.buckets.get(run_id)
        if bucket is None:
            bucket = self.buckets[run_id] = TokenBucket(
                self.max_per_min, self.max_per_min / 60.0, now_s
            )
        return bucket

    def _release(self, run_id: str, window: _Window, now_s: float) -> Release:
        bucket = self._bucket(run_id, now_s)
        sent: list[Alert] = []
        suppressed: list[str] = []
        for alert, _ in window.alerts:
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
                del self.windows[run_id]
                out.append(self._release(run_id, window, now_s))
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
            for _, (topic, partition, offset) in window.alerts:
                key = (topic, partition)
                out[key] = min(out.get(key, offset), offset)
        return out
