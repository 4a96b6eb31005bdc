"""The faust-streaming app: one table of reducer states per input topic, batches in.

No agents: the consumer hands each fetched round of input records, whole per-partition
batches, to `_BatchSink` (`processors.engine.BatchIngest` does the Kafka side: the
next offset due per partition, refusing and re-seeking a batch that skips offsets,
acknowledging applied batches as offset ranges into faust's commit tracking). faust runs
the group, the assignment, the tables and their recovery, the commits and the worker.

The rules (ARCHITECTURE, docs/processors.md): one decode per record, `fold_batch` per
role, outputs published and acknowledged by Kafka before the states are written, a state
written only once Kafka acknowledged its changelog record (retried in place), nothing
acknowledged before its states are written, and a round that cannot be applied whole
stops the worker. States are written by a flush every few rounds
(`processors.settings.DEFAULT_STATE_FLUSH_S`), each run's newest state once, and the
rounds since the last flush are acknowledged after it.

Before the first fold a role waits until its producer knows the metadata of its changelog
topic and of every topic it publishes to (`_Agent.wait_for_metadata`): the producer
fetches its metadata when it starts, before the tables declare their changelog topics,
and aiokafka refreshes it only every five minutes, so every first state write of a new
app id once failed on a partition lookup after the verdicts were out. The consumer had the
same blind spot: `runwatch processors` creates the changelog topics before faust starts
(`changelog_topics`), or a takeover within those minutes restored no table.

No exception from input reaches this shell: decode, fold and state encoding are isolated
per record in the shared fold path and end as dead letters (ARCHITECTURE rule 7).

Faust's timers and windowed tables run on the wall clock; none of them is used for a
decision. The one timer here is the clock: it only *writes* Tick events into every
heartbeat partition, and hang detection reads time from the log. (Retry backoff sleeps on
the wall clock too; it decides nothing.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import faust

from runwatch.common.settings import faust_broker_settings, runwatch_home
from runwatch.processors import compat, engine
from runwatch.processors.changelog_batches import Handed, Record, hand_over
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.state_codec import DecodedStates, decode_state
from runwatch.processors.logread import partition_for
from runwatch.processors.pipeline import fold_chunks
from runwatch.processors.settings import (
    ENV_FAULT_STATE_WRITES,
    ProcessorEnv,
    ProcessorSettings,
    changelog_topic,
    leader_topic,
)
from runwatch.processors.stores import RunRocksStore, RunTable, store_url
from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import (
    TICK_RUN_ID,
    DeadLetter,
    Event,
    RestartRequested,
    Tick,
)
from runwatch.schemas.records import RawRecord, split
from runwatch.schemas.signing import CommandKey, sign
from runwatch.schemas.topics import FOLD_ORDER, TopicNames, TopicRole, folding, names

log = logging.getLogger(__name__)

CHANGELOG_COMPACTION = {"segment.ms": str(10 * 60 * 1000), "segment.bytes": str(64 * 1024**2)}
"""Changelog segments roll every 10 minutes or 64 MiB. Kafka compacts only rolled segments,
and its defaults (7 days, 1 GiB) left a successor replaying every write since the topic was
made; with these it replays about one record per run and table plus the last segment."""


@dataclass(frozen=True)
class ChangelogTopic:
    """A table's changelog topic, as `runwatch processors` creates it before faust starts.

    Attributes:
        name: ``<app id>-<table>-changelog`` (`processors.settings.changelog_topic`).
        partitions: Its input topic's count: a table is co-partitioned with its input.
        source: The input topic; partition ``p`` of it is folded into partition ``p`` here.
        compacted: Always: the latest state per run is what a successor recovers.
        retention_ms: None: compaction, not time, bounds it.
    """

    name: str
    partitions: int
    source: str
    compacted: bool = True
    retention_ms: int | None = None

    def configs(self) -> dict[str, str]:
        """The topic configs faust would give it (`create_app`'s tables), but replication's.

        ``min.insync.replicas`` and ``unclean.leader.election.enable`` come from the
        cluster's replication rule (`runwatch.admin.create_topics`), as the catalogue's.
        """
        return {"cleanup.policy": "compact", **CHANGELOG_COMPACTION}


def changelog_topics(settings: ProcessorSettings) -> list[ChangelogTopic]:
    """Every table's changelog topic, to create before the worker's consumer starts.

    faust declares them itself when its tables start, after its consumer fetched its first
    metadata, and aiokafka refreshes a consumer's metadata only every five minutes. A
    rebalance within those minutes (a worker killed beside another one) had the group
    leader assign without the changelog it did not know of (faust's assignor logs "Ignoring
    missing topic"): the survivor took over the dead worker's input partitions with no
    table to recover, folded on from empty states and wrote them over the real ones (a
    run's heartbeat count began again at the last commit). Created beforehand, they are in
    the consumer's first metadata.
    """
    topics = names(settings.prefix)
    return [
        ChangelogTopic(
            name=changelog_topic(settings.app_id, folding(role).table),
            partitions=settings.partitions_of(role),
            source=topics.of(role),
        )
        for role in FOLD_ORDER
    ]


@dataclass(frozen=True)
class LeaderTopic:
    """faust's leader-election topic, as `runwatch processors` creates it before faust starts.

    faust's group assignor hands its one partition to one worker, and that worker alone runs
    the ``on_leader`` clock (`_add_clock`): without it no Tick is written, and no run is ever
    found dead or hung. faust declares it when its leader assignor starts, after its
    consumer's first metadata, like the changelogs (`changelog_topics`): on a multi-broker
    cluster a group leader whose metadata did not have it yet would assign it to no one,
    and the clock would stay off until the next metadata refresh (five minutes). The
    likely cause of one compose run whose tick-only partitions were never committed; not
    reproduced.

    Attributes:
        name: ``<app id>-__assignor-__leader`` (`processors.settings.leader_topic`).
        partitions: One: whoever holds it leads.
        compacted: No: nothing is written to it.
        retention_ms: None: the broker's default.
    """

    name: str
    partitions: int = 1
    compacted: bool = False
    retention_ms: int | None = None


def topics_faust_declares(settings: ProcessorSettings) -> list[ChangelogTopic | LeaderTopic]:
    """The topics a worker creates before its consumer's first metadata.

    faust would declare each one itself only after that metadata, and a group leader
    assigns only the topics its metadata has: a changelog left out recovers no table
    (`changelog_topics`), a leader topic left out stops the clock (`LeaderTopic`).
    """
    return [*changelog_topics(settings), LeaderTopic(leader_topic(settings.app_id))]


def changelogs_missing(assigned: Iterable[Any], settings: ProcessorSettings) -> list[str]:
    """The changelog partitions an assignment lacks for the input partitions it holds.

    A table is co-partitioned with its input, and faust restores a table partition only
    when the assignment names its changelog partition: an input partition held without it
    is folded from empty states. faust's assignor leaves out a changelog its metadata does
    not have (`changelog_topics` says when that happened).

    Args:
        assigned: The assignment's partitions (anything with ``topic`` and ``partition``).
        settings: The worker's settings (prefix and app id).

    Returns:
        ``<changelog>[<partition>]`` for each one missing, sorted; empty when none is.
    """
    changelog_of = {spec.source: spec.name for spec in changelog_topics(settings)}
    held = {(tp.topic, tp.partition) for tp in assigned}
    return sorted(
        f"{changelog_of[topic]}[{partition}]"
        for topic, partition in held
        if topic in changelog_of and (changelog_of[topic], partition) not in held
    )


def _check_assignment(settings: ProcessorSettings) -> Callable[..., None]:
    """A receiver for faust's ``on_partitions_assigned`` that says when a table goes unrestored."""

    def check(_sender: Any, assigned: Iterable[Any], **_kwargs: Any) -> None:
        missing = changelogs_missing(assigned, settings)
        if missing:
            log.error(
                "the assignment lacks %d changelog partition(s) of input partitions it holds "
                "(%s): faust restores no table there, and this worker folds them from empty "
                "states; faust's assignor left out a changelog its metadata did not have "
                "(docs/processors.md, 'A takeover that recovered nothing')",
                len(missing),
                ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else ""),
            )

    return check


METADATA_TIMEOUT_S: Final = 120.0
"""Longest an agent waits for its producer to know the topics it writes to."""
STATE_CACHE_RUNS: Final = 4096
"""Runs per table whose decoded state a worker keeps (`DecodedStates`): ~16 KB a step
state, ~4 KB a 32-rank liveness state, so tens of MB at most per table."""
STATE_WRITE_ATTEMPTS: Final = 5
"""Attempts at writing a batch's states before the worker stops (backoff 0.1 s, doubling)."""
STATE_ACK_WARN_S: Final = 30.0
"""How often a checkpoint waiting for Kafka to acknowledge its state writes says so."""


def output_topic(event: Event, topics: TopicNames) -> str:
    """Where a processor publishes an event it produced."""
    if isinstance(event, DeadLetter):
        return topics.deadletter
    if isinstance(event, RestartRequested):
        return topics.commands
    return topics.anomalies


@dataclass(frozen=True, slots=True)
class Unwritten:
    """A run's state folded and not yet stored.

    Attributes:
        data: The state's table bytes, as the changelog record will carry them.
        state: The decoded state the next fold starts from.
    """

    data: bytes
    state: Any


@dataclass(frozen=True, slots=True)
class Lent:
    """What a fold is using of a run's state: where it came from, not the state itself.

    A reference to the state held while folding would pin every version the fold makes of
    a liveness state's RankTable (`DecodedStates`).

    Attributes:
        key: The run's table key.
        data: The bytes the state was decoded from (stored, or `Unwritten.data`).
        unwritten: Whether it came from `_Agent.unwritten` (then it must not be lost).
    """

    key: bytes
    data: bytes
    unwritten: bool


@dataclass(frozen=True, slots=True)
class StateWrite:
    """A run's state handed to the producer, and Kafka's answer to its changelog record.

    It holds the state's bytes, not the state: it lives until Kafka answers (hundreds of
    milliseconds under load, beside the next rounds), and a liveness state held that long
    pins every `RankTable` version the next rounds fold from it, with their undo entries
    (`DecodedStates`): tens of thousands of tuples that each young collection walked.

    Attributes:
        key: The run's table key.
        run_id: The run.
        data: What was written (`Unwritten.data`; None: the run's tombstone), written
            again if Kafka refuses it.
        ack: The future of its changelog record's batch (`changelog_batches.Handed`).
        place: Its offset within that batch.
    """

    key: bytes
    run_id: str
    data: bytes | None
    ack: Any
    place: int = 0


class StateWriteError(RuntimeError):
    """A batch's states could not be written after every retry."""


class StateWriteFaults:
    """A test seam: make the first ``count`` table writes of this process raise.

    Read from ``RUNWATCH_FAULT_STATE_WRITES`` (unset or 0: no fault). The injected error
    is raised where faust's own send would raise, before anything is stored, so it
    exercises the real retry and halt paths against a real broker.
    """

    ENV = ENV_FAULT_STATE_WRITES

    def __init__(self, count: int = 0) -> None:
        """Arm ``count`` failures."""
        self.remaining = count

    @classmethod
    def from_env(cls) -> StateWriteFaults:
        """The faults the environment asks for."""
        return cls(ProcessorEnv.from_env().fault_state_writes)

    def check(self, topic: str) -> None:
        """Raise while armed."""
        if self.remaining > 0:
            self.remaining -= 1
            raise StateWriteError(f"injected state write failure ({self.ENV}) on {topic}")


class _Agent:
    """One role's table and what goes with it: the states folded and not yet written."""

    def __init__(
        self,
        app: faust.App,
        role: TopicRole,
        table: Any,
        settings: ProcessorSettings,
        cfg: DetectorConfig,
        topics: TopicNames,
        finish: Callable[[Event], Event],
        faults: StateWriteFaults,
    ) -> None:
        self.app = app
        self.role = role
        self.table = table
        self.settings = settings
        self.cfg = cfg
        self.topics = topics
        self.finish = finish
        self.faults = faults
        self.kind = folding(role).state
        self.changelog = changelog_topic(settings.app_id, folding(role).table)
        self.needs_metadata = [self.changelog, topics.anomalies, topics.commands, topics.deadletter]
        self.key_partitions: dict[bytes, tuple[int, str]] = {}  # key -> (partition, run id)
        self.run_partitions: dict[str, int] = {}  # run id -> partition (states not written)
        self.decoded = DecodedStates(self.kind, STATE_CACHE_RUNS)  # type: ignore[arg-type]
        self.unwritten: dict[str, Unwritten] = {}  # run -> its state folded, not yet stored
        self.lent: dict[str, Lent] = {}  # run -> what a fold is using (`Lent`)
        self.evicting: set[str] = set()  # runs past retention whose value is not deleted yet
        self.round_index: dict[int, list[str]] | None = None  # `_stored_by_partition`

    def evict(self, run_ids: Iterable[str]) -> None:
        """Forget runs past their retention (before `absorb`); `write_unwritten` deletes them."""
        for run_id in run_ids:
            self.unwritten.pop(run_id, None)
            self.lent.pop(run_id, None)
            self.evicting.add(run_id)

    def load(self, run_id: str) -> Any:
        """The newest state of ``run_id`` (None: none yet): folded and not written, or stored.

        The state is handed to the fold (`DecodedStates.take`); `absorb` takes it back.
        """
        key = encode_key(run_id)
        kept = self.unwritten.pop(run_id, None)
        if kept is not None:
            self.lent[run_id] = Lent(key, kept.data, unwritten=True)
            return kept.state
        if run_id in self.evicting:  # evicted, its deletion not written yet
            return None
        raw = self.table.get(key)
        if raw is None:
            return None
        state = self.decoded.take(key, raw)
        self.lent[run_id] = Lent(key, raw, unwritten=False)
        return state

    def absorb(self, encoded: Mapping[str, bytes], states: Mapping[str, Any]) -> None:
        """Keep a fold's new states until they are written; take back those it only read.

        Args:
            encoded: Run -> the bytes of its new state, for every run the fold changed.
            states: Run -> its state after the fold, for every run it touched. A run not
                in ``encoded`` holds the state `load` gave (`processors.pipeline.BatchResult`).
        """
        for run_id, data in encoded.items():
            self.unwritten[run_id] = Unwritten(data, states[run_id])
            self.evicting.discard(run_id)
        for run_id, lent in self.lent.items():
            if run_id in encoded:
                continue
            state = states.get(run_id)
            if lent.unwritten:  # never lose a state not yet written
                if state is None:
                    state = decode_state(self.kind, lent.data)  # type: ignore[arg-type]
                self.unwritten[run_id] = Unwritten(lent.data, state)
            elif state is not None:
                self.decoded.put(lent.key, lent.data, state)
        self.lent.clear()

    def discard(self) -> None:
        """Drop the states not written (their records are read again)."""
        self.unwritten.clear()
        self.lent.clear()
        self.evicting.clear()

    def runs_in_partition(self, partition: int) -> Iterable[str]:
        """Runs with a state in ``partition``: stored, or folded and not yet written.

        The ones not written include those a fold is using (`lent`): a Tick in a later
        chunk of the round must reach them as the audit's one fold would.
        """
        if isinstance(self.table.data, RunRocksStore):  # one database per partition
            stored = [key.decode() for key in self.table.data.partition_keys(partition)]
        else:
            stored = self._stored_by_partition().get(partition, [])
        if self.evicting:
            stored = [run_id for run_id in stored if run_id not in self.evicting]
        if not self.unwritten and not self.lent:
            return stored
        known = set(stored)
        unwritten = [*self.unwritten, *(run for run, lent in self.lent.items() if lent.unwritten)]
        return [
            *stored,
            *(
                run_id
                for run_id in unwritten
                if run_id not in known and self._run_partition(run_id) == partition
            ),
        ]

    def _stored_by_partition(self) -> dict[int, list[str]]:
        """Partition -> runs stored in the (memory) table, from one pass over its keys.

        Kept for the fold of one round (`round_index`): the table changes only when states
        are written, after the fold. A round with a Tick per heartbeat partition, or whose
        new runs meet the cap of many partitions (`processors.core.retention`), pays one
        pass over the table, not one per partition.
        """
        index = self.round_index
        if index is None:
            index = self.round_index = {}
            for key in list(self.table.keys()):
                where, run_id = self._partition_of(key)
                index.setdefault(where, []).append(run_id)
        return index

    def _run_partition(self, run_id: str) -> int:
        where = self.run_partitions.get(run_id)
        if where is None:
            where = self.run_partitions[run_id] = self._partition_of(encode_key(run_id))[0]
        return where

    def _partition_of(self, key: bytes) -> tuple[int, str]:
        # A round carries a Tick per heartbeat partition, each scanning every key: with the
        # partitioner (murmur2 in Python) per key, 10,000 runs and 64 partitions cost
        # seconds per round, so each key's partition is computed once.
        known = self.key_partitions.get(key)
        if known is None:
            run_id = key.decode()
            count = self.settings.partitions_of(self.role)
            known = self.key_partitions[key] = (partition_for(run_id, count), run_id)
        return known

    async def wait_for_metadata(self) -> None:
        """Return once the producer knows every topic this agent writes to.

        Raises:
            StateWriteError: Still unknown after `METADATA_TIMEOUT_S`.
        """
        client = compat.producer_client(self.app)
        missing = [t for t in self.needs_metadata if client.cluster.partitions_for_topic(t) is None]
        if not missing:
            return
        deadline = time.monotonic() + METADATA_TIMEOUT_S
        delay_s = 0.05
        for topic in missing:
            client.add_topic(topic)
        while True:
            await client.force_metadata_update()
            missing = [t for t in missing if client.cluster.partitions_for_topic(t) is None]
            if not missing:
                log.info("%s: producer metadata known for %s", self.role, self.needs_metadata)
                return
            if time.monotonic() > deadline:
                raise StateWriteError(
                    f"topics {', '.join(missing)} still unknown to the producer after "
                    f"{METADATA_TIMEOUT_S:.0f} s"
                )
            log.warning("%s: waiting for producer metadata of %s", self.role, ", ".join(missing))
            await asyncio.sleep(delay_s)
            delay_s = min(1.0, delay_s * 2)

    async def write_unwritten(self) -> list[StateWrite]:
        """Write every state folded and not yet written: the table holds it from here.

        The runs past retention get a tombstone (`processors.core.retention`), every other
        state its changelog record, all handed to the producer in one batch per partition
        (`changelog_batches.hand_over`); a record's value is stored locally once it is
        handed over. `acknowledge` then waits for Kafka's answers (a state counts as
        written only once Kafka acknowledged it). A record that cannot be handed over is
        tried again in place (`STATE_WRITE_ATTEMPTS`), the run's state kept in `unwritten`
        meanwhile so that nothing folds from the table's older value.

        Returns:
            The writes handed to the producer, for `acknowledge`.

        Raises:
            StateWriteError: Some state still not handed over after `STATE_WRITE_ATTEMPTS`.
        """
        pending: list[tuple[bytes, str, Unwritten | None]] = []
        for run_id in sorted(self.evicting):
            key = encode_key(run_id)
            if key in self.table.data:
                pending.append((key, run_id, None))
            else:  # never stored: nothing to delete
                self._stored(key, run_id, None)
        pending += [(encode_key(run_id), run_id, kept) for run_id, kept in self.unwritten.items()]
        writes: list[StateWrite] = []
        delay_s = 0.1
        for attempt in range(1, STATE_WRITE_ATTEMPTS + 1):
            failed: list[tuple[bytes, str, Unwritten | None]] = []
            error: BaseException | None = None
            records = [(key, None if kept is None else kept.data) for key, _, kept in pending]
            answers = await self._hand_over(records)
            for (key, run_id, kept), (_, data), answer in zip(
                pending, records, answers, strict=True
            ):
                if isinstance(answer, BaseException):
                    failed.append((key, run_id, kept))
                    error = answer
                    continue
                writes.append(StateWrite(key, run_id, data, answer.ack, answer.place))
                self._stored(key, run_id, kept)
            if not failed:
                return writes
            self._warn_failed(len(failed), len(pending), attempt, error)
            pending = failed
            if attempt < STATE_WRITE_ATTEMPTS:
                await asyncio.sleep(delay_s)
                delay_s *= 2
                await self.wait_for_metadata()
        raise StateWriteError(
            f"{len(pending)} states of the {self.role} table not written after "
            f"{STATE_WRITE_ATTEMPTS} attempts"
        )

    async def acknowledge(self, writes: list[StateWrite]) -> None:
        """Return once Kafka acknowledged every write of ``writes`` (`write_unwritten`).

        A record Kafka refused is written again (the table already holds the same bytes,
        and no later state of its run is written before this returns: `Checkpoint` step
        2), up to `STATE_WRITE_ATTEMPTS`. Then each changelog partition's newest offset is
        the store's persisted offset (what faust's own send callback kept: a RocksDB store
        restarted on this host reads its changelog from there).

        Raises:
            StateWriteError: Some state still not stored after `STATE_WRITE_ATTEMPTS`.
        """
        delay_s = 0.1
        error: BaseException | None = None
        newest: dict[Any, int] = {}  # changelog partition -> newest offset acknowledged
        for attempt in range(1, STATE_WRITE_ATTEMPTS + 1):
            acks = await self._acknowledged([write.ack for write in writes])
            failed = []
            for write, ack in zip(writes, acks, strict=True):
                if isinstance(ack, BaseException):
                    failed.append(write)
                else:  # aiokafka's RecordMetadata of the record's batch
                    offset = ack.offset + write.place
                    newest[ack.topic_partition] = max(offset, newest.get(ack.topic_partition, -1))
            if not failed:
                for tp, offset in newest.items():
                    self.table.data.set_persisted_offset(tp, offset)
                return
            error = next(ack for ack in acks if isinstance(ack, BaseException))
            self._warn_failed(len(failed), len(writes), attempt, error)
            if attempt == STATE_WRITE_ATTEMPTS:
                break
            await asyncio.sleep(delay_s)
            delay_s *= 2
            await self.wait_for_metadata()
            writes = await self._write_again(failed)
        raise StateWriteError(
            f"{len(failed)} states of the {self.role} table not written after "
            f"{STATE_WRITE_ATTEMPTS} attempts: {error!r}"
        )

    async def _write_again(self, writes: list[StateWrite]) -> list[StateWrite]:
        """``writes`` handed to the producer again (the table already holds their values).

        Each comes back with its new answer, or as it was (its failed one) where it could not
        be handed over again.
        """
        answers = await self._hand_over([(w.key, w.data) for w in writes])
        return [
            w
            if isinstance(a, BaseException)
            else StateWrite(w.key, w.run_id, w.data, a.ack, a.place)
            for w, a in zip(writes, answers, strict=True)
        ]

    async def _hand_over(self, records: list[Record]) -> list[Handed | BaseException]:
        """``records`` handed to the producer (`changelog_batches.hand_over`)."""
        return await hand_over(
            compat.aiokafka_producer(self.app),
            self.changelog,
            records,
            lambda key: self._partition_of(key)[0],
            lambda: self.faults.check(self.changelog),
        )

    def _stored(self, key: bytes, run_id: str, kept: Unwritten | None) -> None:
        """The table's local value of a run whose record was handed over (None: deleted)."""
        if kept is None:  # a tombstone: the run passed its retention
            if key in self.table.data:
                del self.table.data[key]
            self.decoded.drop(key)
            self.key_partitions.pop(key, None)  # nor its partition, kept per key seen
            self.run_partitions.pop(run_id, None)
            self.evicting.discard(run_id)
            return
        self.table.data[key] = kept.data
        del self.unwritten[run_id]
        self.decoded.put(key, kept.data, kept.state)

    def _warn_failed(self, failed: int, of: int, attempt: int, error: BaseException | None) -> None:
        log.warning(
            "%s: %d of %d state writes failed (attempt %d of %d): %r",
            self.role,
            failed,
            of,
            attempt,
            STATE_WRITE_ATTEMPTS,
            error,
        )

    async def _acknowledged(self, sent: list[Any]) -> list[Any]:
        """Kafka's answer to each changelog record in ``sent``: its metadata, or the error.

        Waits as long as Kafka takes (aiokafka retries a broker outage until its request
        timeout, then fails the send); every `STATE_ACK_WARN_S` without an answer it says
        so, since nothing is committed meanwhile.
        """
        waiting: set[Any] = set(sent)
        waited_s = 0.0
        while waiting:
            _, waiting = await asyncio.wait(waiting, timeout=STATE_ACK_WARN_S)  # cancels nothing
            if waiting:
                waited_s += STATE_ACK_WARN_S
                log.warning(
                    "%s: %d of %d state writes not acknowledged by Kafka after %.0f s; "
                    "nothing is committed until they are",
                    self.role,
                    len(waiting),
                    len(sent),
                    waited_s,
                )
        return [fut.exception() or fut.result() for fut in sent]

    async def send(self, events: Sequence[Event]) -> list[Any]:
        """Hand ``events`` to the producer; returns the futures of their acknowledgements."""
        producer = self.app.producer
        return [
            await producer.send(
                output_topic(e, self.topics), encode_key(e.run_id), encode(e), None, None, None
            )
            for e in events
        ]


class _BatchSink:
    """The batch path's body (`processors.engine.BatchSink`): rounds folded, then made durable.

    A round holds, per assigned input partition, consecutive records in offset order.
    The rules are the agents': decode each record once, fold each role's records through
    `fold_batch` (the audit's replay), publish every output and dead letter and wait for
    Kafka's acknowledgement, then write the states (retried in place), in the steps of
    `processors.engine.Checkpoint`, which `BatchIngest` commits every
    `processors.settings.DEFAULT_STATE_FLUSH_S`: until then a run's newest state is kept
    in its role's body (`_Agent.unwritten`) and the next round folds from it. A round or a
    checkpoint step that cannot be done whole stops the worker without returning (nothing
    after it is processed, nothing since the last checkpoint acknowledged).
    """

    def __init__(self, app: faust.App, roles: dict[str, _Agent], bulk: Iterable[str] = ()) -> None:
        self.app = app
        self.roles = roles  # input topic name -> the role's body (table, writes, publish)
        self.bulk = frozenset(bulk)  # input topics folded after the others' outputs went out
        self.sent: list[Any] = []  # the producer's futures of every output since the last flush

    @property
    def stats(self) -> engine.RoundStats:
        """The batch path's timing summary (`processors.engine.RoundStats`)."""
        ingest = self.app.batch_ingest if isinstance(self.app, engine.App) else None
        return ingest.stats if ingest is not None else engine.RoundStats()

    async def __call__(self, batches: Mapping[Any, Sequence[RawRecord]]) -> None:
        grouped: dict[str, list[RawRecord]] = {}
        for tp, recs in batches.items():  # made raw by faust's consumer thread (engine)
            grouped.setdefault(tp.topic, []).extend(recs)
        # In `FOLD_ORDER` (the roles' order in ``self.roles``), whatever order the fetch had.
        by_topic = {topic: grouped[topic] for topic in self.roles if topic in grouped}
        try:
            await self.fold(by_topic)
        except asyncio.CancelledError:
            raise  # stopping: the round is not acknowledged, a restart reads it again
        except Exception as exc:
            await self.stop(f"a round of {sum(map(len, by_topic.values()))} records", exc)

    async def fold(self, by_topic: dict[str, list[RawRecord]]) -> None:
        """Fold every role's records and hand their outputs to the producer.

        The fold goes in chunks of about `FOLD_CHUNK_EVENTS` events, and each chunk's
        outputs are handed to the producer as soon as the chunk is folded. The producer
        sends only while the event loop runs, so before the bulk (the heartbeats) is
        folded, the round gives the outputs of its other roles up to `URGENT_DELIVERY_S`
        to go out (`deliver`): a verdict waits for the fold of its own role's chunk, not
        of the round's heartbeats. Every output is still acknowledged by Kafka before any
        state folded with it is written (`Checkpoint`).
        """
        agents = [self.roles[topic] for topic in by_topic]
        for agent in agents:
            await agent.wait_for_metadata()
        t0 = time.perf_counter()
        sent = self.sent
        urgent: list[Any] = []  # this round's outputs of the roles folded before the bulk
        for topic, agent, records in zip(by_topic, agents, by_topic.values(), strict=True):
            bulk = topic in self.bulk
            if bulk and urgent:
                await self.deliver(urgent)
            handed: list[Any] = []
            good, dead = split(records, agent.role)
            handed += await agent.send(dead)
            encoded: dict[str, bytes] = {}
            states: dict[str, Any] = {}
            evicted: frozenset[str] = frozenset()
            agent.round_index = None  # the table as it is now (written since the last round)
            for result in fold_chunks(
                agent.role, good, agent.load, agent.runs_in_partition, agent.cfg, FOLD_CHUNK_EVENTS
            ):
                outputs = [*result.dead, *(agent.finish(o) for o in result.outputs)]
                handed += await agent.send(outputs)
                encoded, states, evicted = result.encoded, result.states, result.evicted
            agent.round_index = None
            agent.evict(evicted)
            agent.absorb(encoded, states)
            sent += handed
            if not bulk:
                urgent += handed
        self.stats.note("fold_ms", 1000 * (time.perf_counter() - t0))

    async def deliver(self, futures: list[Any]) -> None:
        """Give the outputs handed over so far this round `URGENT_DELIVERY_S` to be delivered.

        The producer sends only while the event loop runs, and a round's fold does not
        yield to it: a verdict handed over with the steps' chunk left the worker only once
        the round's heartbeats were folded too. Waiting here lets the producer send it (and
        Kafka acknowledge it) first. A failed delivery is not raised here: the checkpoint's
        `outputs_acknowledged` waits for every output again and stops the worker on it.
        """
        t0 = time.perf_counter()
        await asyncio.wait(futures, timeout=URGENT_DELIVERY_S)
        self.stats.note("deliver_ms", 1000 * (time.perf_counter() - t0))

    async def outputs_acknowledged(self) -> None:
        """Return once Kafka acknowledged every output handed over since the last checkpoint."""
        t0 = time.perf_counter()
        sent, self.sent = self.sent, []
        try:
            if sent:
                await asyncio.gather(*sent)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self.stop("the outputs of the last rounds", exc)
        self.stats.note("publish_ms", 1000 * (time.perf_counter() - t0))

    async def write_states(self) -> engine.StateAcks:
        """Write every role's unwritten states (`Checkpoint` step 3).

        Returns:
            What waits until Kafka acknowledged each of them (step 4), stopping the worker
            when one cannot be stored.
        """
        t0 = time.perf_counter()
        written: list[tuple[_Agent, list[StateWrite]]] = []
        try:
            for agent in self.roles.values():
                if agent.unwritten:
                    written.append((agent, await agent.write_unwritten()))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self.stop("the states of the last rounds", exc)
        self.stats.note("write_ms", 1000 * (time.perf_counter() - t0))
        if self.stats.interval_s:  # the sum is a loop over every write: only when asked for
            self.stats.note("write_kb", sum(len(w.data) for _, ws in written for w in ws) / 1024)

        async def acknowledged() -> None:
            try:
                for agent, writes in written:
                    await agent.acknowledge(writes)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await self.stop("the states of the last rounds", exc)

        return acknowledged

    def discard(self) -> None:
        """Drop every state not written and the futures of outputs not waited for."""
        self.sent = []
        for agent in self.roles.values():
            agent.discard()

    async def stop(self, what: str, exc: Exception) -> None:
        """Stop the worker over ``what``, which could not be applied whole; never return."""
        log.error(
            "%s could not be applied whole (%r); stopping the worker without committing "
            "them, a restart applies them again",
            what,
            exc,
        )
        await self.app.crash(exc)
        await asyncio.Event().wait()  # never return: nothing since the last flush is acknowledged


URGENT_DELIVERY_S: Final = engine.ROUND_BULK_S
"""The longest a round waits, before it folds the bulk (the heartbeats), for the outputs of
its other roles to be delivered (`_BatchSink.deliver`). No longer than the bulk's fold takes
(about `engine.ROUND_BULK_S`): past that, folding the bulk first delays a verdict no more.
A round whose other roles made no output waits not at all."""

FOLD_CHUNK_EVENTS: Final = 4096
"""Events the batch path folds before handing their outputs to the producer (a pack
counts its events). A round may hold hundreds of thousands of events under a backlog or a
burst; at a few microseconds an event, a verdict that waited for the whole round's fold
waited a second. Chunks cost nothing in throughput: the states of a chunk are carried to
the next in memory, exactly as one fold carries them from record to record."""


def _data_dir(settings: ProcessorSettings) -> Path:
    """The faust data dir, created: ``--data-dir``, else ``$RUNWATCH_HOME/processors/<app id>``.

    The ``rocksdb`` store keeps its databases there (``v1/tables/<table>-<partition>.db``),
    and a RocksDB database opens in one process at a time: workers of one app on one host
    need a data dir each (``--data-dir``). faust makes the dir even for in-memory tables
    (with a non-recursive mkdir); its default, ``<app id>-data`` in the current directory,
    littered checkouts with one per test.
    """
    if settings.data_dir is not None:
        path = Path(settings.data_dir)
    else:
        path = runwatch_home() / "processors" / settings.app_id
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def create_app(
    settings: ProcessorSettings, cfg: DetectorConfig, key: CommandKey | None
) -> faust.App:
    """Build the faust app for ``settings``.

    Args:
        settings: Connection, naming and batching.
        cfg: Detector configuration (defaults plus ``settings.overrides``).
        key: The key that signs restart commands; None publishes them unsigned (the
            controller then rejects them, and says so).

    Returns:
        The app; run it with `run_worker`.

    Raises:
        compat.InternalsMoved: faust, aiokafka or mode are not the versions the engine
            is written against, and an internal it uses moved.
    """
    compat.check()
    app = _new_app(settings)
    topics = names(settings.prefix)
    faults = StateWriteFaults.from_env()

    def finish(event: Event) -> Event:
        if isinstance(event, RestartRequested) and key is not None:
            return sign(event, key)
        return event

    sources: list[Any] = []
    bodies: dict[str, _Agent] = {}  # in FOLD_ORDER, which the batch path folds a round in
    for role in FOLD_ORDER:
        topic_name = topics.of(role)
        table = app.Table(
            folding(role).table,
            default=None,
            partitions=settings.partitions_of(role),  # co-partitioned with its input
            key_type=bytes,
            value_type=bytes,
            use_partitioner=True,
            extra_topic_configs={
                "min.insync.replicas": str(settings.min_insync_replicas),
                "unclean.leader.election.enable": "false",
                **CHANGELOG_COMPACTION,
            },
        )
        source = app.topic(
            topic_name,
            key_type=bytes,
            value_type=bytes,
            partitions=settings.partitions_of(role),
            acks=True,
        )
        sources.append(source)
        bodies[topic_name] = _Agent(app, role, table, settings, cfg, topics, finish, faults)
    # The heartbeats are the bulk: a round takes every step, checkpoint and anomaly buffered
    # and about `engine.ROUND_BULK_S` of the heartbeats (a spike waits for less of them).
    bulk = [topics.heartbeats]
    app.ingest_batches(sources, _BatchSink(app, bodies, bulk), settings.state_flush_s, bulk=bulk)
    app.on_partitions_assigned.connect(_check_assignment(settings))
    log.info("store: %s", settings.store)

    _add_clock(app, settings, topics)
    return app


def _new_app(settings: ProcessorSettings) -> engine.App:
    """The faust app of ``settings``, with the engine's transport and faust's settings."""
    return engine.App(  # faust.App, with a retry backoff sized for outages
        settings.app_id,
        broker=f"kafka://{settings.bootstrap}",
        store=store_url(settings.store),  # memory, or RocksDB under the data dir
        Table=RunTable,  # files each RocksDB write under its changelog partition
        datadir=str(_data_dir(settings)),
        topic_partitions=max(settings.partitions_of(role) for role in FOLD_ORDER),
        topic_replication_factor=settings.replication_factor,
        topic_allow_declare=True,
        key_serializer="raw",
        value_serializer="raw",
        consumer_auto_offset_reset="earliest",
        processing_guarantee="at_least_once",
        producer_acks=-1,
        # Table states are kilobytes; faust's 16 KiB batches would send two per request.
        producer_max_batch_size=1024 * 1024,
        producer_linger=0.005,
        web_enabled=settings.web_port is not None,
        web_port=settings.web_port or 6066,
        table_standby_replicas=0,
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 5),
        broker_rebalance_timeout=max(20.0, 2 * settings.session_timeout_s),
        broker_commit_every=10_000,
        broker_commit_interval=1.0,
        # A round: at most this many records per fetch, all partitions.
        broker_max_poll_records=settings.batch_max,
        worker_redirect_stdouts=False,
        **faust_broker_settings(),
    )


def _add_clock(app: faust.App, settings: ProcessorSettings, topics: TopicNames) -> None:
    """Add the clock: a Tick into every heartbeat partition every ``tick_interval_s``."""

    @app.timer(settings.tick_interval_s, on_leader=True, name="runwatch.clock")  # type: ignore[untyped-decorator]
    async def clock() -> None:
        # The only wall-clock read in the processors: it is written to the log as a Tick,
        # and every decision reads time from the log.
        now_ns = time.time_ns()
        producer = app.producer
        pending = [
            await producer.send(
                topics.heartbeats,
                TICK_RUN_ID.encode(),
                encode(Tick(run_id=TICK_RUN_ID, ts_ns=now_ns, partition=p)),
                p,
                None,
                None,
            )
            for p in range(settings.partitions_of(TopicRole.HEARTBEATS))  # every one, as it is
        ]
        await asyncio.gather(*pending)
