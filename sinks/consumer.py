"""The consumer loop every sink runs: its own group, manual commits after durable work.

A sink sees batches of `RawRecord` and says, per topic partition, the lowest offset it
has not yet made durable (`Sink.pending_offsets`). The loop commits, for every assigned
partition, the smaller of the consumer's position and that offset, so a crash never
commits past work that was not done: after a restart the sink sees those records again
and its own dedupe (delivered-id file, archive high-water marks) drops what was done.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from processors.intake import RawRecord

logger = logging.getLogger(__name__)

TopicPartitionKey = tuple[str, int]
"""``(topic, partition)``."""


class Sink(Protocol):
    """What the loop drives."""

    name: str

    def on_assigned(self, partitions: Sequence[TopicPartitionKey]) -> None:
        """Partitions were assigned (reload whatever resume state depends on them)."""
        ...

    def handle(self, records: Sequence[RawRecord], now_s: float) -> None:
        """Take a batch (each partition's records in offset order)."""
        ...

    def tick(self, now_s: float) -> None:
        """Called after every poll, with or without records: flush what is due."""
        ...

    def flush(self) -> None:
        """Make everything taken durable now (before a revocation or shutdown)."""
        ...

    def pending_offsets(self) -> Mapping[TopicPartitionKey, int]:
        """Lowest offset per partition taken but not yet durable (absent: none)."""
        ...

    def on_lag(self, lag: Mapping[TopicPartitionKey, int]) -> None:
        """Records between the consumer's position and the end, per partition."""
        ...


def commit_offsets(
    positions: Mapping[TopicPartitionKey, int], pending: Mapping[TopicPartitionKey, int]
) -> dict[TopicPartitionKey, int]:
    """The offsets safe to commit: the position, held back to the first pending record."""
    return {tp: min(pos, pending.get(tp, pos)) for tp, pos in positions.items()}


class SinkLoop:
    """Runs one sink over a kafka-python consumer until `stop` is set.

    Args:
        sink: The sink.
        bootstrap: Kafka bootstrap address.
        topics: Topics to subscribe to.
        group_id: The sink's own consumer group.
        stop: Set it to stop the loop (it flushes and commits on the way out).
        client_config: Extra kafka-python settings (security).
        poll_timeout_s: Longest a poll waits; bounds how late `Sink.tick` runs.
        lag_interval_s: How often end offsets are fetched for `Sink.on_lag`.
        clock: Monotonic seconds.
    """

    def __init__(
        self,
        sink: Sink,
        *,
        bootstrap: str,
        topics: Sequence[str],
        group_id: str,
        stop: threading.Event,
        client_config: Mapping[str, Any] | None = None,
        poll_timeout_s: float = 0.2,
        lag_interval_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sink = sink
        self.bootstrap = bootstrap
        self.topics = list(topics)
        self.group_id = group_id
        self.stop = stop
        self.client_config = dict(client_config or {})
        self.poll_timeout_s = poll_timeout_s
        self.lag_interval_s = lag_interval_s
        self.clock = clock
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self._committed: dict[TopicPartitionKey, int] = {}

    def run(self) -> None:
        """Consume until stopped; an exception is kept in `error` and stops the loop."""
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=2000,
            **self.client_config,
        )
        try:
            consumer.subscribe(self.topics, listener=_listener(self, consumer))
            self._loop(consumer)
        except BaseException as exc:
            self.error = exc
            logger.exception("sink %s stopped", self.sink.name)
        finally:
            try:
                if self.error is None:
                    self.sink.flush()
                    self._commit(consumer)
            except Exception as exc:
                # Not fatal: what was not committed is read again and deduplicated.
                logger.warning("sink %s: final commit failed: %s", self.sink.name, exc)
            finally:
                consumer.close(autocommit=False)

    def _loop(self, consumer: Any) -> None:
        next_lag = 0.0
        while not self.stop.is_set():
            batch = consumer.poll(timeout_ms=int(self.poll_timeout_s * 1000))
            records = [
                RawRecord(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp)
                for messages in batch.values()
                for m in messages
            ]
            now = self.clock()
            if records:
                self.sink.handle(records, now)
            self.sink.tick(now)
            if consumer.assignment():
                self.ready.set()
                if now >= next_lag:
                    next_lag = now + self.lag_interval_s
                    self.sink.on_lag(_lag(consumer))
                self._commit(consumer)

    def _commit(self, consumer: Any) -> None:
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        assigned = consumer.assignment()
        if not assigned:
            return
        positions = {(tp.topic, tp.partition): consumer.position(tp) for tp in assigned}
        safe = commit_offsets(positions, self.sink.pending_offsets())
        todo = {tp: off for tp, off in safe.items() if self._committed.get(tp) != off}
        if not todo:
            return
        consumer.commit(
            {TopicPartition(t, p): OffsetAndMetadata(off, "", -1) for (t, p), off in todo.items()}
        )
        self._committed.update(todo)


def _lag(consumer: Any) -> dict[TopicPartitionKey, int]:
    assigned = list(consumer.assignment())
    ends = consumer.end_offsets(assigned)
    return {
        (tp.topic, tp.partition): max(0, ends.get(tp, 0) - consumer.position(tp)) for tp in assigned
    }


def _listener(loop: SinkLoop, consumer: Any) -> Any:
    """A kafka-python rebalance listener that flushes and commits before partitions move."""
    from kafka import ConsumerRebalanceListener

    class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
        def on_partitions_revoked(self, revoked: Any) -> None:
            if revoked:
                loop.sink.flush()
                loop._commit(consumer)

        def on_partitions_assigned(self, assigned: Any) -> None:
            loop._committed = {}
            loop.sink.on_assigned([(tp.topic, tp.partition) for tp in assigned])

    return _Listener()


def start_thread(loop: SinkLoop) -> threading.Thread:
    """Run ``loop`` in a daemon thread named after its sink."""
    thread = threading.Thread(target=loop.run, name=f"sink-{loop.sink.name}", daemon=True)
    thread.start()
    return thread
