"""How far behind the processors are, and how many of their workers are there: for /metrics.

The processors commit an input offset only after the verdicts of the records before it are
published (`processors.lag`), so ``end offset - committed offset`` of each partition their
consumer group committed on is the records they have not judged yet. The probe asks the
brokers every ``interval_s`` through one admin client, from its own thread (a slow broker
never delays a scrape), and serves:

* ``runwatch_processor_lag_records{topic,partition}``: records not yet processed;
* ``runwatch_processor_workers``: members of the processors' consumer group (0: no worker
  is running);
* ``runwatch_processor_probe_failures_total``: samples that failed (the brokers did not
  answer, or the sinks' Kafka user may not describe the group); the figures then keep
  their last values and ``runwatch_processor_probe_ok`` is 0.

Its principal needs DESCRIBE on the processors' group and on the topics (Kafka ACLs).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from runwatch.sinks.consumer import TopicPartitionKey

logger = logging.getLogger(__name__)


class GroupSample(NamedTuple):
    """One look at the processors' group.

    Attributes:
        lag: Records not yet processed, per partition the group committed on.
        workers: Members of the group.
    """

    lag: dict[TopicPartitionKey, int]
    workers: int


def group_lag(
    committed: Mapping[TopicPartitionKey, int], ends: Mapping[TopicPartitionKey, int]
) -> dict[TopicPartitionKey, int]:
    """``end - committed`` per partition with both (never below 0: the end is read later)."""
    return {tp: max(0, ends[tp] - off) for tp, off in committed.items() if tp in ends}


def _members(described: Any, group: str) -> int:
    """Members of ``group`` in a `KafkaAdminClient.describe_groups` answer."""
    info = described.get(group) if isinstance(described, Mapping) else None
    if info is None:
        return 0
    members = info.get("members") if isinstance(info, Mapping) else getattr(info, "members", ())
    return len(members or ())


class GroupProbe:
    """Samples the processors' group every ``interval_s`` in a thread; a Prometheus collector.

    Args:
        bootstrap: Kafka bootstrap address.
        group: The processors' consumer group (their app id).
        client_config: Extra kafka-python settings (security).
        interval_s: Time between samples.
    """

    def __init__(
        self,
        bootstrap: str,
        group: str,
        *,
        client_config: Mapping[str, Any] | None = None,
        interval_s: float = 10.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.client_config = dict(client_config or {})
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._sample: GroupSample | None = None
        self._ok = False
        self._failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="processor-group-probe", daemon=True)
        self._admin: Any = None

    def start(self) -> None:
        """Start sampling."""
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and close the admin client."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def sample(self) -> GroupSample:
        """Ask the brokers now (raises what kafka-python raises)."""
        from kafka import KafkaAdminClient, TopicPartition
        from kafka.admin import OffsetSpec

        if self._admin is None:
            self._admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, **self.client_config)
        admin = self._admin
        found = admin.list_group_offsets({self.group: None}).get(self.group, {})
        committed = {
            (tp.topic, tp.partition): meta.offset
            for tp, meta in found.items()
            if meta is not None and meta.offset >= 0
        }
        ends: dict[TopicPartitionKey, int] = {}
        if committed:
            specs = {TopicPartition(t, p): OffsetSpec.LATEST for t, p in committed}
            answer = admin.list_partition_offsets(specs)
            ends = {(tp.topic, tp.partition): int(o.offset) for tp, o in answer.items()}
        workers = _members(admin.describe_groups([self.group]), self.group)
        return GroupSample(group_lag(committed, ends), workers)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._once()
                self._stop.wait(self.interval_s)
        finally:
            if self._admin is not None:
                self._admin.close()

    def _once(self) -> None:
        try:
            got = self.sample()
        except Exception as exc:
            with self._lock:
                self._failures += 1
                first = self._ok or self._failures == 1
                self._ok = False
            if first:
                logger.warning(
                    "processor group probe: cannot describe group %s (%s: %s); "
                    "runwatch_processor_probe_ok is 0 until it can",
                    self.group,
                    type(exc).__name__,
                    exc,
                )
            if self._admin is not None:
                self._admin.close()
                self._admin = None
            return
        with self._lock:
            self._sample, self._ok = got, True

    def collect(self) -> Iterator[Metric]:
        """The metric families, from the last sample."""
        with self._lock:
            got, ok, failures = self._sample, self._ok, self._failures
        probe_ok = GaugeMetricFamily(
            "runwatch_processor_probe_ok",
            "1 when the last look at the processors' consumer group succeeded.",
            labels=["group"],
        )
        probe_ok.add_metric([self.group], 1.0 if ok else 0.0)
        failed = CounterMetricFamily(
            "runwatch_processor_probe_failures",
            "Looks at the processors' consumer group that failed.",
            labels=["group"],
        )
        failed.add_metric([self.group], failures)
        yield probe_ok
        yield failed
        if got is None:
            return
        lag = GaugeMetricFamily(
            "runwatch_processor_lag_records",
            "Records the processors have not processed yet (end offset - committed offset).",
            labels=["group", "topic", "partition"],
        )
        for (topic, partition), n in sorted(got.lag.items()):
            lag.add_metric([self.group, topic, str(partition)], n)
        workers = GaugeMetricFamily(
            "runwatch_processor_workers",
            "Members of the processors' consumer group (running workers).",
            labels=["group"],
        )
        workers.add_metric([self.group], got.workers)
        yield lag
        yield workers
