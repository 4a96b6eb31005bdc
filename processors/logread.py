"""Read topic history from the beginning up to the end offsets seen at the start.

Used by the audit, replay and `runwatch status`: a bounded read (it stops at the end
offsets it saw when it began, so a busy topic cannot keep it reading forever), with no
consumer group (nothing is committed, live consumers are not disturbed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from processors.intake import RawRecord
from runwatch.errors import RunwatchError
from runwatch.settings import kafka_client_config

KeyFilter = Callable[[bytes | None], bool]


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
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        max_poll_records=5000,
        fetch_max_bytes=64 * 1024 * 1024,
        **(client_config if client_config is not None else kafka_client_config()),
    )
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
