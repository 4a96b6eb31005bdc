"""The faust-streaming app: one table of reducer states per input topic, two ways in.

``ProcessorSettings.ingest`` chooses how records reach the fold:

* ``stream``: one agent per input topic, records one by one through faust's conductor,
  stream and acks, below (the path before the batch one; still selectable);
* ``batch`` (the default): no agents. The consumer hands each fetched round of input records, whole
  per-partition batches, to `_BatchSink` (`processors.transport.BatchIngest` does the
  Kafka side: the next offset due per partition, refusing and re-seeking a batch that
  skips offsets, acknowledging applied batches as offset ranges into faust's commit
  tracking). faust still runs the group, the assignment, the tables and their recovery,
  the commits and the worker. The rules are the same as the agents': one decode per
  record, `fold_batch` per role, outputs published and acknowledged by Kafka before the
  states are written (retried in place), nothing acknowledged before its states are
  written, and a round that cannot be applied whole stops the worker. Only the timing
  differs: states are written by a flush every few rounds
  (`processors.settings.DEFAULT_STATE_FLUSH_S`), each run's newest state once, and
  the rounds since the last flush are acknowledged after it. None of faust's
  per-message machinery (Message objects, increfs, the ack-on-close of ``take_events``)
  is on that path, so what follows about pinning concerns the stream path only.

Each agent takes batches of raw records (``stream.take_events``), decodes each record once,
folds the batch through the pure core (`processors.pipeline.fold_batch`, the replay the
audit runs) and then, in this order:

1. publishes the verdicts and dead letters and waits until Kafka acknowledged them;
2. writes the new states to its table (a changelog topic co-partitioned with the input).

A batch is applied whole or not at all (ARCHITECTURE rule 6). How faust-streaming 0.15
acknowledges decides how that is kept:

* ``take_events`` turns stream acks off and acks every event of a batch in the ``finally``
  of its generator: when the agent asks for the next batch, when the generator is closed
  after an exception escaped the agent body (asyncio finalizes it), and when the stream
  stops (``Stream.on_stop`` closes its buffering generators, *while the agent may still
  be applying the batch*). So a batch whose states were never written is acked, hence
  committed, by an agent crash, and even by a plain shutdown in the middle of a batch;
  after a crash the supervisor restarts the agent, which goes on with the next records,
  and the failed ones are never delivered again.
* ``Consumer.commit`` commits, per partition, the end of the first run of consecutive
  acked offsets. It checks for a gap at the head only against a committed offset that is
  truthy and more than one below the lowest acked offset: with no commit yet (a new
  app id), or a one-record gap, it commits past unacked records. An unacked batch is
  therefore only safe while nothing after it in its partition is acked either.
* A table assignment sends the changelog record first (``on_key_set`` ->
  ``send_changelog``, which picks the partition from the *producer's* metadata,
  synchronously) and updates the in-memory store after it: a failed send leaves the
  store as it was, so retrying the assignment is safe. Before committing offsets,
  faust flushes the producer, so a committed offset never passes a changelog record still
  in flight.

That was the bug of a fresh deployment: the producer fetches its metadata when it starts,
before the tables declare their changelog topics, and aiokafka refreshes it only every
five minutes, so every first state write of a new app id failed on a partition lookup
(``partitions_for_topic(...)`` None), after the verdicts were out; the batch was acked,
the state lost, and the policy issued a second command for one incarnation.

So an agent here:

* folds nothing before its producer knows the metadata of its changelog topic and of
  every topic it publishes to (`_Agent.wait_for_metadata`: forced refreshes, bounded by
  `METADATA_TIMEOUT_S`, logged while it waits);
* retries a failed state write in place (`STATE_WRITE_ATTEMPTS`, forcing a metadata
  refresh between attempts): reassigning the same bytes is idempotent;
* holds its own reference on every message of a batch from the moment it receives it
  (``Message.incref``) and drops it only once the states are written: until then no ack
  of faust's can complete the batch, whatever closes the generator;
* when a batch cannot be applied whole (a write that keeps failing, a publish that
  fails, the metadata wait timing out, an interruption half-way), keeps it pinned,
  processes nothing after it in any partition of the agent, and stops the worker
  (``App.crash``; the process exits non-zero). Restarted, the worker reads the batch
  again from the committed offset; the states still hold the offset they last applied
  and skip nothing they have not seen, the folds recompute the same verdicts with the
  same ids, and consumers see at worst an identical duplicate.

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
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import faust
from aiokafka.structs import ConsumerRecord

from runwatch.common.settings import faust_broker_settings, runwatch_home
from runwatch.processors import transport
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.state_codec import DecodedStates, decode_state
from runwatch.processors.logread import partition_for
from runwatch.processors.pipeline import fold_batch, fold_chunks
from runwatch.processors.settings import ProcessorSettings, changelog_topic
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

METADATA_TIMEOUT_S: Final = 120.0
"""Longest an agent waits for its producer to know the topics it writes to."""
STATE_CACHE_RUNS: Final = 4096
"""Runs per table whose decoded state a worker keeps (`DecodedStates`): ~16 KB a step
state, ~4 KB a 32-rank liveness state, so tens of MB at most per table."""
STATE_WRITE_ATTEMPTS: Final = 5
"""Attempts at writing a batch's states before the worker stops (backoff 0.1 s, doubling)."""


def output_topic(event: Event, topics: TopicNames) -> str:
    """Where a processor publishes an event it produced."""
    if isinstance(event, DeadLetter):
        return topics.deadletter
    if isinstance(event, RestartRequested):
        return topics.commands
    return topics.anomalies


class StateWriteError(RuntimeError):
    """A batch's states could not be written after every retry."""


class StateWriteFaults:
    """A test seam: make the first ``count`` table writes of this process raise.

    Read from ``RUNWATCH_FAULT_STATE_WRITES`` (unset or 0: no fault). The injected error
    is raised where faust's own send would raise, before anything is stored, so it
    exercises the real retry and halt paths against a real broker.
    """

    ENV = "RUNWATCH_FAULT_STATE_WRITES"

    def __init__(self, count: int = 0) -> None:
        """Arm ``count`` failures."""
        self.remaining = count

    @classmethod
    def from_env(cls) -> StateWriteFaults:
        """The faults the environment asks for."""
        raw = os.environ.get(cls.ENV, "").strip()
        return cls(int(raw) if raw else 0)

    def check(self, topic: str) -> None:
        """Raise while armed."""
        if self.remaining > 0:
            self.remaining -= 1
            raise StateWriteError(f"injected state write failure ({self.ENV}) on {topic}")


class _Agent:
    """The body of one agent: batch in, verdicts out, states written, or the worker stops."""

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
        self.dirty: dict[str, tuple[bytes, Any]] = {}  # run -> (bytes, state) folded, unwritten
        # run -> (key, bytes, whether from `dirty`) of each state a fold is using. Not the
        # state itself: a reference held while folding pins every version the fold makes
        # of a liveness state's RankTable (`DecodedStates`).
        self.lent: dict[str, tuple[bytes, bytes, bool]] = {}
        self.evicting: set[str] = set()  # runs past retention whose value is not deleted yet

    def evict(self, run_ids: Iterable[str]) -> None:
        """Forget runs past their retention (before `absorb`); `write_dirty` deletes them."""
        for run_id in run_ids:
            self.dirty.pop(run_id, None)
            self.lent.pop(run_id, None)
            self.evicting.add(run_id)

    def load(self, run_id: str) -> Any:
        """The newest state of ``run_id`` (None: none yet): folded and not written, or stored.

        The state is handed to the fold (`DecodedStates.take`); `absorb` takes it back.
        """
        key = encode_key(run_id)
        kept = self.dirty.pop(run_id, None)
        if kept is not None:
            self.lent[run_id] = (key, kept[0], True)
            return kept[1]
        if run_id in self.evicting:  # evicted, its deletion not written yet
            return None
        raw = self.table.get(key)
        if raw is None:
            return None
        state = self.decoded.take(key, raw)
        self.lent[run_id] = (key, raw, False)
        return state

    def absorb(self, encoded: Mapping[str, bytes], states: Mapping[str, Any]) -> None:
        """Keep a fold's new states until they are written; take back those it only read.

        Args:
            encoded: Run -> the bytes of its new state, for every run the fold changed.
            states: Run -> its state after the fold, for every run it touched. A run not
                in ``encoded`` holds the state `load` gave (`processors.pipeline.BatchResult`).
        """
        for run_id, data in encoded.items():
            self.dirty[run_id] = (data, states[run_id])
            self.evicting.discard(run_id)
        for run_id, (key, raw, unwritten) in self.lent.items():
            if run_id in encoded:
                continue
            state = states.get(run_id)
            if unwritten:  # never lose a state not yet written
                if state is None:
                    state = decode_state(self.kind, raw)  # type: ignore[arg-type]
                self.dirty[run_id] = (raw, state)
            elif state is not None:
                self.decoded.put(key, raw, state)
        self.lent.clear()

    def discard(self) -> None:
        """Drop the states not written (their records are read again)."""
        self.dirty.clear()
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
            stored = []
            for key in list(self.table.keys()):
                where, run_id = self._partition_of(key)
                if where == partition:
                    stored.append(run_id)
        if self.evicting:
            stored = [run_id for run_id in stored if run_id not in self.evicting]
        if not self.dirty and not self.lent:
            return stored
        known = set(stored)
        unwritten = [*self.dirty, *(run for run, lent in self.lent.items() if lent[2])]
        return [
            *stored,
            *(
                run_id
                for run_id in unwritten
                if run_id not in known and self._run_partition(run_id) == partition
            ),
        ]

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

    async def __call__(self, stream: Any) -> None:
        async for events in stream.take_events(
            self.settings.batch_max, within=self.settings.batch_within_s
        ):
            # Our own reference on every message of the batch, taken before anything else:
            # faust's acks of the batch (the generator's finally, also run by Stream.on_stop
            # while the batch is still being applied) cannot complete it until we let go.
            _pin(events)
            try:
                await self.apply(events)
            except asyncio.CancelledError:
                # Interrupted half-way: the batch stays pinned, so it is never committed.
                if not self.app.should_stop:  # a restart on rebalance: stop the worker too
                    asyncio.get_running_loop().create_task(
                        self.app.crash(StateWriteError(f"{self.role}: batch interrupted"))
                    )
                raise
            except Exception as exc:  # a batch that cannot be applied whole stops the worker
                await self.halt(events, exc)
            else:
                _unpin(events)  # applied whole: the generator's ack may now complete it

    async def apply(self, events: list[Any]) -> None:
        """Fold one batch, publish its outputs, then write its states (rule 6)."""
        await self.wait_for_metadata()  # at once when known; new assignments included
        records = [
            RawRecord(
                e.message.topic,
                e.message.partition,
                e.message.offset,
                e.key,
                e.value,
                int((e.message.timestamp or 0) * 1000),
            )
            for e in events
        ]
        good, dead = split(records, self.role)
        result = fold_batch(self.role, good, self.load, self.runs_in_partition, self.cfg)
        self.evict(result.evicted)
        self.absorb(result.encoded, result.states)
        await self.publish([*dead, *result.dead, *(self.finish(o) for o in result.outputs)])
        await self.write_dirty()

    async def wait_for_metadata(self) -> None:
        """Return once the producer knows every topic this agent writes to.

        Raises:
            StateWriteError: Still unknown after `METADATA_TIMEOUT_S`.
        """
        client = self.app.producer._ensure_producer().client  # type: ignore[attr-defined]
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

    async def write_dirty(self) -> None:
        """Write every state folded and not yet written, retrying the ones that failed.

        Raises:
            StateWriteError: Some state still not written after `STATE_WRITE_ATTEMPTS`.
        """
        for run_id in sorted(self.evicting):  # retention (processors.core.retention)
            key = encode_key(run_id)
            if key in self.table:
                del self.table[key]  # a tombstone in the changelog
            self.decoded.drop(key)
            self.evicting.discard(run_id)
        pending = {encode_key(run_id): (run_id, kept) for run_id, kept in self.dirty.items()}
        delay_s = 0.1
        for attempt in range(1, STATE_WRITE_ATTEMPTS + 1):
            failed: dict[bytes, tuple[str, tuple[bytes, Any]]] = {}
            error: Exception | None = None
            for key, (run_id, (value, state)) in pending.items():
                try:
                    self.faults.check(self.changelog)
                    self.table[key] = value
                except Exception as exc:
                    failed[key], error = (run_id, (value, state)), exc
                else:
                    del self.dirty[run_id]
                    self.decoded.put(key, value, state)
            if not failed:
                return
            log.warning(
                "%s: %d of %d state writes failed (attempt %d of %d): %r",
                self.role,
                len(failed),
                len(pending),
                attempt,
                STATE_WRITE_ATTEMPTS,
                error,
            )
            pending = failed
            if attempt < STATE_WRITE_ATTEMPTS:
                await asyncio.sleep(delay_s)
                delay_s *= 2
                await self.wait_for_metadata()
        raise StateWriteError(
            f"{len(pending)} states of the {self.role} table not written after "
            f"{STATE_WRITE_ATTEMPTS} attempts: {error!r}"
        )

    async def halt(self, events: list[Any], exc: BaseException) -> None:
        """Stop the worker over a batch that failed half-way (and stays pinned).

        Never returns: the agent waits to be cancelled by the stop, so it processes no
        record after the batch (an ack after it could let faust commit past it).
        """
        log.error(
            "%s: a batch of %d records could not be applied whole (%r); stopping the worker "
            "without committing it, a restart applies it again",
            self.role,
            len(events),
            exc,
        )
        await self.app.crash(exc)
        await asyncio.Event().wait()

    async def send(self, events: Sequence[Event]) -> list[Any]:
        """Hand ``events`` to the producer; returns the futures of their acknowledgements."""
        producer = self.app.producer
        return [
            await producer.send(
                output_topic(e, self.topics), encode_key(e.run_id), encode(e), None, None, None
            )
            for e in events
        ]

    async def publish(self, events: list[Event]) -> None:
        """Send ``events`` and wait until Kafka acknowledged every one."""
        if events:
            await asyncio.gather(*await self.send(events))


class _BatchSink:
    """The batch path's body (`processors.transport.BatchSink`): rounds folded, then flushed.

    A round holds, per assigned input partition, consecutive records in offset order.
    The rules are the agents': decode each record once, fold each role's records through
    `fold_batch` (the audit's replay), publish every output and dead letter and wait for
    Kafka's acknowledgement, then write the states (retried in place). The write waits for
    the flush `BatchIngest` asks for every `processors.settings.DEFAULT_STATE_FLUSH_S`:
    until then a run's newest state is kept in its role's body (`_Agent.dirty`) and the
    next round folds from it, and only after the flush are the rounds' offsets
    acknowledged. A round or a flush that cannot be applied whole stops the worker
    without returning (nothing after it is processed, nothing since the last flush
    acknowledged).
    """

    def __init__(self, app: faust.App, roles: dict[str, _Agent]) -> None:
        self.app = app
        self.roles = roles  # input topic name -> the role's body (table, writes, publish)
        self.sent: list[Any] = []  # the producer's futures of every output since the last flush

    @property
    def stats(self) -> transport.RoundStats:
        """The batch path's timing summary (`processors.transport.RoundStats`)."""
        ingest = self.app.batch_ingest if isinstance(self.app, transport.App) else None
        return ingest.stats if ingest is not None else transport.RoundStats()

    async def __call__(self, batches: Mapping[Any, Sequence[ConsumerRecord]]) -> None:
        grouped: dict[str, list[RawRecord]] = {}
        for tp, recs in batches.items():
            grouped.setdefault(tp.topic, []).extend(
                RawRecord(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp or 0)
                for r in recs
            )
        # In `FOLD_ORDER` (the roles' order in ``self.roles``), whatever order the fetch had.
        by_topic = {topic: grouped[topic] for topic in self.roles if topic in grouped}
        try:
            await self.fold(by_topic)
        except asyncio.CancelledError:
            raise  # stopping: the round is not acknowledged, a restart reads it again
        except Exception as exc:
            await self._stop(f"a round of {sum(map(len, by_topic.values()))} records", exc)

    async def fold(self, by_topic: dict[str, list[RawRecord]]) -> None:
        """Fold every role's records and hand their outputs to the producer.

        The fold goes in chunks of about `FOLD_CHUNK_EVENTS` events, and each chunk's
        outputs are handed to the producer as soon as the chunk is folded: a verdict
        waits for the fold of its chunk, not of the whole round. Every output is still
        acknowledged by Kafka before any state folded with it is written (`flush`).
        """
        agents = [self.roles[topic] for topic in by_topic]
        for agent in agents:
            await agent.wait_for_metadata()
        t0 = time.perf_counter()
        sent = self.sent
        for agent, records in zip(agents, by_topic.values(), strict=True):
            good, dead = split(records, agent.role)
            sent += await agent.send(dead)
            encoded: dict[str, bytes] = {}
            states: dict[str, Any] = {}
            evicted: frozenset[str] = frozenset()
            for result in fold_chunks(
                agent.role, good, agent.load, agent.runs_in_partition, agent.cfg, FOLD_CHUNK_EVENTS
            ):
                sent += await agent.send([*result.dead, *(agent.finish(o) for o in result.outputs)])
                encoded, states, evicted = result.encoded, result.states, result.evicted
            agent.evict(evicted)
            agent.absorb(encoded, states)
        self.stats.note("fold_ms", 1000 * (time.perf_counter() - t0))

    async def flush(self) -> None:
        """Wait until Kafka acknowledged every output since the last flush, then write states."""
        try:
            t1 = time.perf_counter()
            sent, self.sent = self.sent, []
            if sent:
                await asyncio.gather(*sent)  # acknowledged, all of them, before any state write
            t2 = time.perf_counter()
            ingest = self.app.batch_ingest if isinstance(self.app, transport.App) else None
            if ingest is not None:
                await ingest.before_writes()  # the commit started after the last flush
            for agent in self.roles.values():
                if agent.dirty or agent.evicting:
                    await agent.write_dirty()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._stop("the states of the last rounds", exc)
        stats = self.stats
        stats.note("publish_ms", 1000 * (t2 - t1))
        stats.note("write_ms", 1000 * (time.perf_counter() - t2))

    def discard(self) -> None:
        """Drop every state not written and the futures of outputs not waited for."""
        self.sent = []
        for agent in self.roles.values():
            agent.discard()

    async def _stop(self, what: str, exc: Exception) -> None:
        """Stop the worker over ``what``, which could not be applied whole; never return."""
        log.error(
            "%s could not be applied whole (%r); stopping the worker without committing "
            "them, a restart applies them again",
            what,
            exc,
        )
        await self.app.crash(exc)
        await asyncio.Event().wait()  # never return: nothing since the last flush is acknowledged


FOLD_CHUNK_EVENTS: Final = 4096
"""Events the batch path folds before handing their outputs to the producer (a pack
counts its events). A round may hold hundreds of thousands of events under a backlog or a
burst; at a few microseconds an event, a verdict that waited for the whole round's fold
waited a second. Chunks cost nothing in throughput: the states of a chunk are carried to
the next in memory, exactly as one fold carries them from record to record."""


def _pin(events: list[Any]) -> None:
    """One more reference per message: the batch's acks can no longer complete it."""
    for event in events:
        event.message.incref()


def _unpin(events: list[Any]) -> None:
    """Drop the reference `_pin` took (faust's own ack of the batch then completes it)."""
    for event in events:
        event.message.decref()


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
    """
    app = transport.App(  # faust.App, with a retry backoff sized for outages
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
        stream_buffer_maxsize=20_000,
        # The batch path's round: at most this many records per fetch, all partitions.
        broker_max_poll_records=settings.batch_max if settings.ingest == "batch" else None,
        worker_redirect_stdouts=False,
        **faust_broker_settings(),
    )
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
        body = _Agent(app, role, table, settings, cfg, topics, finish, faults)
        if settings.ingest == "batch":
            sources.append(source)
            bodies[topic_name] = body
        else:
            app.agent(source, name=f"runwatch.{role}")(body.__call__)
    if settings.ingest == "batch":
        app.ingest_batches(sources, _BatchSink(app, bodies), settings.state_flush_s)
    log.info("ingest: %s, store: %s", settings.ingest, settings.store)

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

    return app
