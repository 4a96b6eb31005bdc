"""The metrics sink: a Prometheus exporter of every run's figures on /metrics.

It reads the steps, heartbeats, anomalies, commands and controller topics with its own
consumer group, folds them into `sinks.metrics_state.FleetFigures`, and renders them at
scrape time through a custom collector registered in its own `CollectorRegistry` (so
several exporters can live in one process, and a retired run's label sets simply stop
being rendered). Served metrics (label ``run`` unless said otherwise):

* ``runwatch_run_loss``, ``runwatch_run_grad_norm``: of the last step;
* ``runwatch_run_mfu_ratio`` (0..1), ``runwatch_run_tokens_per_second``: of the last step;
  an MFU above 1 is exported as computed (not clamped), with
  ``runwatch_run_mfu_implausible`` 1 and a warning logged once per run;
* ``runwatch_run_live_ranks``: ranks that heartbeat within the live window (log time);
* ``runwatch_run_last_step``, ``runwatch_run_incarnation``;
* ``runwatch_anomalies_total{run,kind}``, ``runwatch_restarts_total`` (restart commands),
  ``runwatch_restart_outcomes_total{run,outcome}`` (completed, failed, rejected, covered);
* ``runwatch_consumer_lag_records{topic,partition}``: records that were already in the
  partition one sampling interval ago and that the exporter has not read yet (so the
  clock's ticks, landing every second, do not keep it above 0 for a consumer that keeps
  up; see `sinks.consumer.settled_lag`);
* ``runwatch_runs_tracked``: runs with label sets (at most ``--metrics-max-runs``);
  ``runwatch_runs_evicted_total``: runs dropped to keep under that bound;
* ``runwatch_run_last_event_timestamp_seconds``, ``runwatch_run_ended``: log time of the
  run's newest event, and 1 once it ended (RunEnded): a run silent for long that has not
  ended stopped reporting (``compose/prometheus/rules``);
* ``runwatch_dead_letters_total{topic,stage}``: records the processors could not apply
  (the deadletter topic), by the topic they were read from and the stage that failed;
* ``runwatch_metrics_caught_up``: 1 once the exporter has read every partition to its
  end since it started.

The figures are a fold of the log: at every start the exporter replays the topics from
the beginning of their retention (`sinks.consumer.StartFrom.REPLAY`, nothing committed),
so a restart shows the same per-run gauges and counters as before it, finished runs
included. Until the replay has caught up (every partition's settled lag 0) only the lag
and ``runwatch_metrics_caught_up 0`` are served: a scrape in the middle of the replay
would show counters below their value, which Prometheus takes for a reset (a false jump
in ``rate``/``increase``). Collectors of other sinks in the process (delivery figures of
the alert receivers, the processors' group probe) are served from the same registry.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from runwatch.schemas.codec import DecodeError, decode
from runwatch.schemas.events import DeadLetter, Event
from runwatch.schemas.records import Decoded, RawRecord, check
from runwatch.schemas.topics import TopicNames, TopicRole
from runwatch.sinks.consumer import TopicPartitionKey
from runwatch.sinks.metrics_state import FleetFigures, MetricsPolicy, RunFigures

logger = logging.getLogger(__name__)

_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("runwatch_run_loss", "Loss of the run's last step.", "loss"),
    ("runwatch_run_grad_norm", "Gradient norm of the run's last step.", "grad_norm"),
    (
        "runwatch_run_mfu_ratio",
        "Model FLOPs utilisation of the last step (0..1; above 1 is exported as computed "
        "and flagged by runwatch_run_mfu_implausible).",
        "mfu_ratio",
    ),
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
        self.caught_up = False

    def collect(self) -> Iterator[Metric]:
        """The metric families, from a consistent snapshot (only the lag before catching up)."""
        with self.lock:
            caught_up = self.caught_up
            evicted_n = self.figures.evicted
            runs = sorted(self.figures.runs.values(), key=lambda f: f.run_id)
            live = {f.run_id: self.figures.live_ranks(f) for f in runs}
            families = [*self._run_families(runs, live), self._dead_letters()]
            lag = GaugeMetricFamily(
                "runwatch_consumer_lag_records",
                "Records already in the partition one sampling interval ago that the "
                "metrics consumer has not read yet (0 when it keeps up, ticks included).",
                labels=["topic", "partition"],
            )
            for (topic, partition), n in sorted(self.lag.items()):
                lag.add_metric([topic, str(partition)], n)
        done = GaugeMetricFamily(
            "runwatch_metrics_caught_up",
            "1 once the exporter has read every partition to its end since it started "
            "(before that only the lag is served).",
        )
        done.add_metric([], 1.0 if caught_up else 0.0)
        yield done
        yield lag
        if not caught_up:
            return
        tracked = GaugeMetricFamily("runwatch_runs_tracked", "Runs with label sets.")
        tracked.add_metric([], len(runs))
        evicted = CounterMetricFamily(
            "runwatch_runs_evicted",
            "Runs dropped because more than the exporter's --metrics-max-runs were tracked.",
        )
        evicted.add_metric([], evicted_n)
        yield from families
        yield tracked
        yield evicted

    def _dead_letters(self) -> Metric:
        family = CounterMetricFamily(
            "runwatch_dead_letters",
            "Records the processors could not apply (the deadletter topic), by the topic "
            "they were read from and the stage that failed (decode, fold, encode).",
            labels=["topic", "stage"],
        )
        for (topic, stage), n in sorted(self.figures.dead_letters.items()):
            family.add_metric([topic, stage], n)
        return family

    def _run_families(self, runs: list[RunFigures], live: dict[str, int]) -> list[Metric]:
        out: list[Metric] = []
        for name, doc, attr in _GAUGES:
            family = GaugeMetricFamily(name, doc, labels=["run"])
            for fig in runs:
                value = getattr(fig, attr)
                if value is not None:
                    family.add_metric([fig.run_id], float(value))
            out.append(family)
        implausible = GaugeMetricFamily(
            "runwatch_run_mfu_implausible",
            "1 when the last step's MFU is above 1: impossible, the run's declared peak "
            "FLOP/s (or model size) is wrong.",
            labels=["run"],
        )
        ranks = GaugeMetricFamily(
            "runwatch_run_live_ranks", "Ranks with a recent heartbeat (log time).", labels=["run"]
        )
        last_event = GaugeMetricFamily(
            "runwatch_run_last_event_timestamp_seconds",
            "Log time of the run's newest event (its producers' clocks), seconds since the epoch.",
            labels=["run"],
        )
        ended = GaugeMetricFamily(
            "runwatch_run_ended",
            "1 once the run ended (RunEnded), 0 while it runs.",
            labels=["run"],
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
            if fig.mfu_ratio is not None:
                implausible.add_metric([fig.run_id], 1.0 if fig.mfu_implausible else 0.0)
            ranks.add_metric([fig.run_id], live[fig.run_id])
            last_event.add_metric([fig.run_id], fig.last_ns / 1e9)
            ended.add_metric([fig.run_id], 0.0 if fig.ended_ns is None else 1.0)
            for kind, n in sorted(fig.anomalies.items()):
                anomalies.add_metric([fig.run_id, kind], n)
            restarts.add_metric([fig.run_id], fig.restarts)
            for outcome, n in sorted(fig.outcomes.items()):
                outcomes.add_metric([fig.run_id, outcome], n)
        return [*out, implausible, ranks, last_event, ended, anomalies, restarts, outcomes]


class MetricsSink:
    """Folds records into the fleet's figures and serves them.

    Args:
        topics: The deployment's topic names.
        policy: Live window, cardinality rule and time bound.
        collectors: More collectors to serve from the same registry.
        wall_ns: Wall clock, nanoseconds (only ever an upper bound on log time).
    """

    name = "metrics"

    def __init__(
        self,
        topics: TopicNames,
        policy: MetricsPolicy | None = None,
        collectors: Sequence[Any] = (),
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.wall_ns = wall_ns
        self.roles = topics.roles(
            TopicRole.STEPS,
            TopicRole.HEARTBEATS,
            TopicRole.ANOMALIES,
            TopicRole.COMMANDS,
            TopicRole.CONTROLLER,
            TopicRole.DEADLETTER,
        )
        self.figures = FleetFigures(policy)
        self.max_future_ns = int(self.figures.policy.max_future_s * 1e9)
        self.lock = threading.Lock()
        self.collector = FleetCollector(self.figures, self.lock)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        for extra in collectors:
            self.registry.register(extra)
        self.server: Any = None
        self.mfu_warned: set[str] = set()
        self.assigned: set[TopicPartitionKey] = set()

    @property
    def topics(self) -> list[str]:
        """The topics the sink reads."""
        return list(self.roles)

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve /metrics on ``addr:port`` (0: any free port); returns the port.

        Raises:
            OSError: The address cannot be bound (the port is taken, say).
        """
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
        """Remember the partitions: the figures are served once all are read to their end."""
        self.assigned = set(partitions)

    @staticmethod
    def _event(record: RawRecord, role: str) -> Event | None:
        if role == TopicRole.DEADLETTER:  # the processors' own output, no input role to check
            try:
                event = decode(record.value or b"")
            except DecodeError:
                return None
            return event if isinstance(event, DeadLetter) else None
        out = check(record, role)
        return out.event if isinstance(out, Decoded) else None

    def _bound_ns(self, record: RawRecord) -> int:
        """The latest time ``record``'s events may claim (`sinks.metrics_state`).

        Its broker timestamp, never past the wall clock, plus the policy's ``max_future_s``.
        """
        wall_ns = self.wall_ns()
        broker_ns = record.timestamp_ms * 1_000_000 if record.timestamp_ms > 0 else wall_ns
        return min(broker_ns, wall_ns) + self.max_future_ns

    def handle(self, records: Sequence[RawRecord], now_s: float) -> None:
        """Fold a batch (times bounded per record); then apply the cardinality rule."""
        decoded = []
        for record in records:
            role = self.roles.get(record.topic)
            event = None if role is None else self._event(record, role)
            if event is not None:
                decoded.append((event, record.partition, self._bound_ns(record)))
        with self.lock:
            for event, partition, bound_ns in decoded:
                self.figures.apply(event, partition, bound_ns)
            self.figures.prune()
            implausible = [
                f
                for f in self.figures.runs.values()
                if f.mfu_implausible and f.run_id not in self.mfu_warned
            ]
        for fig in implausible:
            self.mfu_warned.add(fig.run_id)
            logger.warning(
                "run %s: MFU %.2f at step %s is above 1, which is impossible: its declared "
                "peak FLOP/s or model size is wrong (exported as is, flagged by "
                "runwatch_run_mfu_implausible; warned once per run)",
                fig.run_id,
                fig.mfu_ratio,
                fig.last_step,
            )

    def tick(self, now_s: float) -> None:
        """Nothing is time-driven."""

    def flush(self) -> None:
        """Nothing to make durable: the figures are rebuilt from the log at every start."""

    def pending_offsets(self) -> Mapping[TopicPartitionKey, int]:
        """Nothing pending."""
        return {}

    def on_lag(self, lag: Mapping[TopicPartitionKey, int]) -> None:
        """Keep the latest lag per partition for the next scrape; note the first catch-up."""
        with self.lock:
            self.collector.lag = dict(lag)
            if (
                not self.collector.caught_up
                and self.assigned
                and self.assigned <= set(lag)
                and not any(lag[tp] for tp in self.assigned)
            ):
                self.collector.caught_up = True
