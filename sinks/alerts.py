"""The alerts sink: anomalies and restarts to the console and to webhooks, once each.

Reads the anomalies, commands and controller topics with its own consumer group. Each
record becomes at most one `Alert`; an alert whose id the delivery log already holds for
every receiver (an identical duplicate the processors published at-least-once, or one
delivered just before a crash) is dropped. Alerts wait in their run's group window
(`sinks.alert_policy`), pass the per-run rate limit, and go to every receiver; each
delivery is written to the log before the offsets behind it are committed.

A POST whose retries are spent is not lost: the group is written to the log as *pending*
for that receiver and retried with backoff (one request per try, so a dead receiver does
not stall the loop) until it goes through, across restarts. While a receiver owes
deliveries, new ones for it queue behind them, so it gets them in order.
"""

from __future__ import annotations

import logging
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

import msgspec

from runwatch.schemas.events import AnomalyDetected, Severity
from runwatch.schemas.records import Decoded, RawRecord, check
from runwatch.schemas.topics import TopicNames, TopicRole
from runwatch.sinks.alert_format import AlertGroup, alert_of, console_lines, runwatch_payload
from runwatch.sinks.alert_log import DeliveryLog, Pending
from runwatch.sinks.alert_policy import Grouper, Release, pages
from runwatch.sinks.consumer import TopicPartitionKey
from runwatch.sinks.delivery_figures import DeliveryFigures, receiver_label
from runwatch.sinks.webhook import PostResult, RetryPolicy, post_json

logger = logging.getLogger(__name__)

CONSOLE = "console"


class AlertSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the alerts sink delivers.

    Attributes:
        webhooks: URLs to POST each group to (runwatch's JSON, `runwatch_payload`).
        group_wait_s: How long a run's first alert waits for others to share its POST.
        max_alerts_per_min: Per-run rate limit (and burst).
        retry: Attempts, backoff and timeout of a POST.
        console: Print one line per alert.
        min_severity: Verdicts below this severity are not alerted (`sinks.alert_policy.pages`);
            restart and controller events are always alerted.
        pending_max_delay_s: Ceiling of the backoff between tries of a pending delivery.
        cause_wait_s: Longest an alert waits for the alert it follows from.
    """

    webhooks: tuple[str, ...] = ()
    group_wait_s: float = 2.0
    max_alerts_per_min: float = 20.0
    retry: RetryPolicy = RetryPolicy()
    console: bool = True
    min_severity: Severity = "warning"
    pending_max_delay_s: float = 60.0
    cause_wait_s: float = 5.0


class AlertStats(msgspec.Struct, kw_only=True):
    """Counts for operators and tests."""

    alerts: int = 0
    duplicates: int = 0
    suppressed: int = 0
    posts: int = 0
    failed_posts: int = 0
    undecodable: int = 0
    below_min_severity: int = 0
    retried: int = 0


class _Backoff(msgspec.Struct):
    failures: int = 0
    next_s: float = 0.0


Poster = Callable[[str, Any, RetryPolicy], PostResult]


class AlertSink:
    """Turns verdict and restart records into alerts (see the module docstring).

    Args:
        settings: Delivery settings.
        topics: The deployment's topic names.
        log: The delivery log (its file lives in the state directory).
        out: Where console lines go.
        post: How to POST (`sinks.webhook.post_json`).
        figures: Where delivery figures go (served by the metrics exporter); a new one
            when not given.
    """

    name = "alerts"

    def __init__(
        self,
        settings: AlertSettings,
        topics: TopicNames,
        log: DeliveryLog,
        *,
        out: TextIO | None = None,
        post: Poster = post_json,
        figures: DeliveryFigures | None = None,
    ) -> None:
        self.settings = settings
        self.roles = topics.roles(TopicRole.ANOMALIES, TopicRole.COMMANDS, TopicRole.CONTROLLER)
        self.log = log
        self.out = out or sys.stdout
        self.post = post
        self.targets = ((CONSOLE,) if settings.console else ()) + settings.webhooks
        self.grouper = Grouper(
            settings.group_wait_s,
            settings.max_alerts_per_min,
            log.unreported,
            known=log.seen,
            cause_wait_s=settings.cause_wait_s,
        )
        self.stats = AlertStats()
        self._last_now_s = 0.0
        self._backoff: dict[str, _Backoff] = {}
        self._rng = random.Random()
        self.figures = figures or DeliveryFigures()
        for url in settings.webhooks:
            self.figures.add_receiver(url)
        self.figures.add_pending_source(self._owed)

    @property
    def topics(self) -> list[str]:
        """The topics the sink reads."""
        return list(self.roles)

    def on_assigned(self, partitions: Sequence[TopicPartitionKey]) -> None:
        """Nothing to reload: the delivery log is process-wide."""

    def handle(self, records: Sequence[RawRecord], now_s: float) -> None:
        """Put every new alert in its run's window."""
        self._last_now_s = now_s
        for record in records:
            role = self.roles.get(record.topic)
            if role is None:
                continue
            decoded = check(record, role)
            if not isinstance(decoded, Decoded):
                self.stats.undecodable += 1
                logger.warning("alerts: skipped %s: %s", decoded.source, decoded.reason)
                continue
            event = decoded.event
            if isinstance(event, AnomalyDetected) and not pages(
                event.severity, self.settings.min_severity
            ):
                self.stats.below_min_severity += 1
                continue
            alert = alert_of(event)
            if alert is None:
                continue
            source = (record.topic, record.partition, record.offset)
            if self.log.handled(alert.alert_id, self.targets) or not self.grouper.add(
                alert, source, now_s
            ):
                self.stats.duplicates += 1
                continue
            self.stats.alerts += 1

    def tick(self, now_s: float) -> None:
        """Deliver the groups whose window closed."""
        self._last_now_s = now_s
        for release in self.grouper.due(now_s):
            self._deliver(release)
        self._retry_pending(now_s)

    def flush(self) -> None:
        """Deliver every waiting group now."""
        for release in self.grouper.due(self._last_now_s, force=True):
            self._deliver(release)

    def pending_offsets(self) -> Mapping[TopicPartitionKey, int]:
        """Sources of alerts still waiting in a window."""
        return self.grouper.pending_offsets()

    def on_lag(self, lag: Mapping[TopicPartitionKey, int]) -> None:
        """Not used by the alerts sink."""

    def _deliver(self, release: Release) -> None:
        group = release.group
        if release.suppressed_ids:
            self.log.suppressed(release.run_id, release.suppressed_ids)
            self.stats.suppressed += len(release.suppressed_ids)
        if group is None:
            return
        for target in self.targets:
            alerts = tuple(a for a in group.alerts if not self.log.has(target, a.alert_id))
            if not alerts and not group.suppressed:
                continue
            part = msgspec.structs.replace(group, alerts=alerts)
            if target == CONSOLE:
                self._print(part)
            elif not self._post(target, part):
                continue  # owed: written as pending by _post
            self.log.delivered(target, group.run_id, [a.alert_id for a in alerts])
        if group.suppressed:
            self.log.reported(group.run_id, group.suppressed)

    def _print(self, group: AlertGroup) -> None:
        for line in console_lines(group, self.settings.max_alerts_per_min):
            print(line, file=self.out)
        self.out.flush()

    def _send(self, url: str, group: AlertGroup, policy: RetryPolicy) -> PostResult:
        payload = runwatch_payload(group, max_per_min=self.settings.max_alerts_per_min)
        result = self.post(url, payload, policy)
        self.stats.posts += 1
        self.figures.record(url, result.attempts, result.ok)
        return result

    def _owed(self) -> dict[str, int]:
        """Deliveries owed per receiver label (read by the metrics exporter's thread)."""
        owed: dict[str, int] = {}
        for p in list(self.log.owed.values()):
            label = receiver_label(p.target)
            owed[label] = owed.get(label, 0) + 1
        return owed

    def _post(self, url: str, group: AlertGroup) -> bool:
        """Deliver now, or queue as pending; True when it went out."""
        if self.log.pending(url):
            self.log.pend(url, group)  # behind the ones it owes already, in order
            return False
        result = self._send(url, group, self.settings.retry)
        if result.ok:
            return True
        # Bounded retries are spent: keep it owed (durably) and move on, so one dead
        # receiver cannot stall alerts to the others; `_retry_pending` tries again.
        self.stats.failed_posts += 1
        self.log.pend(url, group)
        self._backoff[url] = _Backoff(1, self._last_now_s + self._delay_s(1))
        ids = ", ".join(a.alert_id for a in group.alerts) or "suppression notice"
        print(
            f"runwatch sinks: webhook {receiver_label(url)} failed after {result.attempts} "
            f"attempt(s) ({result.error}); kept pending, will retry: {ids}",
            file=sys.stderr,
            flush=True,
        )
        return False

    def _delay_s(self, failures: int) -> float:
        base = max(self.settings.retry.base_delay_s, 0.01)
        delay = min(self.settings.pending_max_delay_s, base * 2.0**failures)
        return delay * (0.5 + 0.5 * self._rng.random())

    def _retry_pending(self, now_s: float) -> None:
        """One try per receiver whose backoff is over, oldest delivery first.

        Only configured receivers: deliveries owed to a webhook no longer passed stay in
        the log (and come back with it) instead of being sent somewhere unasked.
        """
        once = self.settings.retry._replace(attempts=1)
        receivers = dict.fromkeys(p.target for p in self.log.pending())
        for url in (u for u in receivers if u in self.settings.webhooks):
            backoff = self._backoff.setdefault(url, _Backoff())
            if now_s < backoff.next_s:
                continue
            for owed in self.log.pending(url):
                if not self._send(url, owed.group, once).ok:
                    backoff.failures += 1
                    backoff.next_s = now_s + self._delay_s(backoff.failures)
                    break
                self._retried(owed)
            else:
                del self._backoff[url]

    def _retried(self, owed: Pending) -> None:
        self.log.retried(owed)
        self.stats.retried += 1
        ids = ", ".join(a.alert_id for a in owed.group.alerts) or "suppression notice"
        print(
            f"runwatch sinks: webhook {receiver_label(owed.target)} took the pending "
            f"delivery: {ids}",
            file=sys.stderr,
            flush=True,
        )
