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
* a multi-node gang's agents get a `PeerWatch`: a consumer of the runs topic (the run's
  RunStarted says what its backend declares) and the controller topic (the other agents'
  AgentReady on a restart), both read from their end when the agent starts, and a
  consumer that reads, on a restart, the one anomalies-topic record a command names as its
  ``source`` (the verdict whose rank the node failure budget charges);
* a run launched with ``--log-format`` gets a `controller.logwatch.LogWatch`, which turns
  rank 0's output into the run's events after every poll and hears of each
  RestartCompleted.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from types import FrameType
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from runwatch.common.errors import RunwatchError
from runwatch.common.isolate import BadRecords
from runwatch.common.settings import kafka_client_config
from runwatch.controller.command_gate import REPLAYED, SHADOW, OwnedGang, decide
from runwatch.controller.logwatch import LogWatch, emitter_for
from runwatch.controller.relay import RelayServer
from runwatch.controller.state import GangRecord, LaunchSpec
from runwatch.controller.supervisor import RunSupervisor
from runwatch.schemas.codec import DecodeError, decode, encode, encode_key
from runwatch.schemas.events import (
    AgentReady,
    AnomalyDetected,
    BackendDeclaration,
    CommandRejected,
    Event,
    EventPack,
    Provenance,
    RankExited,
    RestartRequested,
    RunStarted,
)
from runwatch.schemas.signing import CommandKey
from runwatch.schemas.topics import names

log = logging.getLogger(__name__)

POLL_MS = 100
"""Longest wait for commands between two looks at the gangs (an exit is published within it)."""
EXIT_DROPPED = 3
"""`Controller.serve`'s status when this node was dropped from its run (the run goes on)."""
CAUSE_TIMEOUT_S = 30.0
"""Longest an agent tries to read the verdict a command names."""


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


def announce_end(spec: LaunchSpec, record: GangRecord, status: str, reason: str) -> None:
    """Emit RunEnded for ``record``'s incarnation through a `RunEmitter`, and wait for it."""
    emitter = emitter_for(spec, record)
    emitter.run_ended(status, reason=reason)
    if not emitter.close(timeout_s=30.0):
        log.warning("run %s: RunEnded(%s) may not have been delivered", spec.run_id, status)


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


class PeerWatch:
    """What the agents of multi-node gangs hear from each other and from their runs.

    Reads the runs topic (RunStarted: the backend's declaration) and the controller topic
    (AgentReady), every partition, from their end at construction (before the gang's
    ranks start), and only when asked: on a restart; and, with a consumer of its own, the
    verdict a restart command names (`cause`). Implements `controller.supervisor.Peers`.

    Args:
        bootstrap: Kafka bootstrap address.
        prefix: Topic name prefix.
        run_ids: The runs to follow.
        check_ready: Why an AgentReady may not be believed, empty to believe it
            (`controller.peer_auth.check_ready` with the agent's keys); one refused is
            logged, counted in ``refused_ready`` and ignored.
    """

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        run_ids: Collection[str],
        *,
        check_ready: Callable[[AgentReady], str],
    ) -> None:
        topics = names(prefix)
        self.anomalies_topic = topics.anomalies
        self.run_ids = frozenset(run_ids)
        self.check_ready = check_ready
        self.refused_ready = 0
        self.backends: dict[str, tuple[int, BackendDeclaration]] = {}
        self.bad = BadRecords("peer watch", log)
        self.ready: dict[tuple[str, int], dict[int, AgentReady]] = {}
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            **kafka_client_config(),
        )
        self.tps = [
            TopicPartition(topic, p)
            for topic in (topics.runs, topics.controller)
            for p in sorted(self.consumer.partitions_for_topic(topic) or ())
        ]
        self.consumer.assign(self.tps)
        self.consumer.seek_to_end(*self.tps)
        for tp in self.tps:  # resolve the lazy seek now: later records are the ones wanted
            self.consumer.position(tp)
        try:
            self.lookup = KafkaConsumer(
                bootstrap_servers=bootstrap,
                group_id=None,
                enable_auto_commit=False,
                **kafka_client_config(),
            )
        except BaseException:
            self.consumer.close()
            raise
        try:
            # Connect and learn the anomalies topic's leaders now, not on the restart's clock.
            warm = [
                TopicPartition(self.anomalies_topic, p)
                for p in sorted(self.lookup.partitions_for_topic(self.anomalies_topic) or ())
            ]
            self.lookup.assign(warm)
            self.lookup.seek_to_end(*warm)
            for tp in warm:
                self.lookup.position(tp)
        except BaseException:
            self.consumer.close()
            self.lookup.close()
            raise

    def _fold(self, event: Event) -> None:
        if isinstance(event, EventPack):
            for inner in event.events:
                self._fold(inner)
            return
        if event.run_id not in self.run_ids:
            return
        if isinstance(event, RunStarted) and event.backend is not None:
            seen = self.backends.get(event.run_id)
            if seen is None or event.incarnation >= seen[0]:
                self.backends[event.run_id] = (event.incarnation, event.backend)
        elif isinstance(event, AgentReady):
            why = self.check_ready(event)
            if why:  # never believed: it neither counts as a node nor names a host
                self.refused_ready += 1
                log.warning(
                    "run %s: refused an AgentReady claiming node %d, host %r, for "
                    "incarnation %d: %s",
                    event.run_id,
                    event.node_rank,
                    event.host[:80],
                    event.incarnation,
                    why,
                )
                return
            self.ready.setdefault((event.run_id, event.incarnation), {})[event.node_rank] = event

    def poll(self, timeout_ms: int) -> None:
        """Fold what arrived (waiting up to ``timeout_ms`` for something)."""
        for records in self.consumer.poll(timeout_ms=timeout_ms).values():
            for record in records:
                if record.value is None:
                    continue  # a tombstone on the compacted runs topic
                try:
                    event = decode(record.value)
                except DecodeError:
                    continue  # the processors dead-letter it; nothing for an agent in it
                where = (record.topic, record.partition, record.offset)
                self.bad.guard("peer record", lambda e=event: self._fold(e), where)  # type: ignore[misc]

    def _drain(self, timeout_s: float = 10.0) -> None:
        """Fold everything written before now."""
        ends = self.consumer.end_offsets(self.tps)
        deadline = time.monotonic() + timeout_s
        while any(self.consumer.position(tp) < ends[tp] for tp in self.tps):
            if time.monotonic() > deadline:
                log.warning("peers: could not read the runs and controller topics to their end")
                return
            self.poll(POLL_MS)

    def backend(self, run_id: str) -> BackendDeclaration | None:
        """What the run's latest RunStarted declared of its backend; None: nothing seen."""
        self._drain()
        seen = self.backends.get(run_id)
        return None if seen is None else seen[1]

    def await_ready(
        self, run_id: str, incarnation: int, nnodes: int, timeout_s: float
    ) -> dict[int, AgentReady]:
        """The agents ready for ``incarnation`` by node rank.

        Returns:
            All ``nnodes`` of them, or those heard from within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            ready = self.ready.get((run_id, incarnation), {})
            if len(ready) >= nnodes or time.monotonic() >= deadline:
                return dict(ready)
            self.poll(POLL_MS)

    def cause(
        self, command: RestartRequested, timeout_s: float = CAUSE_TIMEOUT_S
    ) -> AnomalyDetected | None:
        """The verdict ``command`` was issued for: the anomalies-topic record at its source.

        Every agent reads the same record, so every agent charges the restart to the same
        node (`controller.membership.charge_failure`).

        Returns:
            The record at ``command.source`` if it is an AnomalyDetected of the command's
            run; None when the command names no anomalies-topic position or the record
            could not be read within ``timeout_s`` (said in the log).
        """
        source = command.source
        if source is None or source.topic != self.anomalies_topic:
            return None
        tp = TopicPartition(source.topic, source.partition)
        self.lookup.assign([tp])
        self.lookup.seek(tp, source.offset)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for records in self.lookup.poll(timeout_ms=POLL_MS, max_records=1).values():
                for record in records:
                    if record.offset != source.offset or record.value is None:
                        return None  # the record is gone (retention): nobody to charge
                    try:
                        event = decode(record.value)
                    except DecodeError:
                        return None
                    if isinstance(event, AnomalyDetected) and event.run_id == command.run_id:
                        return event
                    return None
        log.warning(
            "run %s: could not read the verdict of command %s at %s within %.0fs",
            command.run_id,
            command.command_id,
            source,
            timeout_s,
        )
        return None

    def close(self) -> None:
        """Close the consumers."""
        self.consumer.close()
        self.lookup.close()


class Controller:
    """Serves the commands of the runs it supervises until every run has ended.

    Args:
        runs: The supervised runs (all on the same bootstrap and prefix), each made with
            ``publisher.publish``.
        keys: Command keys by key id (empty: every command is rejected).
        bootstrap: Kafka bootstrap address.
        publisher: Where controller-side events go; the controller closes it.
        watches: The publisher's log watches by run id; observed after every poll.
        peers: The supervisors' `PeerWatch` (multi-node gangs); the controller closes it.
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
        peers: PeerWatch | None = None,
        relays: Sequence[RelayServer] = (),
    ) -> None:
        self.peers = peers
        self.runs = {r.run_id: r for r in runs}
        self.relays = list(relays)
        self.keys = dict(keys)
        self.publisher = publisher
        self.watches = dict(watches)
        self.topics = publisher.topics
        self.stop_requested: int | None = None
        self.bad = BadRecords("controller", log)
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
                r.spec.launch_offsets.get(partition, 0),
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

    def handle_isolated(self, record: Any, received_s: float) -> None:
        """`handle` one record; one that raises is counted, logged once, and passed.

        The offset of a command of an owned run that raised is recorded as acted on, so
        an adopting controller (`runwatch controller` after a restart) starts past the
        commands before it and skips this one the same way, never dying on it.
        """
        source = Provenance(topic=record.topic, partition=record.partition, offset=record.offset)
        ok, _ = self.bad.guard("command", lambda: self.handle(record, received_s), source)
        if ok:
            return
        try:
            command = decode(record.value)
        except DecodeError:
            return
        run = self.runs.get(getattr(command, "run_id", ""))
        if isinstance(command, RestartRequested) and run is not None and not run.finished:
            self.bad.guard("note offset", lambda: run.note_offset(source.partition, source.offset))

    def handle(self, record: Any, received_s: float) -> None:
        """Decide on one commands-topic record and act on it."""
        source = Provenance(topic=record.topic, partition=record.partition, offset=record.offset)
        try:
            command = decode(record.value)
        except DecodeError as exc:
            self.bad.note("decode", exc, source)
            return
        if not isinstance(command, RestartRequested):
            return
        run = self.runs.get(command.run_id)
        if run is not None and source.offset < run.record.consumer_offsets.get(
            source.partition, -1
        ):
            return  # before the last command this run acted on: settled long ago
        gangs = {
            r.run_id: OwnedGang(
                r.run_id,
                r.record.incarnation,
                r.spec.launch_offsets,
                launch_id=r.spec.run.launch_id,
            )
            for r in self.runs.values()
            if not r.finished
        }
        processed = run.state.processed if run is not None else frozenset()
        decision = decide(command, source, gangs=gangs, keys=self.keys, processed=processed)
        if decision.verdict == "ignore":
            log.log(
                logging.INFO if decision.reason == SHADOW else logging.DEBUG,
                "ignored command %s: %s",
                command.command_id,
                decision.reason,
            )
            return
        assert run is not None
        run.note_offset(source.partition, source.offset)
        if decision.verdict == "reject":
            # A replay is the last command read again after a controller restart (by design);
            # a bad signature or a stale command is trouble.
            log.log(
                logging.INFO if decision.reason == REPLAYED else logging.WARNING,
                "run %s: rejected command %s: %s",
                run.run_id,
                command.command_id,
                decision.reason,
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
        log.info(
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
        """Run until every supervised run ended.

        Returns:
            0 if all completed, `EXIT_DROPPED` if this node was dropped from them all (they
            go on without it), else 1 (or 128+signal).
        """
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
                        self.handle_isolated(record, received_s)
                now_s = time.monotonic()
                for run in self.runs.values():
                    run.observe(now_s)
                    watch = self.watches.get(run.run_id)
                    if watch is not None:
                        watch.observe(run)
        finally:
            self.close()
        statuses = {r.record.status for r in self.runs.values()}
        if statuses == {"completed"}:
            return 0
        return EXIT_DROPPED if statuses == {"dropped"} else 1

    def close(self) -> None:
        """Release warm spares, close the log watches, the consumer and the publisher."""
        for run in self.runs.values():
            run.close()
        for watch in self.watches.values():
            watch.close()
        self.consumer.close()
        self.publisher.close()
        if self.peers is not None:
            self.peers.close()
        for relay in self.relays:
            relay.close()


__all__ = [
    "EXIT_DROPPED",
    "Controller",
    "EventPublisher",
    "PeerWatch",
    "announce_end",
    "commands_end_offsets",
]
