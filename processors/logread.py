"""Read topic history: bounded reads of whole topics or of chosen partition spans.

Used by the audit, replay and `runwatch status`: a bounded read (it stops at the end
offsets it saw when it began, so a busy topic cannot keep it reading forever), with no
consumer group (nothing is committed, live consumers are not disturbed).

`read_history` reads every partition of some topics from the beginning (the changelogs,
`runwatch audit --all`). `LogReader` reads chosen ``[start, end)`` spans of single
partitions, which is how one run is audited: its records sit in one partition of each
topic (`partition_for`), from its first record on (`LogReader.offsets_at`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from kafka import KafkaConsumer, TopicPartition
from kafka.partitioner.default import murmur2

from runwatch.common.errors import RunwatchError
from runwatch.common.settings import kafka_client_config
from runwatch.schemas.records import RawRecord

KeyFilter = Callable[[bytes | None], bool]


def partition_for(run_id: str, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a run's key.

    murmur2 of the UTF-8 key, positive, modulo the partition count: what the Java client,
    kafka-python (`RunEmitter`) and aiokafka (the processors' producer) all do, so every
    record keyed by ``run_id`` lands here. Same formula as `processors.app.partition_for`
    (a unit test holds them equal; this one imports no faust).

    Args:
        run_id: The run (the record key).
        partitions: The topic's partition count.

    Returns:
        The partition number.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    return int(murmur2(run_id.encode()) & 0x7FFFFFFF) % partitions


class Span(NamedTuple):
    """Offsets ``[start, end)`` of one partition."""

    start: int
    end: int


def _consumer(client_config: dict[str, Any] | None, bootstrap: str) -> KafkaConsumer:
    return KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        max_poll_records=5000,
        fetch_max_bytes=64 * 1024 * 1024,
        **(client_config if client_config is not None else kafka_client_config()),
    )


class LogReader:
    """Bounded reads of partition spans over one consumer without a group.

    A context manager; every method talks to the broker.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        timeout_s: float = 60.0,
        client_config: dict[str, Any] | None = None,
    ) -> None:
        """Connect.

        Args:
            bootstrap: Kafka bootstrap address.
            timeout_s: A read gives up when no progress is made for this long.
            client_config: Extra kafka-python settings (security).
        """
        self.timeout_s = timeout_s
        self._consumer = _consumer(client_config, bootstrap)

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the consumer."""
        self._consumer.close()

    def partition_count(self, topic: str) -> int:
        """Partitions of ``topic`` from the cluster metadata; 0 when it does not exist."""
        return len(self._consumer.partitions_for_topic(topic) or ())

    def end_offsets(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """The next offset to be written in each partition."""
        return dict(self._consumer.end_offsets(list(partitions))) if partitions else {}

    def offsets_at(
        self, partitions: Sequence[TopicPartition], ts_ms: int | None
    ) -> dict[TopicPartition, int]:
        """The first offset of each partition whose record timestamp is >= ``ts_ms``.

        Every record written with a timestamp at or after ``ts_ms`` is at or after that
        offset (Kafka's time index holds the running maximum timestamp). A partition with
        no such record gives its end offset; ``ts_ms`` None gives the beginning.
        """
        if not partitions:
            return {}
        if ts_ms is None:
            return dict(self._consumer.beginning_offsets(list(partitions)))
        found = self._consumer.offsets_for_times({tp: max(0, ts_ms) for tp in partitions})
        ends = self.end_offsets(partitions)
        return {tp: found[tp].offset if found.get(tp) else ends[tp] for tp in partitions}

    def read(
        self, spans: Mapping[TopicPartition, Span], *, key_filter: KeyFilter | None = None
    ) -> dict[TopicPartition, list[RawRecord]]:
        """The records of each ``[start, end)`` span, in offset order.

        Args:
            spans: Partition -> span; empty spans are skipped.
            key_filter: Keep only records whose key passes.

        Returns:
            Partition -> its records (every partition of ``spans`` present).

        Raises:
            RunwatchError: The broker stopped answering before a span's end was reached.
        """
        out: dict[TopicPartition, list[RawRecord]] = {tp: [] for tp in spans}
        todo = {tp: span for tp, span in spans.items() if span.end > span.start}
        if not todo:
            return out
        consumer = self._consumer
        consumer.assign(list(todo))
        for tp, span in todo.items():
            consumer.seek(tp, span.start)
        for record in _drain(consumer, {tp: s.end for tp, s in todo.items()}, self.timeout_s):
            if key_filter is None or key_filter(record.key):
                out[TopicPartition(record.topic, record.partition)].append(record)
        consumer.assign([])
        return out


def read_history(
    bootstrap: str,
    topics: Sequence[str],
    *,
    key_filter: KeyFilter | None = None,
    timeout_s: float = 60.0,
    client_config: dict[str, Any] | None = None,
) -> dict[str, list[RawRecord]]:
    """Every record of ``topics`` from offset 0 to the current end, per topic.

    Args:
        bootstrap: Kafka bootstrap address.
        topics: Topic names; missing topics yield empty lists.
        key_filter: Keep only records whose key passes (e.g. one run and ticks).
        timeout_s: Give up when no progress is made for this long.
        client_config: Extra kafka-python settings (security).

    Returns:
        Topic name -> records, each partition's records in offset order, partitions in
        ascending order.

    Raises:
        RunwatchError: The broker stopped answering before the end offsets were reached.
    """
    out: dict[str, list[RawRecord]] = {t: [] for t in topics}
    by_partition: dict[TopicPartition, list[RawRecord]] = {}
    consumer = _consumer(client_config, bootstrap)
    try:
        partitions = [
            TopicPartition(t, p)
            for t in topics
            for p in sorted(consumer.partitions_for_topic(t) or ())
        ]
        if not partitions:
            return out
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = {tp: off for tp, off in consumer.end_offsets(partitions).items() if off > 0}
        for record in _drain(consumer, end, timeout_s):
            if key_filter is None or key_filter(record.key):
                by_partition.setdefault(TopicPartition(record.topic, record.partition), []).append(
                    record
                )
    finally:
        consumer.close()
    for tp in sorted(by_partition, key=lambda tp: (tp.topic, tp.partition)):
        out[tp.topic].extend(by_partition[tp])
    return out


def _drain(
    consumer: KafkaConsumer, end: dict[TopicPartition, int], timeout_s: float
) -> Iterator[RawRecord]:
    remaining = dict(end)
    idle_polls = 0
    poll_ms = 500
    while remaining:
        batch = consumer.poll(timeout_ms=poll_ms)
        if not batch:
            # a span that ends in a gap (compaction) yields nothing more: done when the
            # fetch position has moved past its end
            for tp in [tp for tp, stop in remaining.items() if consumer.position(tp) >= stop]:
                del remaining[tp]
                consumer.pause(tp)
            idle_polls += 1
            if idle_polls * poll_ms / 1000 > timeout_s:
                missing = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in remaining)
                raise RunwatchError(f"timed out reading history of {missing}")
            continue
        idle_polls = 0
        for tp, messages in batch.items():
            stop = remaining.get(tp)
            if stop is None:
                continue
            for m in messages:
                if m.offset >= stop:
                    break
                yield RawRecord(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp)
            if consumer.position(tp) >= stop:
                del remaining[tp]
                consumer.pause(tp)


class TopicTail:
    """Follow topics from their beginning without a consumer group, decoding nothing.

    For live views and tests: ``poll()`` returns whatever arrived since the last call.
    """

    def __init__(self, bootstrap: str, topics: Sequence[str], **config: Any) -> None:
        """Assign every partition of ``topics`` and seek to the beginning.

        Args:
            bootstrap: Kafka bootstrap address.
            topics: Topic names (they must exist).
            **config: Extra kafka-python consumer settings.
        """
        self._consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            **{**kafka_client_config(), **config},
        )
        partitions = [
            TopicPartition(t, p)
            for t in topics
            for p in sorted(self._consumer.partitions_for_topic(t) or ())
        ]
        self._consumer.assign(partitions)
        self._consumer.seek_to_beginning(*partitions)

    def poll(self, timeout_s: float = 0.0) -> list[RawRecord]:
        """Records that arrived since the last call (waiting up to ``timeout_s`` for some)."""
        batch = self._consumer.poll(timeout_ms=int(timeout_s * 1000))
        return [
            RawRecord(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp)
            for tp in sorted(batch, key=lambda tp: (tp.topic, tp.partition))
            for m in batch[tp]
        ]

    def close(self) -> None:
        """Close the consumer."""
        self._consumer.close()
