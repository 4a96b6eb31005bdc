"""The consumer loop every sink runs: its own group, manual commits after durable work.

A sink sees batches of `RawRecord` and says, per topic partition, the lowest offset it
has not yet made durable (`Sink.pending_offsets`). The loop commits, for every assigned
partition, the smaller of the consumer's position and that offset, so a crash never
commits past work that was not done: after a restart the sink sees those records again
and its own dedupe (delivered-id file, archive high-water marks) drops what was done.

Where a group with no committed offset starts is the sink's choice (`StartFrom`): the
alerts sink starts from now (it must not page the past), the archive from the beginning
(it exists to hold the history), and the metrics exporter replays the whole retained log
at every start (its figures are a fold of the log; nothing of it is committed).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from runwatch.common.isolate import BadRecords
from runwatch.schemas.records import RawRecord

logger = logging.getLogger(__name__)

TopicPartitionKey = tuple[str, int]
"""``(topic, partition)``."""


class StartFrom(enum.Enum):
    """Where a sink's consumer starts reading.

    Attributes:
        EARLIEST: The committed offset; a new group reads the whole retained log.
        LATEST: The committed offset; a new group starts at the end (from now).
        REPLAY: The beginning, at every start; nothing is committed (a fold of the log).
    """

    EARLIEST = "earliest"
    LATEST = "latest"
    REPLAY = "replay"


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


def settled_lag(
    previous_ends: Mapping[TopicPartitionKey, int], positions: Mapping[TopicPartitionKey, int]
) -> dict[TopicPartitionKey, int]:
    """Records that were already in each partition at the previous sample and are unread.

    ``previous_ends`` are the end offsets fetched one sampling interval ago. A consumer
    that keeps up has read all of them by now, so its lag is 0 even though the clock's
    ticks (or any steady trickle) land in the partitions between two polls; one that
    falls behind shows how far. Partitions without a previous sample are left out.
    """
    return {tp: max(0, end - positions[tp]) for tp, end in previous_ends.items() if tp in positions}


def join_stalled(pending_since_s: float | None, now_s: float, limit_s: float) -> bool:
    """Whether a rebalance has gone on too long to be waiting for the group.

    Args:
        pending_since_s: When the consumer subscribed or was told its partitions are
            revoked, with no assignment since (None: the last join ended).
        now_s: The loop's clock.
        limit_s: Longest a join may take: past it, the consumer is taken to have
            dropped the join's assignment (`SinkLoop._run_one_consumer`).

    Returns:
        True when a join began at least ``limit_s`` ago and has not ended.
    """
    return pending_since_s is not None and now_s - pending_since_s >= limit_s


class SinkLoop:
    """Runs one sink over a kafka-python consumer until `stop` is set.

    Args:
        sink: The sink.
        bootstrap: Kafka bootstrap address.
        topics: Topics to subscribe to.
        group_id: The sink's own consumer group.
        stop: Set it to stop the loop (it flushes and commits on the way out).
        client_config: Extra kafka-python settings (security).
        start: Where a new group starts (`StartFrom`).
        session_timeout_s: A member silent this long (a SIGKILLed process) loses its
            partitions; until then a restarted sink waits for them.
        poll_timeout_s: Longest a poll waits; bounds how late `Sink.tick` runs.
        lag_interval_s: How often end offsets are fetched for `Sink.on_lag`.
        notify: Where progress notes go (waiting for an assignment, rebalances).
        bootstrap_timeout_s: Longest to wait for the first connection to Kafka.
        clock: Monotonic seconds.

    Attributes:
        ready: Set once partitions are assigned and their start positions resolved: a
            record published after it is read.
        error: What stopped the loop, if anything (never a record: see `bad`).
        bad: The records the sink could not handle (`common.isolate.BadRecords`): each is
            counted, logged once per reason, and passed.
        connected: The consumer was created (the broker answered); False with an
            ``error`` means Kafka could not be reached.
        joins: Assignments received (rebalances joined), across fresh consumers: a
            start on existing topics takes one.
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
        start: StartFrom = StartFrom.EARLIEST,
        session_timeout_s: float = 10.0,
        poll_timeout_s: float = 0.2,
        lag_interval_s: float = 2.0,
        notify: Callable[[str], None] | None = None,
        bootstrap_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sink = sink
        self.bootstrap = bootstrap
        self.topics = list(topics)
        self.group_id = group_id
        self.stop = stop
        self.client_config = dict(client_config or {})
        self.start = start
        self.session_timeout_s = session_timeout_s
        self.poll_timeout_s = poll_timeout_s
        self.lag_interval_s = lag_interval_s
        self.notify = notify or logger.info
        self.bootstrap_timeout_s = bootstrap_timeout_s
        self.connected = False
        self.clock = clock
        self.error: BaseException | None = None
        self.bad = BadRecords(f"sink {sink.name}", logger)
        self.ready = threading.Event()
        self.joins = 0
        self._committed: dict[TopicPartitionKey, int] = {}
        self._read_upto: dict[TopicPartitionKey, int] = {}
        self._previous_ends: dict[TopicPartitionKey, int] = {}
        self._waiting_since: float | None = None
        self._join_pending_since: float | None = None
        self.fresh_consumer_after_s = 3 * session_timeout_s

    def run(self) -> None:
        """Consume until stopped; an exception is kept in `error` and stops the loop."""
        while self._run_one_consumer():
            self.notify(
                f"{self.sink.name}: no assignment {self.fresh_consumer_after_s:g} s after "
                f"group {self.group_id}'s rebalance began; starting a fresh consumer"
            )

    def _run_one_consumer(self) -> bool:
        """One consumer's life; True when it gave up waiting and a fresh one should start.

        kafka-python 3.0.12 can drop a rebalance's assignment: when a poll's timeout ends
        while a rejoin is in flight, and the leader's assignment then makes
        `need_rejoin()` false, `join_group_async` leaves its loop without applying the
        finished join. The member stays in the group, heartbeating, with no partitions
        (or with the revoked ones, no longer fetched) and no further rebalance comes. A
        rejoin caused by metadata (a topic created or grown after the sink started: a
        first deployment) is one such; a start is another unless the topics' metadata
        comes first, which `_run_one_consumer` sees to. The rebalance listener tells a
        join that ended (partitions assigned, even none) from one that was dropped: a
        consumer whose revocation (or subscription) has had no assignment after
        `fresh_consumer_after_s` (three session timeouts: a dead member's partitions are
        free after one) is closed, which leaves the group, and a new one joins.
        """
        from kafka import KafkaConsumer

        session_ms = int(self.session_timeout_s * 1000)
        try:
            consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=self.group_id,
                enable_auto_commit=False,
                auto_offset_reset="latest" if self.start is StartFrom.LATEST else "earliest",
                max_poll_records=2000,
                session_timeout_ms=session_ms,
                heartbeat_interval_ms=max(100, min(3000, session_ms // 3)),
                bootstrap_timeout_ms=int(self.bootstrap_timeout_s * 1000),
                **self.client_config,
            )
        except BaseException as exc:
            # The caller reports it in one line (an unreachable broker is no traceback).
            self.error = exc
            logger.debug("sink %s could not start", self.sink.name, exc_info=True)
            return False
        self.connected = True
        fresh = False
        try:
            consumer.subscribe(self.topics, listener=_listener(self, consumer))
            # The topics' metadata before the first poll joins the group: a join made
            # without it assigns nothing and rejoins when it comes, a rejoin the client
            # can drop (above). With the metadata first, one join assigns every partition.
            consumer.topics()
            self._waiting_since = self._join_pending_since = self.clock()
            fresh = self._loop(consumer)
        except BaseException as exc:
            self.error = exc
            logger.debug("sink %s stopped", self.sink.name, exc_info=True)
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
        return fresh and self.error is None and not self.stop.is_set()

    def _loop(self, consumer: Any) -> bool:
        """Poll until stopped (False) or until a fresh consumer is due (True)."""
        next_lag = 0.0
        next_note = 0.0
        while not self.stop.is_set():
            batch = consumer.poll(timeout_ms=int(self.poll_timeout_s * 1000))
            records = [
                RawRecord(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp)
                for messages in batch.values()
                for m in messages
            ]
            for r in records:
                self._read_upto[(r.topic, r.partition)] = r.offset + 1
            now = self.clock()
            if records:
                self._handle(records, now)
            self.bad.guard("tick", lambda now=now: self.sink.tick(now))  # type: ignore[misc]
            if join_stalled(self._join_pending_since, now, self.fresh_consumer_after_s):
                return True
            if consumer.assignment():
                if self._waiting_since is not None:
                    self._now_reading(consumer)
                if now >= next_lag:
                    next_lag = now + self.lag_interval_s
                    self.sink.on_lag(self._lag(consumer))
                self._commit(consumer)
            elif self._waiting_since is not None and now >= next_note:
                waited = now - self._waiting_since
                if waited >= 2.0:
                    # Fresh metadata from the cluster (topics() always asks the broker): a
                    # first join that saw no partitions (topics just created) rejoins once
                    # the metadata has them. When even that does not bring them, a fresh
                    # consumer is started (`_run_one_consumer`).
                    consumer.topics()
                    self.notify(
                        f"{self.sink.name}: waiting {waited:.0f} s for group {self.group_id} "
                        "to assign partitions (rebalance in progress; partitions of a member "
                        f"that died are freed when its session times out, "
                        f"{self.session_timeout_s:g} s for ours)"
                    )
                    next_note = now + 5.0
        return False

    def _handle(self, records: Sequence[RawRecord], now: float) -> None:
        """Hand the batch to the sink; when it raises, hand it over one record at a time.

        Only the records that raise on their own are lost to the sink (counted in `bad`,
        logged once per reason); the others are handled. Handing a record again is safe:
        every sink is idempotent by id or offset (alert ids, archive high-water marks,
        the metrics' deduplicated counters).
        """
        try:
            self.sink.handle(records, now)
            return
        except Exception:
            logger.debug("sink %s: a batch raised; one record at a time", self.sink.name)
        for r in records:
            where = (r.topic, r.partition, r.offset)
            self.bad.guard("handle", lambda r=r: self.sink.handle([r], now), where)  # type: ignore[misc]

    def _assigned(self, consumer: Any, assigned: Sequence[Any]) -> None:
        from kafka import TopicPartition

        self._committed = {}
        self.joins += 1
        self._join_pending_since = None
        keys = sorted((tp.topic, tp.partition) for tp in assigned)
        if self.start is StartFrom.REPLAY:
            # Partitions read before in this process resume where they were; new ones
            # are replayed from the beginning (the fold is idempotent by id).
            fresh = [TopicPartition(t, p) for t, p in keys if (t, p) not in self._read_upto]
            for t, p in keys:
                if (t, p) in self._read_upto:
                    consumer.seek(TopicPartition(t, p), self._read_upto[(t, p)])
            if fresh:
                consumer.seek_to_beginning(*fresh)
        self.sink.on_assigned(keys)

    def _now_reading(self, consumer: Any) -> None:
        """Partitions came: resolve where each starts, then say so and set `ready`."""
        assigned = consumer.assignment()
        for tp in assigned:
            consumer.position(tp)  # a new group's offset reset happens here
        waited = self.clock() - (self._waiting_since or self.clock())
        self.notify(
            f"{self.sink.name}: assigned {len(assigned)} partition(s) of group "
            f"{self.group_id} after {waited:.1f} s (join {self.joins}); reading"
        )
        self._waiting_since = None
        self.ready.set()

    def _revoked(self, consumer: Any, revoked: Sequence[Any]) -> None:
        self._waiting_since = self._join_pending_since = self.clock()
        if revoked:
            self.sink.flush()
            self._commit(consumer)

    def _lag(self, consumer: Any) -> dict[TopicPartitionKey, int]:
        assigned = list(consumer.assignment())
        ends = {(tp.topic, tp.partition): e for tp, e in consumer.end_offsets(assigned).items()}
        positions = {(tp.topic, tp.partition): consumer.position(tp) for tp in assigned}
        lag = settled_lag(self._previous_ends, positions)
        self._previous_ends = ends
        return lag

    def _commit(self, consumer: Any) -> None:
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        assigned = consumer.assignment()
        if not assigned or self.start is StartFrom.REPLAY:
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


def _listener(loop: SinkLoop, consumer: Any) -> Any:
    """A kafka-python rebalance listener that flushes and commits before partitions move."""
    from kafka import ConsumerRebalanceListener

    class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
        def on_partitions_revoked(self, revoked: Any) -> None:
            loop._revoked(consumer, list(revoked))

        def on_partitions_assigned(self, assigned: Any) -> None:
            loop._assigned(consumer, list(assigned))

    return _Listener()


def start_thread(loop: SinkLoop) -> threading.Thread:
    """Run ``loop`` in a daemon thread named after its sink."""
    thread = threading.Thread(target=loop.run, name=f"sink-{loop.sink.name}", daemon=True)
    thread.start()
    return thread
