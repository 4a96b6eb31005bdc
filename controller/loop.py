"""The controller loop: read restart commands, let the gate decide, supervise the gangs.

A thin I/O loop over `controller.command_gate` (the decision) and `controller.supervisor`
(a run's gang); `controller.agent.build_controller` assembles it. Kafka use:

* commands: a `KafkaConsumer` without a consumer group, assigned every partition of the
  commands topic (every controller sees every command; each acts only on the runs it
  owns), starting per partition at the smallest position any owned run needs: the run's
  launch offset, or the offset of the last command it acted on (that command is read
  again after a controller restart, and the processed ids make the gate refuse it as
  replayed);
* the controller topic: RestartCompleted, RestartFailed and CommandRejected, keyed by run
  id, with ``ts_ns`` the time of the event (controller-side facts, not verdicts), sent by
  the `EventPublisher` the supervisors are made with;
* the heartbeats topic: a RankExited (exit evidence) for every rank exit the supervisor
  notices, keyed by run id, at most ``POLL_MS`` after the exit;
* RunEnded for an incarnation the controller ends (stopped for a restart, failed when a
  dead gang got no command in time) goes through a `RunEmitter`, like a rank's would;
* a run launched with ``--log-format`` gets a `controller.logwatch.LogWatch`, which turns
  rank 0's output into the run's events after every poll and hears of each
  RestartCompleted.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from common.errors import RunwatchError
from common.settings import kafka_client_config
from controller.command_gate import OwnedGang, decide
from controller.logwatch import LogWatch, emitter_for
from controller.relay import RelayServer
from controller.state import GangRecord
from controller.supervisor import RunSupervisor
from schemas.codec import DecodeError, decode, encode, encode_key
from schemas.events import CommandRejected, Event, Provenance, RankExited, RestartRequested
from schemas.signing import CommandKey
from schemas.topics import names

log = logging.getLogger(__name__)

POLL_MS = 100
"""Longest wait for commands between two looks at the gangs (an exit is published within it)."""


def commands_end_offsets(bootstrap: str, prefix: str) -> dict[int, int]:
    """The commands topic's end offset per partition (a run's launch offsets).

    Raises:
        RunwatchError: The commands topic does not exist.
    """
    topic = names(prefix).commands
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        **kafka_client_config(),
    )
    try:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            raise RunwatchError(
                f"topic {topic} does not exist: start `runwatch processors` or run "
                f"`runwatch topics create` first"
            )
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in parts])
        return {tp.partition: int(off) for tp, off in ends.items()}
    finally:
        consumer.close()


def announce_end(record: GangRecord, status: str, reason: str) -> None:
    """Emit RunEnded for ``record``'s incarnation through a `RunEmitter`, and wait for it."""
    emitter = emitter_for(record)
    emitter.run_ended(status, reason=reason)
    if not emitter.close(timeout_s=30.0):
        log.warning("run %s: RunEnded(%s) may not have been delivered", record.run_id, status)


class EventPublisher:
    """Sends controller-side events to Kafka and waits for each ack.

    Made before the supervisors (they are given its `publish`) and handed to the
    `Controller`, which closes it. A run with a log watch has it told of every event
    published for the run (a RestartCompleted is the watch's next resume point).

    Args:
        bootstrap: Kafka bootstrap address.
        prefix: Topic name prefix.
        watches: Log watches by run id (runs launched with ``--log-format``); the
            `Controller` given the same watches drives and closes them.
    """

    def __init__(self, bootstrap: str, prefix: str, watches: Mapping[str, LogWatch]) -> None:
        self.topics = names(prefix)
        self.watches = dict(watches)
        self.producer = KafkaProducer(
            bootstrap_servers=bootstrap, acks="all", linger_ms=0, **kafka_client_config()
        )

    def publish(self, event: Event) -> None:
        """Send a controller-side event and wait for the ack.

        A `schemas.events.RankExited` goes to the heartbeats topic (it is liveness evidence,
        read in one partition order with the run's heartbeats), everything else to the
        controller topic; both keyed by run id.
        """
        topic = self.topics.heartbeats if isinstance(event, RankExited) else self.topics.controller
        future = self.producer.send(topic, key=encode_key(event.run_id), value=encode(event))
        future.get(timeout=30)
        watch = self.watches.get(event.run_id)
        if watch is not None:
            watch.on_event(event)

    def close(self) -> None:
        """Close the producer."""
        self.producer.close(timeout=10)


class Controller:
    """Serves the commands of the runs it supervises until every run has ended.

    Args:
        runs: The supervised runs (all on the same bootstrap and prefix), each made with
            ``publisher.publish``.
        keys: Command keys by key id (empty: every command is rejected).
        bootstrap: Kafka bootstrap address.
        publisher: Where controller-side events go; the controller closes it.
        watches: The publisher's log watches by run id; observed after every poll.
        relays: The node relays the runs' ranks write to (`controller.relay`); closed
            last, after the gangs ended.
    """

    def __init__(
        self,
        runs: list[RunSupervisor],
        keys: Mapping[str, CommandKey],
        bootstrap: str,
        publisher: EventPublisher,
        watches: Mapping[str, LogWatch],
        relays: Sequence[RelayServer] = (),
    ) -> None:
        self.runs = {r.run_id: r for r in runs}
        self.relays = list(relays)
        self.keys = dict(keys)
        self.publisher = publisher
        self.watches = dict(watches)
        self.topics = publisher.topics
        self.stop_requested: int | None = None
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            **kafka_client_config(),
        )
        self._assign()

    def _start_offset(self, partition: int) -> int | None:
        wanted = [
            max(
                r.record.launch_offsets.get(partition, 0),
                r.record.consumer_offsets.get(partition, 0),
            )
            for r in self.runs.values()
        ]
        return min(wanted) if wanted else None

    def _assign(self) -> None:
        topic = self.topics.commands
        parts = sorted(self.consumer.partitions_for_topic(topic) or ())
        if not parts:
            raise RunwatchError(f"topic {topic} does not exist")
        tps = [TopicPartition(topic, p) for p in parts]
        self.consumer.assign(tps)
        for tp in tps:
            start = self._start_offset(tp.partition)
            self.consumer.seek(tp, start or 0)

    # ------------------------------------------------------------------ input

    def handle(self, record: Any, received_s: float) -> None:
        """Decide on one commands-topic record and act on it."""
        source = Provenance(topic=record.topic, partition=record.partition, offset=record.offset)
        try:
            command = decode(record.value)
        except DecodeError as exc:
            log.warning("undecodable record at %s: %s", source, exc.reason)
            return
        if not isinstance(command, RestartRequested):
            return
        run = self.runs.get(command.run_id)
        if run is not None and source.offset < run.record.consumer_offsets.get(
            source.partition, -1
        ):
            return  # before the last command this run acted on: settled long ago
        gangs = {
            r.run_id: OwnedGang(r.run_id, r.record.incarnation, r.record.launch_offsets)
            for r in self.runs.values()
            if not r.finished
        }
        processed = run.state.processed if run is not None else frozenset()
        decision = decide(command, source, gangs=gangs, keys=self.keys, processed=processed)
        if decision.verdict == "ignore":
            log.debug("ignored command %s: %s", command.command_id, decision.reason)
            return
        assert run is not None
        run.note_offset(source.partition, source.offset)
        if decision.verdict == "reject":
            log.warning(
                "run %s: rejected command %s: %s", run.run_id, command.command_id, decision.reason
            )
            self.publisher.publish(
                CommandRejected(
                    run_id=command.run_id,
                    ts_ns=time.time_ns(),
                    command_id=command.command_id,
                    reason=decision.reason,
                    source=source,
                )
            )
            return
        log.warning(
            "run %s: executing %s %s (cause %s, incarnation %d)",
            run.run_id,
            command.action,
            command.command_id,
            command.cause_kind,
            command.incarnation,
        )
        run.execute(command, received_s)

    # ------------------------------------------------------------------ loop

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requested = signum

    def serve(self) -> int:
        """Run until every supervised run ended; 0 if all completed, else 1 (or 128+signal)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        try:
            while not all(r.finished for r in self.runs.values()):
                if self.stop_requested is not None:
                    for run in self.runs.values():
                        if not run.finished:
                            run.stop()
                    return 128 + self.stop_requested
                batches = self.consumer.poll(timeout_ms=POLL_MS)
                received_s = time.monotonic()
                for records in batches.values():
                    for record in records:
                        self.handle(record, received_s)
                now_s = time.monotonic()
                for run in self.runs.values():
                    run.observe(now_s)
                    watch = self.watches.get(run.run_id)
                    if watch is not None:
                        watch.observe(run)
        finally:
            self.close()
        return 0 if all(r.record.status == "completed" for r in self.runs.values()) else 1

    def close(self) -> None:
        """Close the log watches' emitters, the commands consumer and the publisher."""
        for watch in self.watches.values():
            watch.close()
        self.consumer.close()
        self.publisher.close()
        for relay in self.relays:
            relay.close()


__all__ = ["Controller", "EventPublisher", "announce_end", "commands_end_offsets"]
