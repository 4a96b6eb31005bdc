"""The Alertmanager sink: runwatch's alert conditions, kept current in Alertmanager's API v2.

Alertmanager holds alert *states* keyed by their label sets: a sender posts every firing
alert again and again (Prometheus every minute), each time with an ``endsAt`` a few
re-sends ahead, and posts it once more with the ``endsAt`` at which it ended. Grouping,
routing, silences, inhibition and repeat intervals are Alertmanager's.

This sink reads the runs, anomalies, commands and controller topics from the beginning of
their retention at every start (`sinks.consumer.StartFrom.REPLAY`, nothing committed)
and folds them per run into alert conditions (`sinks.alert_conditions`): the state is
rebuilt from the log, so a restart neither fires anything twice (the rebuilt alerts have
the same labels and start times, which Alertmanager takes as the same alerts) nor leaves
anything firing forever (what ended while the sink was down is posted as ended). Until
the replay has caught up (every partition's settled lag is 0) nothing is posted; then
every alert that fires, or ended within ``keep_s``, is posted at once.

After that:

* an alert that changed (a new verdict, an end) is posted to every Alertmanager at once;
  a *new* alert waits ``settle_s`` first, so that facts read out of order across the four
  topics (a RunStarted with the run's tags, a command behind its outcome) settle its
  labels, and an alert that ended within that wait is never posted;
* every firing alert is posted again every ``resend_s``, with ``endsAt`` ``horizon_s``
  ahead (or its own end when that comes first): an alert whose sender died resolves by
  itself after ``horizon_s``; an alert that ended is posted again with each re-send for
  `RESOLVED_RESEND_S` (Alertmanager ignores an end that is still ahead of its clock);
* only verdicts of at least ``min_severity`` are posted.

Each Alertmanager (``--alertmanager``, repeatable: a cluster's members each get every
alert, as from Prometheus) has its own `AlertmanagerClient`: a thread that posts the latest
state of every alert it has not accepted yet, in batches, and retries with backoff
(``backoff * 2**n``, at most ``pending_max_delay_s``) for as long as it takes, so one that
is down never stalls the others or the consumer. When one comes back after failures it is
sent every active alert again (a restarted Alertmanager has forgotten them). Every request
is counted (`sinks.delivery_figures`).

Every sinks process reads every partition (its consumer group is its own), like two
Prometheus servers that each evaluate every rule: two processes make a highly available
pair and Alertmanager deduplicates what both post.
"""

from __future__ import annotations

import itertools
import logging
import random
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final
from urllib.parse import quote

import msgspec

from runwatch.schemas.events import Severity
from runwatch.schemas.records import Decoded, RawRecord, check
from runwatch.schemas.topics import TopicNames, TopicRole
from runwatch.sinks.alert_conditions import (
    AlertState,
    Fingerprint,
    RunAlerts,
    alerts_of,
    apply,
    fold,
    prune,
)
from runwatch.sinks.alert_format import rfc3339
from runwatch.sinks.alert_policy import pages
from runwatch.sinks.alert_rules import rule_of
from runwatch.sinks.consumer import TopicPartitionKey
from runwatch.sinks.delivery_figures import DeliveryFigures, receiver_label
from runwatch.sinks.webhook import PostResult, RetryPolicy, is_retryable, post_json

logger = logging.getLogger(__name__)

API_PATH: Final = "/api/v2/alerts"
"""Where Alertmanager takes alerts (a JSON list of PostableAlert)."""

RUNBOOKS: Final = "docs/runbooks.md"
"""The default base of ``runbook_url``: the runbooks page of runwatch's documentation."""

NS_PER_S: Final = 1_000_000_000

RESOLVED_RESEND_S: Final = 900.0
"""Alerts that ended are posted again with each re-send this long (as Prometheus does):
Alertmanager keeps the later of two future ``endsAt``, so an end posted while still ahead
of its clock (a clock that lags the log's) only takes once it is in the past."""


def _say(message: str) -> None:
    print(f"runwatch sinks: {message}", file=sys.stderr, flush=True)


class AlertmanagerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the Alertmanager sink posts.

    Attributes:
        urls: Alertmanager base URLs (``http://host:9093``); each gets every alert.
        min_severity: Verdicts below it are not posted.
        resend_s: Firing alerts are posted again this often (well within Alertmanager's
            ``resolve_timeout``, 5 min by default).
        horizon_s: ``endsAt`` of a firing alert is this far ahead of each post.
        settle_s: A new alert waits this long before its first post.
        keep_s: Ended alerts are kept (and posted after a restart) this long.
        retry: Backoff base and request timeout (one request per try).
        pending_max_delay_s: Longest wait between tries to an Alertmanager that is down.
        ui_url: Base URL of the web view (``runwatch ui``); the run's page is each
            alert's ``generatorURL``. None: no link.
        runbook_url: Base of each alert's ``runbook_url`` (``<base>#<kind's anchor>``).
        batch_max: Most alerts in one request.
    """

    urls: tuple[str, ...]
    min_severity: Severity = "warning"
    resend_s: float = 60.0
    horizon_s: float = 240.0
    settle_s: float = 2.0
    keep_s: float = 3600.0
    retry: RetryPolicy = RetryPolicy()
    pending_max_delay_s: float = 60.0
    ui_url: str | None = None
    runbook_url: str = RUNBOOKS
    batch_max: int = 1000


def run_page(ui_url: str, run_id: str) -> str:
    """The web view's page of ``run_id``."""
    return f"{ui_url.rstrip('/')}/run/{quote(run_id, safe='')}"


def postable(alert: AlertState, settings: AlertmanagerSettings, now_ns: int) -> dict[str, Any]:
    """``alert`` as an Alertmanager API v2 PostableAlert, posted at ``now_ns``.

    A firing alert's ``endsAt`` is ``horizon_s`` ahead, or its own end when that comes
    first; an ended one's is its end. ``endsAt`` is never before ``startsAt`` (Alertmanager
    refuses that).
    """
    ends_ns = min(alert.ends_ns, now_ns + int(settings.horizon_s * NS_PER_S))
    annotations = dict(alert.annotations)
    annotations["runbook_url"] = f"{settings.runbook_url}#{rule_of(alert.kind).runbook}"
    item: dict[str, Any] = {
        "labels": dict(alert.labels),
        "annotations": annotations,
        "startsAt": rfc3339(alert.starts_ns),
        "endsAt": rfc3339(max(alert.starts_ns, ends_ns)),
    }
    if settings.ui_url:
        item["generatorURL"] = run_page(settings.ui_url, alert.run_id)
    return item


# --------------------------------------------------------------------------- one Alertmanager


Poster = Callable[[str, Any, RetryPolicy], PostResult]


class AlertmanagerClient:
    """Posts alert states to one Alertmanager from its own thread, until each is accepted.

    Args:
        url: The Alertmanager's base URL.
        retry: Backoff base and request timeout (each try is one request).
        max_delay_s: Longest wait between tries while it is down.
        figures: Where requests are counted.
        batch_max: Most alerts in one request.
        post: How to POST (`sinks.webhook.post_json`).
        say: Where outage and recovery lines go.
    """

    def __init__(
        self,
        url: str,
        *,
        retry: RetryPolicy,
        max_delay_s: float,
        figures: DeliveryFigures,
        batch_max: int = 1000,
        post: Poster = post_json,
        say: Callable[[str], None] = _say,
    ) -> None:
        self.url = url
        self.endpoint = url.rstrip("/") + API_PATH
        self.label = receiver_label(url)
        self.once = retry._replace(attempts=1)
        self.max_delay_s = max_delay_s
        self.figures = figures
        self.batch_max = batch_max
        self.post = post
        self.say = say
        self.failures = 0
        self._pending: dict[Fingerprint, dict[str, Any]] = {}
        self._next_try_s = 0.0
        self._resync = False
        self._in_flight = False
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._rng = random.Random()
        self._thread = threading.Thread(
            target=self._run, name=f"alertmanager-{self.label}", daemon=True
        )
        figures.add_receiver(url)

    def start(self) -> None:
        """Start posting."""
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop after the request in flight, if any (what is pending is not sent)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def offer(self, items: Mapping[Fingerprint, dict[str, Any]]) -> None:
        """Post these alert states (each replaces a pending older state of its alert)."""
        if not items:
            return
        with self._cond:
            self._pending.update(items)
            self._cond.notify_all()

    def pending_count(self) -> int:
        """Alerts whose latest state it has not accepted yet."""
        with self._cond:
            return len(self._pending)

    def wait_delivered(self, timeout_s: float) -> bool:
        """Wait until nothing is pending or in flight; False when ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._pending or self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def take_resync(self) -> bool:
        """True once after it came back from an outage (send it every active alert)."""
        with self._cond:
            resync, self._resync = self._resync, False
            return resync

    def _next_batch(self) -> dict[Fingerprint, dict[str, Any]] | None:
        with self._cond:
            while not self._stop.is_set():
                wait_s = self._next_try_s - time.monotonic()
                if self._pending and wait_s <= 0:
                    self._in_flight = True
                    return dict(itertools.islice(self._pending.items(), self.batch_max))
                self._cond.wait(wait_s if self._pending else None)
            return None

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            result = self.post(self.endpoint, list(batch.values()), self.once)
            self.figures.record(self.url, result.attempts, result.ok)
            self._settle(batch, result)

    def _delay_s(self) -> float:
        base = max(self.once.base_delay_s, 0.01)
        delay = min(self.max_delay_s, base * 2.0 ** (self.failures - 1))
        return delay * (0.5 + 0.5 * self._rng.random())

    def _settle(self, batch: Mapping[Fingerprint, dict[str, Any]], result: PostResult) -> None:
        final = result.ok or not is_retryable(result.status)
        with self._cond:
            if final:
                for fp, item in batch.items():
                    if self._pending.get(fp) is item:  # not replaced by a newer state meanwhile
                        del self._pending[fp]
            was_down = self.failures
            if result.ok:
                self.failures, self._next_try_s = 0, 0.0
                self._resync = self._resync or was_down > 0
            elif not final:
                self.failures += 1
                self._next_try_s = time.monotonic() + self._delay_s()
            owed = len(self._pending)
            self._in_flight = False
            self._cond.notify_all()
        if result.ok and was_down:
            self.say(
                f"alertmanager {self.label} is back after {was_down} failed request(s): it "
                f"took {len(batch)} alert(s); sending it every active alert again"
            )
        elif not result.ok and final:
            self.say(
                f"alertmanager {self.label} refused {len(batch)} alert(s) "
                f"({result.error}); not retried: a refused alert does not get better"
            )
        elif not result.ok and self.failures == 1:
            self.say(
                f"alertmanager {self.label} failed ({result.error}); {owed} alert(s) "
                f"pending, retried with backoff (at most {self.max_delay_s:g} s apart)"
            )


# --------------------------------------------------------------------------- the sink


class AlertmanagerStats(msgspec.Struct, kw_only=True):
    """Counts for operators and tests.

    Attributes:
        records: Records folded.
        undecodable: Records skipped (not a valid event for their topic).
        failed: Records whose fold raised (skipped, logged).
        changes: Alert states changed by the records folded.
        snapshots: Times every active alert was offered (caught up, or a receiver came back).
    """

    records: int = 0
    undecodable: int = 0
    failed: int = 0
    changes: int = 0
    snapshots: int = 0


class AlertmanagerSink:
    """Folds verdicts into alert conditions and keeps every Alertmanager current.

    Args:
        settings: Where and how to post.
        topics: The deployment's topic names.
        figures: Delivery figures (served by the metrics exporter); a new one when not given.
        wall_ns: Wall clock: the time against which alerts fire or have ended.
        post: How to POST (`sinks.webhook.post_json`).
        say: Where outage and recovery lines go.
    """

    name = "alertmanager"

    def __init__(
        self,
        settings: AlertmanagerSettings,
        topics: TopicNames,
        *,
        figures: DeliveryFigures | None = None,
        wall_ns: Callable[[], int] = time.time_ns,
        post: Poster = post_json,
        say: Callable[[str], None] = _say,
    ) -> None:
        self.settings = settings
        self.roles = topics.roles(
            TopicRole.RUNS, TopicRole.ANOMALIES, TopicRole.COMMANDS, TopicRole.CONTROLLER
        )
        self.wall_ns = wall_ns
        self.figures = figures or DeliveryFigures()
        self.clients = [
            AlertmanagerClient(
                url,
                retry=settings.retry,
                max_delay_s=settings.pending_max_delay_s,
                figures=self.figures,
                batch_max=settings.batch_max,
                post=post,
                say=say,
            )
            for url in settings.urls
        ]
        self.figures.add_pending_source(self._owed)
        self.runs: dict[str, RunAlerts] = {}
        self.latest: dict[Fingerprint, AlertState] = {}
        self.sent: set[Fingerprint] = set()
        self.staged: dict[Fingerprint, float] = {}
        self.assigned: set[TopicPartitionKey] = set()
        self.caught_up = False
        self.stats = AlertmanagerStats()
        self._next_resend_s = 0.0
        self._next_prune_s = 0.0
        for client in self.clients:
            client.start()

    @property
    def topics(self) -> list[str]:
        """The topics the sink reads."""
        return list(self.roles)

    def _owed(self) -> dict[str, int]:
        return {c.label: c.pending_count() for c in self.clients}

    # ------------------------------------------------------------ the Sink protocol

    def on_assigned(self, partitions: Sequence[TopicPartitionKey]) -> None:
        """Hold posts until the newly assigned partitions are read up to their end."""
        self.assigned = set(partitions)
        self.caught_up = False

    def on_lag(self, lag: Mapping[TopicPartitionKey, int]) -> None:
        """Once every partition is read to its end, post every active alert."""
        if self.caught_up or not self.assigned or not self.assigned <= set(lag):
            return
        if any(lag[tp] for tp in self.assigned):
            return
        self.caught_up = True
        self.staged.clear()
        for state in self.runs.values():  # folded without rendering while replaying
            for fp, alert in alerts_of(state).items():
                if pages(alert.severity, self.settings.min_severity):
                    self.latest[fp] = alert
        now_ns = self.wall_ns()
        horizon = now_ns - int(self.settings.keep_s * NS_PER_S)
        current = {fp: a for fp, a in self.latest.items() if a.ends_ns >= horizon}
        self.sent |= set(current)
        self._offer(current.values(), now_ns)
        self.stats.snapshots += 1

    def handle(self, records: Sequence[RawRecord], now_s: float) -> None:
        """Fold a batch; post what changed (once caught up)."""
        now_ns = self.wall_ns()
        for record in records:
            role = self.roles.get(record.topic)
            if role is None:
                continue
            decoded = check(record, role)
            if not isinstance(decoded, Decoded):
                self.stats.undecodable += 1
                logger.warning("alertmanager: skipped %s: %s", decoded.source, decoded.reason)
                continue
            event = decoded.event
            try:
                if self.caught_up:
                    state, changed = fold(self.runs.get(event.run_id), event)
                else:  # replaying: the alerts are rendered once, when caught up
                    state, changed = apply(self.runs.get(event.run_id), event), []
            except Exception:
                self.stats.failed += 1
                logger.exception("alertmanager: could not fold %s", decoded.source)
                continue
            self.runs[event.run_id] = state
            self.stats.records += 1
            self._changed(changed, now_s, now_ns)

    def _changed(self, alerts: Iterable[AlertState], now_s: float, now_ns: int) -> None:
        post = []
        for alert in alerts:
            if not pages(alert.severity, self.settings.min_severity):
                continue
            self.stats.changes += 1
            fp = alert.fingerprint
            self.latest[fp] = alert
            if not self.caught_up:
                continue
            if fp in self.sent:
                post.append(alert)
            elif alert.firing_at(now_ns):
                self.staged.setdefault(fp, now_s)
        self._offer(post, now_ns)

    def tick(self, now_s: float) -> None:
        """Post settled new alerts, re-send firing ones when due, forget old ones."""
        if not self.caught_up:
            return
        now_ns = self.wall_ns()
        settled = [
            fp for fp, since in self.staged.items() if now_s - since >= self.settings.settle_s
        ]
        new = []
        for fp in settled:
            del self.staged[fp]
            alert = self.latest.get(fp)
            if alert is not None and alert.firing_at(now_ns):
                self.sent.add(fp)
                new.append(alert)
        self._offer(new, now_ns)
        if now_s >= self._next_resend_s:
            self._next_resend_s = now_s + self.settings.resend_s
            recent = now_ns - int(RESOLVED_RESEND_S * NS_PER_S)
            self._offer(
                [self.latest[fp] for fp in self.sent if self.latest[fp].ends_ns > recent], now_ns
            )
        for client in self.clients:
            if client.take_resync():
                self.stats.snapshots += 1
                active = [self.latest[fp] for fp in self.sent if self.latest[fp].firing_at(now_ns)]
                client.offer(self._items(active, now_ns))
        if now_s >= self._next_prune_s:
            self._next_prune_s = now_s + 60.0
            self.prune(now_ns)

    def flush(self) -> None:
        """Nothing to make durable: the state is rebuilt from the log at every start."""

    def pending_offsets(self) -> Mapping[TopicPartitionKey, int]:
        """Nothing: the sink commits no offsets (it replays at every start)."""
        return {}

    def close(self) -> None:
        """Stop the clients (alerts not yet accepted are posted by the next start)."""
        for client in self.clients:
            client.stop()

    # ------------------------------------------------------------ helpers

    def prune(self, now_ns: int) -> None:
        """Forget alerts that ended more than ``keep_s`` ago, and runs with nothing left."""
        horizon = now_ns - int(self.settings.keep_s * NS_PER_S)
        for fp in [fp for fp, a in self.latest.items() if a.ends_ns < horizon]:
            del self.latest[fp]
            self.sent.discard(fp)
            self.staged.pop(fp, None)
        for run_id, state in list(self.runs.items()):
            kept = prune(state, now_ns, self.settings.keep_s)
            if kept is None:
                del self.runs[run_id]
            elif kept is not state:
                self.runs[run_id] = kept

    def _items(
        self, alerts: Iterable[AlertState], now_ns: int
    ) -> dict[Fingerprint, dict[str, Any]]:
        return {a.fingerprint: postable(a, self.settings, now_ns) for a in alerts}

    def _offer(self, alerts: Iterable[AlertState], now_ns: int) -> None:
        items = self._items(alerts, now_ns)
        for client in self.clients:
            client.offer(items)
