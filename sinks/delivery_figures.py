"""Delivery figures of every alert receiver (webhooks and Alertmanagers), for /metrics.

One object per `runwatch sinks` process, shared by the alerts sink (webhooks) and the
Alertmanager sink, and served by the metrics exporter in the same process as:

* ``runwatch_alert_deliveries_pending{receiver}``: deliveries a receiver still owes (a
  webhook: groups whose retries were spent, retried with backoff; an Alertmanager: alert
  states it has not accepted yet);
* ``runwatch_alert_delivery_failed_attempts_total{receiver}``: requests that failed (each
  retry counts);
* ``runwatch_alert_deliveries_total{receiver}``: requests that went through.

``receiver`` is the URL's scheme, host and port only (webhook paths often hold tokens).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from urllib.parse import urlsplit

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


def receiver_label(url: str) -> str:
    """A receiver's metric label: scheme, host and port only (paths often hold tokens)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")


PendingSource = Callable[[], Mapping[str, int]]
"""Returns deliveries owed now, by receiver label."""


class DeliveryFigures:
    """Requests and pending deliveries per receiver (thread-safe); a Prometheus collector."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ok: dict[str, int] = {}
        self._failed: dict[str, int] = {}
        self._pending: list[PendingSource] = []

    def add_receiver(self, url: str) -> None:
        """Show ``url``'s figures from now on, at 0 until something happens."""
        label = receiver_label(url)
        with self._lock:
            self._ok.setdefault(label, 0)
            self._failed.setdefault(label, 0)

    def add_pending_source(self, source: PendingSource) -> None:
        """Count what ``source`` says is owed at every scrape."""
        with self._lock:
            self._pending.append(source)

    def record(self, url: str, attempts: int, ok: bool) -> None:
        """One delivery: ``attempts`` requests, the last of which went through when ``ok``."""
        label = receiver_label(url)
        with self._lock:
            self._failed[label] = self._failed.get(label, 0) + attempts - (1 if ok else 0)
            self._ok[label] = self._ok.get(label, 0) + (1 if ok else 0)

    def delivered(self, url: str) -> int:
        """Requests to ``url``'s receiver that went through."""
        with self._lock:
            return self._ok.get(receiver_label(url), 0)

    def failed_attempts(self, url: str) -> int:
        """Requests to ``url``'s receiver that failed."""
        with self._lock:
            return self._failed.get(receiver_label(url), 0)

    def collect(self) -> Iterator[Metric]:
        """The metric families, from a snapshot."""
        with self._lock:
            ok, failed, sources = dict(self._ok), dict(self._failed), list(self._pending)
        owed = dict.fromkeys(ok, 0)
        for source in sources:
            for label, n in source().items():
                owed[label] = owed.get(label, 0) + n
        pending = GaugeMetricFamily(
            "runwatch_alert_deliveries_pending",
            "Alert deliveries a receiver still owes (retried with backoff until they go through).",
            labels=["receiver"],
        )
        attempts = CounterMetricFamily(
            "runwatch_alert_delivery_failed_attempts",
            "Alert delivery requests that failed (each retry counts).",
            labels=["receiver"],
        )
        posts = CounterMetricFamily(
            "runwatch_alert_deliveries",
            "Alert delivery requests that went through.",
            labels=["receiver"],
        )
        for label in sorted(owed):
            pending.add_metric([label], owed[label])
            attempts.add_metric([label], failed.get(label, 0))
            posts.add_metric([label], ok.get(label, 0))
        yield pending
        yield attempts
        yield posts
