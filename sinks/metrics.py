"""The metrics sink: a Prometheus exporter of every run's figures on /metrics.

It reads the steps, heartbeats, anomalies, commands and controller topics with its own
consumer group, folds them into `sinks.metrics_state.FleetFigures`, and renders them at
scrape time through a custom collector registered in its own `CollectorRegistry` (so
several exporters can live in one process, and a retired run's label sets simply stop
being rendered). Served metrics (label ``run`` unless said otherwise):

* ``runwatch_run_loss``, ``runwatch_run_grad_norm``: of the last step;
* ``runwatch_run_mfu_ratio`` (0..1), ``runwatch_run_tokens_per_second``: of the last step;
* ``runwatch_run_live_ranks``: ranks that heartbeat within the live window (log time);
* ``runwatch_run_last_step``, ``runwatch_run_incarnation``;
* ``runwatch_anomalies_total{run,kind}``, ``runwatch_restarts_total`` (restart commands),
  ``runwatch_restart_outcomes_total{run,outcome}`` (completed, failed, rejected);
* ``runwatch_consumer_lag_records{topic,partition}``: records between the exporter's
  position and the end of each partition it reads;
* ``runwatch_runs_tracked``: runs with label sets.

Counters count what this exporter has read since its group's committed offsets: after a
restart they begin again from 0, which Prometheus' ``rate`` and ``increase`` treat as a
counter reset.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from processors.intake import Decoded, RawRecord, check
from schemas.topics import TopicNames
from sinks.consumer import TopicPartitionKey
from sinks.metrics_state import FleetFigures, MetricsPolicy, RunFigures

logger = logging.getLogger(__name__)

_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("runwatch_run_loss", "Loss of the run's last step.", "loss"),
    ("runwatch_run_grad_norm", "Gradient norm of the run's last step.", "grad_norm"),
    ("runwatch_run_mfu_ratio", "Model FLOPs utilisation of the last step (0..1).", "mfu_ratio"),
    ("runwatch_run_tokens_per_second", "Tokens/s of the last step (whole gang).", "tokens_per_s"),
    ("runwatch_run_last_step", "The run's last completed optimizer step.", "last_step"),
    ("runwatch_run_incarnation", "Gang incarnation (+1 per restart).", "incarnation"),
)


class FleetCollector:
    """Renders `FleetFigures` as metric families at scrape time (thread-safe)."""

    def __init__(self, figures: FleetFigures, lock: threading.Lock) -> None:
        self.figures = figures
        self.lock = lock
        self.lag: dict[TopicPartitionKey, int] = {}

    def collect(self) -> Iterator[Metric]:
        """The metric families, from a consistent snapshot."""
        with self.lock:
            runs = sorted(self.figures.runs.values(), key=lambda f: f.run_id)
            live = {f.run_id: self.figures.live_ranks(f) for f in runs}
            families = self._run_families(runs, live)
            lag = GaugeMetricFamily(
                "runwatch_consumer_lag_records",
                "Records between the metrics consumer's position and the partition end.",
                labels=["topic", "partition"],
            )
            for (topic, partition), n in sorted(self.lag.items()):
                lag.add_metric([topic, str(partition)], n)
        tracked = GaugeMetricFamily("runwatch_runs_tracked", "Runs with label sets.")
        tracked.add_metric([], len(runs))
        yield from families
        yield lag
        yield tracked

    def _run_families(self, runs: list[RunFigures], live: dict[str, int]) -> list[Metric]:
        out: list[Metric] = []
        for name, doc, attr in _GAUGES:
            family = GaugeMetricFamily(name, doc, labels=["run"])
            for fig in runs:
                value = getattr(fig, attr)
                if value is not None:
                    family.add_metric([fig.run_id], float(value))
            out.append(family)
        ranks = GaugeMetricFamily(
            "runwatch_run_live_ranks", "Ranks with a recent heartbeat (log time).", labels=["run"]
        )
        anomalies = CounterMetricFamily(
            "runwatch_anomalies", "Anomaly verdicts, by kind.", labels=["run", "kind"]
        )
        restarts = CounterMetricFamily(
            "runwatch_restarts", "Restart commands issued by the policy.", labels=["run"]
        )
        outcomes = CounterMetricFamily(
            "runwatch_restart_outcomes",
            "Controller outcomes of restart commands.",
            labels=["run", "outcome"],
        )
        for fig in runs:
            ranks.add_metric([fig.run_id], live[fig.run_id])
            for kind, n in sorted(fig.anomalies.items()):
                anomalies.add_metric([fig.run_id, kind], n)
            restarts.add_metric([fig.run_id], fig.restarts)
            for outcome, n in sorted(fig.outcomes.items()):
                outcomes.add_metric([fig.run_id, outcome], n)
        return [*out, ranks, anomalies, restarts, outcomes]


class MetricsSink:
    """Folds records into the fleet's figures and serves them.

    Args:
        topics: The deployment's topic names.
        policy: Live window and cardinality rule.
    """

    name = "metrics"

    def __init__(self, topics: TopicNames, policy: MetricsPolicy | None = None) -> None:
        self.roles = {
            topics.steps: "steps",
            topics.heartbeats: "heartbeats",
            topics.anomalies: "anomalies",
            topics.commands: "commands",
            topics.controller: "controller",
        }
        self.figures = FleetFigures(policy)
        self.lock = threading.Lock()
        self.collector = FleetCollector(self.figures, self.lock)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.server: Any = None

    @property
    def topics(self) -> list[str]:
        """The topics the sink reads."""
        return list(self.roles)

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve /metrics on ``addr:port`` (0: any free port); returns the port."""
        from prometheus_client import start_http_server

        self.server, _ = start_http_server(port, addr=addr, registry=self.registry)
        return int(self.server.server_port)

    def close(self) -> None:
        """Stop serving."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def on_assigned(self, partitions: Sequence[TopicPartitionKey]) -> None:
        """Nothing to reload."""

    def handle(self, records: Sequence[RawRecord], now_s: float) -> None:
        """Fold a batch; then apply the cardinality rule."""
        decoded = []
        for record in records:
            role = self.roles.get(record.topic)
            if role is None:
                continue
            out = check(record, role)
            if isinstance(out, Decoded):
                decoded.append((out.event, record.partition))
        with self.lock:
            for event, partition in decoded:
                self.figures.apply(event, partition)
            self.figures.prune()

    def tick(self, now_s: float) -> None:
        """Nothing is time-driven."""

    def flush(self) -> None:
        """Nothing to make durable: the figures are rebuilt from the log."""

    def pending_offsets(self) -> Mapping[TopicPartitionKey, int]:
        """Nothing pending."""
        return {}

    def on_lag(self, lag: Mapping[TopicPartitionKey, int]) -> None:
        """Keep the latest lag per partition for the next scrape."""
        with self.lock:
            self.collector.lag = dict(lag)
