"""The alerts sink: anomalies and restarts to the console and to webhooks, once each.

Reads the anomalies, commands and controller topics with its own consumer group. Each
record becomes at most one `Alert`; an alert whose id the delivery log already holds for
every receiver (an identical duplicate the processors published at-least-once, or one
delivered just before a crash) is dropped. Alerts wait in their run's group window
(`sinks.alert_policy`), pass the per-run rate limit, and go to every receiver; each
delivery is written to the log before the offsets behind it are committed.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TextIO

import msgspec

from processors.intake import Decoded, RawRecord, check
from schemas.events import AnomalyDetected, Severity
from schemas.topics import TopicNames
from sinks.alert_format import (
    AlertGroup,
    alert_of,
    alertmanager_payload,
    console_lines,
    runwatch_payload,
)
from sinks.alert_log import DeliveryLog
from sinks.alert_policy import Grouper, Release, pages
from sinks.consumer import TopicPartitionKey
from sinks.webhook import PostResult, RetryPolicy, post_json

logger = logging.getLogger(__name__)

CONSOLE = "console"
WebhookFormat = Literal["runwatch", "alertmanager"]


class AlertSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the alerts sink delivers.

    Attributes:
        webhooks: URLs to POST each group to.
        webhook_format: ``runwatch`` (its own JSON) or ``alertmanager`` (webhook v4).
        receiver: The ``receiver`` field of Alertmanager payloads.
        group_wait_s: How long a run's first alert waits for others to share its POST.
        max_alerts_per_min: Per-run rate limit (and burst).
        retry: Attempts, backoff and timeout of a POST.
        console: Print one line per alert.
        min_severity: Verdicts below this severity are not alerted (`sinks.alert_policy.pages`);
            restart and controller events are always alerted.
    """

    webhooks: tuple[str, ...] = ()
    webhook_format: WebhookFormat = "runwatch"
    receiver: str = "runwatch"
    group_wait_s: float = 2.0
    max_alerts_per_min: float = 20.0
    retry: RetryPolicy = RetryPolicy()
    console: bool = True
    min_severity: Severity = "warning"


class AlertStats(msgspec.Struct, kw_only=True):
    """Counts for operators and tests."""

    alerts: int = 0
    duplicates: int = 0
    suppressed: int = 0
    posts: int = 0
    failed_posts: int = 0
    undecodable: int = 0
    below_min_severity: int = 0


Poster = Callable[[str, Any, RetryPolicy], PostResult]


class AlertSink:
    """Turns verdict and restart records into alerts (see the module docstring).

    Args:
        settings: Delivery settings.
        topics: The deployment's topic names.
        log: The delivery log (its file lives in the state directory).
        out: Where console lines go.
        post: How to POST (`sinks.webhook.post_json`).
        now_ns: Wall clock, for suppression notices.
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
        now_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.settings = settings
        self.roles = {
            topics.anomalies: "anomalies",
            topics.commands: "commands",
            topics.controller: "controller",
        }
        self.log = log
        self.out = out or sys.stdout
        self.post = post
        self.now_ns = now_ns
        self.targets = ((CONSOLE,) if settings.console else ()) + settings.webhooks
        self.grouper = Grouper(settings.group_wait_s, settings.max_alerts_per_min, log.unreported)
        self.stats = AlertStats()
        self._last_now_s = 0.0

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
            else:
                self._post(target, part)
            self.log.delivered(target, group.run_id, [a.alert_id for a in alerts])
        if group.suppressed:
            self.log.reported(group.run_id, group.suppressed)

    def _print(self, group: AlertGroup) -> None:
        for line in console_lines(group, self.settings.max_alerts_per_min):
            print(line, file=self.out)
        self.out.flush()

    def _post(self, url: str, group: AlertGroup) -> None:
        if self.settings.webhook_format == "alertmanager":
            payload = alertmanager_payload(
                group, receiver=self.settings.receiver, now_ns=self.now_ns()
            )
        else:
            payload = runwatch_payload(group, max_per_min=self.settings.max_alerts_per_min)
        result = self.post(url, payload, self.settings.retry)
        self.stats.posts += 1
        if not result.ok:
            # Bounded retries are spent: say so loudly, with the ids, and move on, so one
            # dead receiver cannot stall alerts to the others.
            self.stats.failed_posts += 1
            ids = ", ".join(a.alert_id for a in group.alerts) or "suppression notice"
            print(
                f"runwatch sinks: webhook {url} failed after {result.attempts} attempt(s) "
                f"({result.error}); not delivered there: {ids}",
                file=sys.stderr,
            )
