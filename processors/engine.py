"""The processing engine: whole batches from Kafka into the fold, made durable by a Checkpoint.

faust runs the consumer group, the assignment, the tables and their recovery, the offset
commits and the worker; this module replaces how records reach the fold and how a fold
becomes durable:

* `BatchIngest`: `Consumer.getmany` hands it every fetched round of input records, whole
  per-partition batches; it keeps each partition's next offset due, refuses and re-seeks a
  batch that skips offsets, and feeds the rest to the app's `BatchSink` (the fold);
* `Checkpoint`: the commit protocol, ARCHITECTURE rule 6 as numbered steps (outputs
  acknowledged, states written and acknowledged, offsets acknowledged, commit started);
* faust's Kafka transport (`App`, `Consumer`, `Producer`), subclassed for the above and
  for a retry backoff sized for outages, not for blips.

aiokafka retries everything that fails on a connection (metadata refresh, fetch, group
coordinator lookup, heartbeat, produce) after a fixed ``retry_backoff_ms`` of 100 ms, and
has no growing reconnect backoff. While a broker is down, each of the worker's retry loops
(its consumer's fetcher, coordinator and metadata synchroniser, its producer's sender)
fails at once and tries again 100 ms later: measured on one worker over a 16 s broker stop
(`bench/outage.py`), 1,070 refused connection attempts and 1,398 error lines. faust passes
no ``retry_backoff_ms`` to aiokafka, so this module does:

* the producer through faust's own hook (``Producer._producer_type``);
* the consumer, whose construction faust does not expose, by setting the backoff on the
  consumer and its client right after faust builds it and before it starts (the fetcher
  and the coordinator are created in ``start()`` from it). `compat.set_retry_backoff`
  checks the attributes exist, so an aiokafka that renames them fails the worker's start
  loudly rather than silently going back to 100 ms.

Worse, aiokafka's producer sender spins without any backoff while a partition's leader is
unknown and the broker refuses connections (`_BackoffClient`): the busy loop of a worker
at 70 % of a core during an outage. Both clients here wait the backoff after a failed
metadata update.

`RETRY_BACKOFF_MS` is the one figure: a retry after a failed request (a broker gone, a
leader moved) waits this long. 500 ms keeps a failover after a leader move well under a
second while cutting the outage loop five-fold; the log lines are summarised on top
(`runwatch.logsummary`). Every private name of faust, aiokafka and mode used here is
listed in `processors.compat`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import aiokafka
import faust
from aiokafka.client import AIOKafkaClient
from faust.transport.drivers import aiokafka as driver
from faust.types import TP

from runwatch.common.gc_tuning import collect_between_rounds
from runwatch.processors import compat
from runwatch.processors.acked import AckedRanges
from runwatch.processors.settings import DEFAULT_STATE_FLUSH_S, ENV_BATCH_STATS, ProcessorEnv
from runwatch.schemas.records import RawRecord

FAUST_LOGGER: Final = logging.getLogger("faust.transport.runwatch")
"""The logger of these faust services: under ``faust``, so faust's levels apply (mode names
a service's logger after its class's module, which would put faust's chatter under
``processors``)."""

log = logging.getLogger(__name__)
"""The batch path's own lines (gaps, rebalances): runwatch's, shown without ``-v``."""

RETRY_BACKOFF_MS: Final = 500
"""aiokafka's ``retry_backoff_ms`` for the worker's consumer and producer (default 100)."""


class _BackoffClient(AIOKafkaClient):  # type: ignore[misc]
    """An aiokafka client whose failed metadata update lasts at least its retry backoff.

    aiokafka's producer sender, while a partition's leader is unknown, forces a metadata
    update and waits for it, then loops (its comment says "and wait backoff time"; it does
    not). With the broker down the update fails at once (connection refused), so the
    sender spun: py-spy showed the worker's main thread in ``_md_synchronizer`` /
    ``_get_conn``, ~70 % of a core, ~1,000 refused connections a second, whenever the
    broker's last metadata before it stopped named no leader (its controlled shutdown
    does). Waiting the backoff after a failed update bounds every loop that waits on one.
    """

    async def _metadata_update(self, cluster_metadata: Any, topics: Any) -> bool:
        updated = bool(await super()._metadata_update(cluster_metadata, topics))
        if not updated:
            await asyncio.sleep(self._retry_backoff)
        return updated


def _with_metadata_backoff(client: object) -> None:
    """Make an aiokafka client (built by aiokafka, which takes no client class) a `_BackoffClient`.

    Raises:
        RuntimeError: ``client`` is not a plain `aiokafka.client.AIOKafkaClient`.
    """
    if type(client) is not AIOKafkaClient:
        raise RuntimeError(
            f"aiokafka {aiokafka.__version__}: expected an AIOKafkaClient, got "
            f"{type(client).__name__}; processors.engine needs updating"
        )
    client.__class__ = _BackoffClient  # same layout, one method more: no state to move


class _BackoffProducer(aiokafka.AIOKafkaProducer):  # type: ignore[misc]
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("retry_backoff_ms", RETRY_BACKOFF_MS)
        super().__init__(**kwargs)
        _with_metadata_backoff(self.client)


class Producer(driver.Producer):
    """faust's aiokafka producer, built with `RETRY_BACKOFF_MS`."""

    logger = FAUST_LOGGER

    @property
    def _producer_type(self) -> type[aiokafka.AIOKafkaProducer]:
        return _BackoffProducer


FETCH_MAX_WAIT_MS: Final = 50
"""How long the broker may hold a fetch of the worker's consumer for data (faust: 1,500).

aiokafka keeps one fetch in flight per broker, and leaves the partitions that still hold
unconsumed records out of it. Under load that fetch often names only the quiet partitions
(checkpoints, anomalies, partitions of the others just fetched), which the broker holds
for the whole wait: for up to 1.5 s no record of the busy partitions was fetched, while
they filled (``bench/latency.py``: rounds that waited 1.0 s, faust's ``getmany`` timeout,
then folded records 1.7 s old). 50 ms bounds that stall; idle, it costs 20 empty fetches
a second."""


FETCH_LINGER_S: Final = 0.04
"""How much of the input a fetch lingers for when records come in faster than a trickle.

Under a paced load a round is whatever one fetch brought: aiokafka sends the next fetch
as soon as the last one's records are taken, and the broker answers it as soon as any
byte is there (``fetch_min_bytes`` 1), so the worker folded a round of ~30 records every
few milliseconds, each with the same fixed costs: the fetch across faust's consumer
thread, the round's bookkeeping, and above all the fold's per-run work (the `Replayer`
encodes every state a round touched, once per round: under a paced load that is once per
step of a run, where a drain's round of 20,000 records encodes it once per hundreds of
steps). `bench/latency.py` measured the paced CPU per event at 1.4-3.3x the drain's.
`fetch_linger` asks the broker for about this long of the input's recent byte rate as
``fetch_min_bytes``, so a round holds ~40 ms of records, bounded by `FETCH_MAX_WAIT_MS`
(50 ms). A worker that takes longer than this to fold a round already finds that much
waiting, so it waits for nothing."""
FETCH_LINGER_FLOOR_BYTES: Final = 4 * 1024
"""A linger asking for less than this is not asked for: an input this slow (an idle
worker's few runs: `bench/latency.py`'s 20 probes make ~2.4 KB in 40 ms) is fetched as
soon as a byte is there, so its latency stays as it was."""
FETCH_PARTITION_BYTES: Final = 1024 * 1024
"""The most one partition brings to a fetch (faust's ``consumer_max_fetch_size``, 1 MiB, is
aiokafka's ``max_partition_fetch_bytes``, and the most of it the broker counts towards
``min_bytes``): a linger asks for at most this much per input partition that brought
records to the last fetch, which those partitions can then answer in full."""
FETCH_MIN_BYTES_MAX: Final = 16 * 1024 * 1024
"""The most a linger asks for, however many partitions (aiokafka's ``fetch_max_bytes`` is
50 MB)."""
FETCH_RATE_WEIGHT: Final = 0.5
"""Weight of the latest fetch in the smoothed byte rate (a stop halves it every fetch)."""


@dataclass(frozen=True, slots=True)
class FetchPace:
    """What the fetch linger knows of the input: its smoothed byte rate, its last fetch.

    Attributes:
        bytes_per_s: The input's bytes per second, smoothed over fetches (0: unknown).
        last_s: When the last fetch that brought records came back (monotonic; None: none
            since the last reset).
        asked: The ``min_bytes`` the next fetch asks for (what `fetch_linger` returned).
    """

    bytes_per_s: float = 0.0
    last_s: float | None = None
    asked: int = 1


@dataclass(frozen=True, slots=True)
class Fetched:
    """One fetch as the linger sees it.

    Attributes:
        at_s: When it came back (monotonic seconds).
        input_bytes: Bytes of the input records it brought (0: none).
        other_records: Whether it brought records of other topics (faust's changelog
            recovery, which reads as fast as it can).
        partitions: Input partitions that brought records to it (each brings at most
            `FETCH_PARTITION_BYTES` to a fetch).
    """

    at_s: float
    input_bytes: int
    other_records: bool = False
    partitions: int = 1

    @classmethod
    def of_batch(
        cls, at_s: float, batch: Mapping[Any, Sequence[RawRecord]], other_records: bool
    ) -> Fetched:
        """The fetch that brought ``batch`` (input partition -> its records) at ``at_s``."""
        size = sum(map(compat.value_bytes, batch.values()))
        return cls(at_s, size, other_records, sum(map(bool, batch.values())))


def fetch_linger(
    pace: FetchPace, fetched: Fetched | None, linger_s: float = FETCH_LINGER_S
) -> tuple[FetchPace, int]:
    """The fetch ``min_bytes`` to ask for after ``fetched`` (None: a reset), and the new pace.

    Rules, in order:

    1. A reset (an assignment, a revocation), a fetch of changelog records (a recovery),
       or no linger: forget the pace; 1 byte (answered as soon as anything is there).
    2. A fetch that brought no input record: the input is quiet; forget the pace; 1 byte.
    3. The first fetch with records since the pace was forgotten: remember when; 1 byte.
    4. A fetch that brought less than was asked for (the broker waited its whole
       `FETCH_MAX_WAIT_MS`: the input slowed down, e.g. a drain's backlog ran out): the
       rate is this fetch's own, not smoothed, so the linger ends at once.
    5. Otherwise the input's rate is its bytes since the last fetch over the time between
       them, smoothed (`FETCH_RATE_WEIGHT`).

    After 4 or 5: ask for ``linger_s`` of the rate, capped at `FETCH_PARTITION_BYTES` per
    input partition that brought records to this fetch and at `FETCH_MIN_BYTES_MAX`, or 1
    byte when that is under `FETCH_LINGER_FLOOR_BYTES` (a trickle is not made to wait).
    The broker counts at most `FETCH_PARTITION_BYTES` of each partition towards
    ``min_bytes``, so an ask sized from one partition's backlog and capped by every
    partition held (40 of a fleet's worker) could never be met: each fetch waited its
    whole `FETCH_MAX_WAIT_MS` while that partition caught up (`bench/fleet.py`: a drain's
    tail on the 16,384-rank run's partition went from ~4 s to ~1 s, the drain from
    312k-388k to 345k-492k events/s in ten runs each; under a steady load, where nearly
    every partition brings records, it changed nothing). A cap of one partition's 1 MiB
    whatever the partitions was too low the other way: a worker of four busy partitions at
    400k events/s got ~25 ms of records a round instead of 40, 37 rounds a second where 23
    do, and (`bench/latency.py --worker-cpus 1`) 1.90-1.94 us of its main thread's CPU per
    paced event where 1.82-1.87 do.
    """
    if fetched is None or fetched.other_records or linger_s <= 0:
        return FetchPace(), 1
    if fetched.input_bytes <= 0:
        return FetchPace(), 1
    if pace.last_s is None:
        return FetchPace(pace.bytes_per_s, fetched.at_s), 1
    rate = fetched.input_bytes / max(fetched.at_s - pace.last_s, 1e-3)
    if fetched.input_bytes >= pace.asked and pace.bytes_per_s > 0:
        rate = FETCH_RATE_WEIGHT * rate + (1 - FETCH_RATE_WEIGHT) * pace.bytes_per_s
    want = int(rate * linger_s)
    most = min(FETCH_PARTITION_BYTES * max(fetched.partitions, 1), FETCH_MIN_BYTES_MAX)
    min_bytes = 1 if want < FETCH_LINGER_FLOOR_BYTES else min(want, most)
    return FetchPace(rate, fetched.at_s, min_bytes), min_bytes


ROUND_BULK_S: Final = 0.05
"""About how long a round takes when the bulk topics (the heartbeats) have more waiting.

A spike's step waits for the round in progress, then is folded first in its own round
(`FOLD_ORDER`), its verdict delivered before the round's heartbeats are folded
(`processors.app.URGENT_DELIVERY_S`). Rounds used to be whatever the
fetches had brought, and a worker behind on a heartbeat partition (a large run's, or any
after a pause) folded all of it in one round: rounds of 118-343 ms at p99 on a 2-core
box, and a step that came in meanwhile waited for all of it. A round now takes every
buffered record of the other topics and as many bytes of heartbeat records as fill about
this long (`bulk_share`); the rest stays in aiokafka's buffer for the next round, which
starts at once. About the fetch linger (`FETCH_LINGER_S`), so a paced worker's rounds,
~40 ms of input, are rarely cut."""
ROUND_BULK_MIN_BYTES: Final = 16 * 1024
"""The fewest bulk bytes a round takes, whatever they cost (and at least one record); and
the fewest a round needs for its cost to count (a smaller one's is mostly fixed costs).
~120 loose heartbeats, or a fraction of one pack of 512."""
ROUND_COST_WEIGHT: Final = 0.5
"""Weight of the latest round in the smoothed cost per byte."""


@dataclass(frozen=True, slots=True)
class BulkShare:
    """What the next round may take of the bulk topics, from what rounds cost so far.

    Counted in bytes (`compat.counted_bytes`: the records' values and a fixed overhead
    each), not in records: a fleet's heartbeat topics hold
    loose heartbeats (~130 bytes, one event) beside packs of hundreds (one record of
    tens of kilobytes). A record's fold costs about its events, and its bytes follow its
    events; a share counted in records, sized from a round of loose heartbeats, let the
    next round take as many packs, each a hundred times dearer.

    Attributes:
        s_per_byte: A round's seconds per bulk byte, smoothed (0: not known yet).
        most_bytes: The most bulk bytes the next round takes (None: no limit yet).
    """

    s_per_byte: float = 0.0
    most_bytes: int | None = None


def bulk_share(
    share: BulkShare, round_s: float, bulk_bytes: int, budget_s: float = ROUND_BULK_S
) -> BulkShare:
    """The bulk share after a round that took ``round_s`` and held ``bulk_bytes``.

    Rules, in order:

    1. No budget (``budget_s <= 0``): no limit.
    2. A round of fewer than `ROUND_BULK_MIN_BYTES` bulk bytes: the share is unchanged
       (its time is mostly the other records' and the round's fixed costs).
    3. Otherwise a bulk byte's cost is the round's time over its bulk bytes, smoothed
       (`ROUND_COST_WEIGHT`), and the next round takes ``budget_s`` of it, at least
       `ROUND_BULK_MIN_BYTES`.

    The whole round's time is put on its bulk bytes, the other topics' share too, so a
    whole round, not only its heartbeats, takes about ``budget_s``. Sized from the average
    of every record instead, the cap let in ~1,000 packs of heartbeats where the steps
    were half the records and the cheaper half: rounds of 63-121 ms at p99
    (`bench/latency.py`, three runs).
    """
    if budget_s <= 0:
        return BulkShare()
    if bulk_bytes < ROUND_BULK_MIN_BYTES:
        return share
    cost = round_s / bulk_bytes
    if share.s_per_byte > 0:
        cost = ROUND_COST_WEIGHT * cost + (1 - ROUND_COST_WEIGHT) * share.s_per_byte
    return BulkShare(cost, max(ROUND_BULK_MIN_BYTES, int(budget_s / max(cost, 1e-12))))


class _ConsumerThread(driver.AIOKafkaConsumerThread):
    """faust's consumer thread; the batch path's records come out of it as `RawRecord`s.

    For the topics of the app's `BatchIngest`, the fetched records are made as
    `schemas.records.RawRecord`s straight from aiokafka's record batches
    (`compat.fetched_records`), not as aiokafka `ConsumerRecord`s to be copied again.
    """

    logger = FAUST_LOGGER

    def _create_consumer(self, loop: asyncio.AbstractEventLoop) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_consumer(loop)
        compat.set_retry_backoff(consumer, RETRY_BACKOFF_MS)
        _with_metadata_backoff(compat.client_of(consumer))
        compat.set_fetch_max_wait(consumer, FETCH_MAX_WAIT_MS)
        return consumer

    async def _fetch_records(
        self,
        consumer: aiokafka.AIOKafkaConsumer,
        active_partitions: set[TP],
        timeout: float | None = None,
        max_records: int | None = None,
    ) -> Mapping[TP, list[Any]]:
        ingest = self.consumer.batch_ingest if isinstance(self.consumer, Consumer) else None
        if ingest is None:
            return await super()._fetch_records(consumer, active_partitions, timeout, max_records)
        if not self.consumer.flow_active:
            return {}
        return await compat.fetched_records(
            consumer, active_partitions, timeout, max_records, ingest.topics, ingest.limits
        )


class Consumer(driver.Consumer):
    """faust's aiokafka consumer, its aiokafka consumer given `RETRY_BACKOFF_MS`.

    When the app has a `BatchIngest` (`App.ingest_batches`), the records of its topics
    are handed to it in whole per-partition batches from `getmany` instead of being
    turned into messages for faust's streams; every other topic (the tables' changelogs
    during recovery) takes faust's own path.
    """

    logger = FAUST_LOGGER

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acked = AckedRanges()  # the batch path's acknowledged offsets (`ack_range`)

    def _new_consumer_thread(self) -> driver.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    @property
    def batch_ingest(self) -> BatchIngest | None:
        """The app's batch path, if it has one."""
        app = self.app
        return app.batch_ingest if isinstance(app, App) else None

    async def getmany(self, timeout: float) -> AsyncIterator[tuple[TP, Any]]:
        """Faust's `getmany`, the batch path's topics fed to `BatchIngest.round`."""
        ingest = self.batch_ingest
        if ingest is None:
            async for item in super().getmany(timeout):
                yield item
            return
        t_wait = time.perf_counter()
        records, active = await compat.next_records(self, timeout)
        if records is None or self.should_stop:
            return
        ingest.stats.note("wait_ms", 1000 * (time.perf_counter() - t_wait))
        if not self.flow_active:  # as faust's: back to the committed offsets
            try:
                await self.perform_seek()
            except Exception as exc:
                self.log.warning(f"exception performing seek when flow not active {exc}")
            return
        batch = {tp: recs for tp, recs in records.items() if tp.topic in ingest.topics}
        rest = {tp: recs for tp, recs in records.items() if tp.topic not in ingest.topics}
        self._linger(ingest, batch, bool(rest))
        if rest:
            generation_id = self.app.consumer_generation_id
            for tp, record in self.scheduler.iterate(rest):
                if not self.flow_active or self.app.consumer_generation_id != generation_id:
                    break
                if active is None or tp in active or tp in compat.buffered_partitions(self):
                    self.app.monitor.track_tp_end_offset(tp, self.highwater(tp))
                    yield tp, compat.to_message(self, tp, record)
        # Whole or not at all: a stop cancels the fetcher, and a round or flush cut off
        # half-way could not be flushed by the stop (`BatchIngest.flush_at_stop`).
        if batch:
            await _to_the_end(ingest.round(self, batch))
        elif ingest.unflushed_since is not None:  # a quiet fetch: the last rounds may be due
            await _to_the_end(ingest.maybe_flush(self))
        t_gc = time.perf_counter()
        if collect_between_rounds() is not None:  # `runwatch processors`: only between rounds
            ingest.stats.note("gc_ms", 1000 * (time.perf_counter() - t_gc))

    def _linger(self, ingest: BatchIngest, batch: Mapping[Any, Sequence[Any]], other: bool) -> None:
        """Set the next fetch's ``min_bytes`` from this one (`fetch_linger`)."""
        fetched = Fetched.of_batch(time.monotonic(), batch, other)
        ingest.pace, min_bytes = fetch_linger(ingest.pace, fetched, ingest.linger_s)
        self._set_min_bytes(ingest, min_bytes)

    def _set_min_bytes(self, ingest: BatchIngest, min_bytes: int) -> None:
        if min_bytes != ingest.min_bytes and compat.set_fetch_min_bytes(self, min_bytes):
            ingest.min_bytes = min_bytes
        ingest.stats.note("min_kb", ingest.min_bytes / 1024)

    def ack_range(self, tp: TP, first: int, last: int) -> None:
        """Acknowledge offsets ``first..last`` of ``tp`` (applied whole) for faust's commits.

        As faust's ``ack``, nothing below the committed offset is noted.
        """
        committed = compat.faust_committed(self, tp)
        if committed is not None:
            first = max(first, committed)
        if first > last:
            return
        self.acked.add(tp, first, last)
        compat.note_acks(self, tp, last - first + 1)

    def _new_offset(self, tp: TP) -> int | None:
        """Faust's next offset to commit for ``tp``; the batch path's from its ranges."""
        if self.acked.holds(tp):
            return self.acked.next_commit(tp, compat.faust_committed(self, tp))
        return super()._new_offset(tp)

    async def committed_offset(self, tp: TP) -> int | None:
        """The group's committed offset of ``tp`` as the broker has it (None: no commit)."""
        return await compat.committed_offset(self, tp)

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        """Let the batch in flight finish and commit it, then revoke as faust does."""
        ingest = self.batch_ingest
        if ingest is not None and not self.app.should_stop:
            self.stop_flow()  # faust's revocation stops it too; no new round from here
            if await ingest.wait_idle(REVOKE_WAIT_S):
                await ingest.flush(self)  # states written, ranges acknowledged
                await self.commit()
            else:
                log.warning(
                    "revocation: a batch still in flight after %.0f s; it is not committed",
                    REVOKE_WAIT_S,
                )
            ingest.forget()
        if ingest is not None:
            self._reset_linger(ingest)
        await super().on_partitions_revoked(revoked)
        self.acked.forget(revoked)  # as faust drops its own acknowledgements of them

    def _reset_linger(self, ingest: BatchIngest) -> None:
        """Forget the input's pace: the next fetches are answered as soon as a byte is there."""
        ingest.pace, min_bytes = fetch_linger(ingest.pace, None)
        self._set_min_bytes(ingest, min_bytes)

    async def on_stop(self) -> None:
        """Flush the batch path's last rounds, then stop as faust does (its stop commits)."""
        ingest = self.batch_ingest
        if ingest is not None:
            await ingest.flush_at_stop(self, STOP_FLUSH_WAIT_S)
        await super().on_stop()

    async def on_partitions_assigned(self, assigned: set[TP], generation_id: int = 0) -> None:
        """A new assignment: every partition's next batch starts from the group's commit."""
        ingest = self.batch_ingest
        if ingest is not None:
            ingest.forget()
            self._reset_linger(ingest)
        await super().on_partitions_assigned(assigned, generation_id)


async def _to_the_end(step: Awaitable[None]) -> None:
    """Await ``step``, which runs to its end even if the caller is cancelled meanwhile."""
    await asyncio.shield(asyncio.ensure_future(step))


class Transport(driver.Transport):
    """faust's aiokafka transport with this module's consumer and producer."""

    Consumer = Consumer
    Producer = Producer


class App(faust.App):
    """A faust app whose Kafka clients use `Transport` (everything else is faust's)."""

    logger = FAUST_LOGGER
    _batch_ingest: BatchIngest | None = None

    @property
    def batch_ingest(self) -> BatchIngest | None:
        """The batch path `ingest_batches` set up, or None (records go to agents)."""
        return self._batch_ingest

    def ingest_batches(
        self,
        topics: Sequence[Any],
        sink: BatchSink,
        flush_interval_s: float = DEFAULT_STATE_FLUSH_S,
        bulk: Iterable[str] = (),
    ) -> None:
        """Consume ``topics`` in whole per-partition batches through ``sink``, not agents.

        The topics are subscribed like an agent's (so the assignor co-partitions them
        with the tables), but their records reach only ``sink`` (`BatchIngest`), flushed
        every ``flush_interval_s``. A round takes only about `ROUND_BULK_S` of the records
        of the ``bulk`` topics (names), after every other topic's.

        Raises:
            RuntimeError: Called twice.
        """
        if self._batch_ingest is not None:
            raise RuntimeError("ingest_batches: the app already has a batch path")
        for topic in topics:
            self.topics.add(topic)
        self._batch_ingest = BatchIngest(
            {name for t in topics for name in t.topics}, sink, flush_interval_s, bulk
        )

    def _new_transport(self) -> Transport:
        return Transport(self.conf.broker_consumer, self)

    def _new_producer_transport(self) -> Transport:
        return Transport(self.conf.broker_producer, self)


# --------------------------------------------------------------------------------------
# The engine: batches in, checkpoints out.


StateAcks = Callable[[], Awaitable[None]]
"""Waits until Kafka acknowledged every state a checkpoint wrote (`BatchSink.write_states`)."""


class BatchSink(Protocol):
    """Folds whole per-partition batches of raw records and makes their results durable.

    A call gets, per assigned partition, consecutive records in offset order: it folds
    them, hands their outputs to the producer and keeps their new states in memory. The
    `Checkpoint` then asks, in its order, for the outputs to be acknowledged by Kafka
    (`outputs_acknowledged`), for the kept states to be written (`write_states`), and,
    beside the next rounds, for Kafka's acknowledgement of each written state (the
    `StateAcks` it returned); only after all three are the rounds before it applied.
    `discard` drops the kept states (the rounds they came from are read again). Raising,
    or never returning, leaves every round since the last checkpoint unacknowledged.
    """

    async def __call__(self, batches: Mapping[TP, Sequence[RawRecord]]) -> None:
        """Fold one round and hand its outputs to the producer; keep its states."""

    async def outputs_acknowledged(self) -> None:
        """Return once Kafka acknowledged every output handed over so far."""

    async def write_states(self) -> StateAcks:
        """Hand every kept state to the producer as a changelog record (the table holds it).

        Returns:
            What waits, beside the next rounds, until Kafka acknowledged each of these
            changelog records (writing a refused one again); it stops the worker when one
            cannot be stored.
        """

    def discard(self) -> None:
        """Drop the kept states and outputs' futures: their rounds are read again."""

    async def stop(self, what: str, exc: Exception) -> None:
        """Stop the worker over ``what``, which failed; never return."""


@dataclass(frozen=True, slots=True)
class FoldedRange:
    """Offsets ``first..last`` of ``tp``, folded in rebalance generation ``generation``."""

    tp: TP
    first: int
    last: int
    generation: int


class Checkpoint:
    """The commit protocol: the rounds folded since the last checkpoint, made durable whole.

    Rounds are folded into it (`add`, after the sink folded them); `commit` makes them
    durable in ARCHITECTURE's order (rule 6, docs/processors.md rules 3 and 4), each step
    only once the one before it is done:

    1. outputs: wait until Kafka acknowledged every verdict, command and dead letter the
       rounds handed to the producer (publish, then write);
    2. the checkpoint before: wait until it is settled (its steps 4 and 5) and the offset
       commit it started is done (faust's commit flushes its producer buffer until it is
       empty, which state writes would keep from happening; its error fails this
       checkpoint). So checkpoints' state writes reach the changelog in their order, and
       their ranges are acknowledged in their order;
    3. states: write each run's newest state once (`BatchSink.write_states`: the table
       holds it, its changelog record is handed to the producer; the next rounds fold from
       it). `commit` returns here, and steps 4 and 5 run beside the next rounds (`settle`);
    4. acknowledgements, then offsets: wait until Kafka acknowledged each changelog record
       (`StateAcks`: a refused write is written again, then fails), and only then
       acknowledge each folded range of the current rebalance generation into faust's
       offset tracking (`Consumer.ack_range`); ranges of an older generation are not
       acknowledged (read again, by their partition's new owner);
    5. commit: start faust's offset commit of what step 4 acknowledged, at most once per
       ``broker_commit_interval``; it runs beside the next rounds, and step 2 of the next
       checkpoint waits for it.

    A step that fails ends the checkpoint there and stops the worker (`BatchSink.stop`):
    nothing is acknowledged, so nothing is committed past a record whose state is not
    stored; the checkpoints after it wait at their step 2 and acknowledge nothing either.
    `abort` drops the rounds not yet committed instead (a rebalance): their states are
    discarded and they are read again from the committed offsets.

    Why steps 4 and 5 run beside the next rounds: waiting for the changelog
    acknowledgements on the fold's path stopped the fold for 170-280 ms a checkpoint under
    a backlog, and every record fetched meanwhile waited with it under a paced load
    (docs/processors.md, "Where the microseconds go per event").
    """

    def __init__(self, sink: BatchSink) -> None:
        """A checkpoint of ``sink``'s rounds, empty."""
        self.sink = sink
        self.ranges: list[FoldedRange] = []
        self.opened_s: float | None = None  # when the oldest range was folded (monotonic)
        self.settling: asyncio.Future[None] | None = None  # steps 4-5 of the last commit
        self.committing: asyncio.Future[Any] | None = None  # the offset commit of step 5
        self.last_commit_s = time.monotonic()
        self.stats: RoundStats | None = None

    def add(self, folded: FoldedRange, now_s: float) -> None:
        """Note a range the sink folded (its outputs handed over, its states kept)."""
        if self.opened_s is None:
            self.opened_s = now_s
        self.ranges.append(folded)

    def abort(self) -> None:
        """Drop every range not yet written and the sink's kept states: they are read again.

        A checkpoint already written and settling is left to settle: its states are in the
        table, and its ranges are acknowledged only if the rebalance generation did not
        change meanwhile.
        """
        self.sink.discard()
        self.ranges.clear()
        self.opened_s = None

    async def commit(self, consumer: Consumer) -> None:
        """Make the rounds since the last checkpoint durable, in the numbered steps above.

        Returns after step 3; steps 4 and 5 run beside the next rounds (`settled` waits).

        Raises:
            Exception: What a step raised; nothing of this checkpoint is acknowledged.
        """
        if self.opened_s is None:
            return
        await self.sink.outputs_acknowledged()  # 1
        try:
            await self.settled()  # 2
        except Exception as exc:
            await self.sink.stop("the states of the checkpoint before the last rounds", exc)
        try:
            await self.previous_commit()
        except Exception as exc:
            await self.sink.stop("the offset commit before the last rounds' states", exc)
        acknowledged = await self.sink.write_states()  # 3
        ranges, self.ranges, self.opened_s = self.ranges, [], None
        self.settling = asyncio.ensure_future(self.settle(consumer, acknowledged, ranges))

    async def settle(
        self, consumer: Consumer, acknowledged: StateAcks, ranges: Sequence[FoldedRange]
    ) -> None:
        """Steps 4 and 5 of a checkpoint whose states are written: acknowledgements, then ranges."""
        t0 = time.perf_counter()
        await acknowledged()  # 4: the sink stops the worker when a state cannot be stored
        if self.stats is not None:
            self.stats.note("ack_ms", 1000 * (time.perf_counter() - t0))
        generation = consumer.app.consumer_generation_id
        for folded in ranges:
            if folded.generation == generation:
                consumer.ack_range(folded.tp, folded.first, folded.last)
        self._maybe_start_commit(consumer)  # 5

    async def settled(self) -> None:
        """Return once the last checkpoint's steps 4 and 5 are done (its ranges acknowledged).

        Raises:
            Exception: The error of step 4.
        """
        settling = self.settling
        if settling is not None:
            await asyncio.shield(settling)
            if self.settling is settling:
                self.settling = None

    async def previous_commit(self) -> None:
        """Return once the last checkpoint settled and the offset commit it started is done.

        Raises:
            Exception: The settling's or the commit's own error.
        """
        await self.settled()
        committing = self.committing
        if committing is not None:
            await asyncio.shield(committing)
            self.committing = None

    def commit_done(self) -> bool:
        """Whether no offset commit started by a checkpoint is still running."""
        return self.committing is None or self.committing.done()

    def _maybe_start_commit(self, consumer: Consumer) -> None:
        # Started here and not awaited: faust's own commit task cannot be relied on under
        # load (it flushes faust's producer buffer first, which returns only once the
        # buffer is empty, and the table writes kept it from ever emptying: bench/
        # latency.py, nothing committed during a 20 s load), and awaited, the commit (a
        # flush, then an offset commit through the consumer thread, up to 280 ms under
        # load) held up every verdict behind it.
        compat.reset_ack_count(consumer)
        now = time.monotonic()
        interval_s = consumer.app.conf.broker_commit_interval
        if now - self.last_commit_s >= interval_s and self.commit_done():
            self.last_commit_s = now
            self.committing = asyncio.ensure_future(consumer.commit())


REVOKE_WAIT_S: Final = 30.0
"""Longest a revocation waits for the batch in flight to be applied and acknowledged."""
STOP_FLUSH_WAIT_S: Final = 10.0
"""Longest a stopping worker waits to flush its last rounds (it then stops without)."""


class RoundStats:
    """Where the batch path's time goes: one summary line every ``interval_s``, or nothing.

    Enabled by `ENV` (seconds between lines; unset or 0: off, and `note` costs one
    attribute test). Each line is ``batch path stats: {json}`` with, per quantity, the
    count, p50, p99, max and sum over the interval; ``bench/latency.py`` reads them.
    Quantities: ``wait_ms`` (the fetch: `Consumer.getmany` waiting for records across
    faust's consumer thread), ``records`` (records per round), ``age_ms`` (the round's
    oldest record's age, from its Kafka timestamp, when the fold starts; ``age_max_at``:
    ``topic:partition`` of the interval's oldest), ``urgent_age_ms`` (the same of the
    round's records outside the bulk topics, when it has any: how long a spike's step
    waited for its round), ``fold_ms``
    (decode + `fold_batch`, all roles, outputs handed to the producer chunk by chunk),
    ``deliver_ms`` (within ``fold_ms``, a round whose steps, checkpoints or anomalies made
    outputs: waiting for them to be delivered before its heartbeats' fold), ``round_ms``
    (the whole round); per flush: ``publish_ms`` (waiting for the outputs'
    acknowledgements), ``write_ms`` (table writes handed to the producer), ``write_kb``
    (the bytes of the states those writes carried), ``flush_ms``
    (the flush on the round's path: steps 1-3 of `Checkpoint`), ``ack_ms`` (beside the
    next rounds: waiting for the changelog acknowledgements, step 4);
    ``first_start`` / ``last_end``: when the interval's first round began and its last
    ended (epoch seconds); ``rounds``: ``[end, records, cpu_s, main_cpu_s]`` of each of its
    rounds (epoch seconds; the process's CPU seconds, every thread, and the main thread's,
    at the round's end), so a bench can find the round that reached a backlog's end (the
    interval's ``last_end`` may be a later round's, after an idle wait: `bench/processors.py`'s
    ``drain_window``) and the CPU up to it; ``first_start_cpu_s``: ``[cpu_s, main_cpu_s]``
    when the interval's first round began. A drain of a second or two spans a few looks at
    ``/proc`` from outside, and interpolating between them misplaced up to a look's worth
    of CPU; the worker's own clocks at its rounds' edges do not.
    """

    ENV = ENV_BATCH_STATS

    def __init__(self, interval_s: float = 0.0) -> None:
        """Summarise every ``interval_s`` seconds (0: never, and keep nothing)."""
        self.interval_s = interval_s
        self.samples: dict[str, list[float]] = {}
        self.since = time.monotonic()
        self.span: tuple[float, float] | None = None  # (first start, last end) of rounds, epoch s
        self.first_cpu: tuple[float, float] = (0.0, 0.0)  # CPU s when the first round began
        self.rounds: list[tuple[float, int, float, float]] = []  # (end, records, CPU s at end)
        self.oldest: tuple[float, str] | None = None  # the interval's oldest record: (ms, where)

    @classmethod
    def from_env(cls) -> RoundStats:
        """The stats the environment asks for."""
        return cls(ProcessorEnv.from_env().batch_stats_s)

    def note(self, name: str, value: float) -> None:
        """Record one sample of ``name``."""
        if self.interval_s:
            self.samples.setdefault(name, []).append(value)

    def note_age(self, age_ms: float, topic: str, partition: int) -> None:
        """Record a round's oldest record's age, and where the interval's oldest one was."""
        if self.interval_s:
            self.note("age_ms", age_ms)
            if self.oldest is None or age_ms > self.oldest[0]:
                self.oldest = (age_ms, f"{topic}:{partition}")

    @staticmethod
    def cpu_now() -> tuple[float, float]:
        """The process's CPU seconds (every thread) and the calling thread's, now."""
        return time.process_time(), time.thread_time()

    def round_span(
        self,
        start_s: float,
        end_s: float,
        records: int,
        start_cpu: tuple[float, float],
        end_cpu: tuple[float, float],
    ) -> None:
        """Record that a round of ``records`` ran from ``start_s`` to ``end_s`` (epoch seconds).

        ``start_cpu`` and ``end_cpu``: `cpu_now` when it began and ended.
        """
        if self.interval_s:
            if self.span is None:
                self.first_cpu = (round(start_cpu[0], 4), round(start_cpu[1], 4))
            self.span = (start_s if self.span is None else self.span[0], end_s)
            cpu_s, main_s = end_cpu
            self.rounds.append((round(end_s, 4), records, round(cpu_s, 4), round(main_s, 4)))

    def maybe_report(self) -> None:
        """Log the summary line when an interval has passed, and start the next."""
        now = time.monotonic()
        if not self.interval_s or now - self.since < self.interval_s:
            return
        summary: dict[str, Any] = {"t": round(time.time(), 3), "interval_s": now - self.since}
        if self.span is not None:
            summary["first_start"], summary["last_end"] = self.span
            summary["first_start_cpu_s"] = self.first_cpu
            summary["rounds"] = self.rounds
        if self.oldest is not None:
            summary["age_max_at"] = self.oldest[1]
        for name, values in self.samples.items():
            values.sort()
            summary[name] = {
                "n": len(values),
                "p50": round(values[len(values) // 2], 2),
                "p99": round(values[min(len(values) - 1, int(0.99 * len(values)))], 2),
                "max": round(values[-1], 2),
                "sum": round(sum(values), 1),
            }
        log.info("batch path stats: %s", json.dumps(summary))
        self.samples, self.since, self.span, self.rounds = {}, now, None, []
        self.oldest = None


class _Cursor:
    """Where one partition stands on the batch path.

    Attributes:
        expected: The next offset to apply: everything below it is applied (states written).
        gap: ``(expected, first)`` of the last gap seen: a batch that began at ``first``
            while ``expected`` was due. Seen twice in a row after a re-seek, the offsets in
            between hold no records (control batches, retention) and are passed over.
    """

    __slots__ = ("expected", "gap")

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.gap: tuple[int, int] | None = None


class BatchIngest:
    """Feeds whole per-partition batches to a `BatchSink` and acknowledges them as ranges.

    faust keeps everything around the records: group membership, the assignment, table
    recovery, offset commits, the worker's lifecycle. Only the delivery changes: the
    records of the topics named here never become faust ``Message``s, never go through
    the conductor, a stream or an agent; `Consumer.getmany` hands every fetched round of
    them to this object, which

    1. keeps, per assigned partition, the next offset it must apply (`_Cursor`): from
       the group's committed offset when the partition is first seen in an assignment, or
       the partition's first offset when the group has none;
    2. drops records below it (already applied: a seek back to the committed offset);
    3. refuses a batch that begins above it: faust can fetch records and drop them (those
       of a partition paused during recovery, which a seek to a missing commit does not
       bring back), so a batch that skips offsets is not applied; the partition is sought
       back to the expected offset and the miss is logged. Only when the same gap comes
       back after that seek are the offsets taken to hold no record and passed over
       (logged);
    4. awaits the sink with the round's batches (fold, outputs handed to the producer),
       moves each partition's next offset past its batch, and keeps the batch's range;
    5. once ``flush_interval_s`` has passed since the oldest range kept (checked after
       each round, and after each fetch that brought none), commits the `Checkpoint`
       (outputs acknowledged by Kafka, states written; then, beside the next rounds,
       the states acknowledged by Kafka, only then the ranges acknowledged in faust's
       offset tracking and an offset commit started); nothing is acknowledged past a
       record whose state is not stored. A revocation and a stop commit the checkpoint
       and wait for it to settle before faust's own commit.

    A round whose rebalance generation changed while it was applied is not acknowledged
    (its records are read again; the states skip what they applied, by offset).
    """

    def __init__(
        self,
        topics: Iterable[str],
        sink: BatchSink,
        flush_interval_s: float = DEFAULT_STATE_FLUSH_S,
        bulk: Iterable[str] = (),
    ) -> None:
        """Deliver the records of ``topics`` to ``sink``, flushing every ``flush_interval_s``.

        A round takes about `ROUND_BULK_S` of the records of the ``bulk`` topics, after
        every other topic's (`bulk_share`).
        """
        self.topics = frozenset(topics)
        self.bulk = frozenset(bulk) & self.topics
        self.share = BulkShare()
        # the bytes (`compat.counted_bytes`) the next fetch may take of each bulk topic
        # (None: all); replaced whole after each round, read there
        self.limits: Mapping[str, int] | None = None
        self.sink = sink
        self.flush_interval_s = flush_interval_s
        self.cursors: dict[TP, _Cursor] = {}
        self.idle = asyncio.Event()
        self.idle.set()
        self.stats = RoundStats.from_env()
        self.checkpoint = Checkpoint(sink)
        self.checkpoint.stats = self.stats if self.stats.interval_s else None
        self.interrupted = False  # a round or flush was cancelled half-way: never flush again
        self.linger_s = FETCH_LINGER_S
        self.pace = FetchPace()  # the input's pace, for the fetch linger (`fetch_linger`)
        self.min_bytes = 1  # the fetch min_bytes the consumer asks for now

    @property
    def unflushed_since(self) -> float | None:
        """When the oldest round not yet checkpointed was folded (None: there is none)."""
        return self.checkpoint.opened_s

    def forget(self) -> None:
        """Drop every cursor: each partition's next batch starts from the group's commit.

        Rounds folded and not flushed (a revocation that could not wait for them) are
        dropped with the sink's kept states: they are read again from the commit.
        """
        self.cursors.clear()
        if self.unflushed_since is not None:
            log.warning(
                "batch path: %d folded batches not flushed; dropping their states, they are "
                "read again from the committed offsets",
                len(self.checkpoint.ranges),
            )
        self.checkpoint.abort()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no round, nor its commit, is in flight.

        Returns:
            False when one still is after ``timeout_s``.
        """
        try:
            await asyncio.wait_for(self.idle.wait(), timeout_s)
            await asyncio.wait_for(self.before_writes(), timeout_s)
        except TimeoutError:
            return False
        except Exception as exc:  # the commit's; the caller commits again
            log.warning("batch path: the commit after the last round failed: %r", exc)
        return True

    async def before_writes(self) -> None:
        """Return once the offset commit the last checkpoint started is done (its step 2).

        Raises:
            Exception: The commit's own error.
        """
        await self.checkpoint.previous_commit()

    async def round(self, consumer: Consumer, records: Mapping[Any, Sequence[Any]]) -> None:
        """Fold one fetched round of records of this path's topics; flush when one is due."""
        await self._busy(self._round_then_flush(consumer, records))

    async def maybe_flush(self, consumer: Consumer) -> None:
        """Flush if the oldest round not flushed is ``flush_interval_s`` old (a quiet fetch)."""
        if self.unflushed_since is not None:
            await self._busy(self._flush_if_due(consumer))

    async def _busy(self, work: Awaitable[None]) -> None:
        """Await ``work`` with `idle` cleared; a cancellation marks the path interrupted."""
        self.idle.clear()
        try:
            await work
        except asyncio.CancelledError:
            self.interrupted = True
            raise
        finally:
            self.idle.set()

    async def _round_then_flush(
        self, consumer: Consumer, records: Mapping[Any, Sequence[Any]]
    ) -> None:
        await self._round(consumer, records)
        await self._flush_if_due(consumer)

    async def flush_at_stop(self, consumer: Consumer, timeout_s: float) -> None:
        """Flush the rounds not yet flushed of a stopping worker, if that is still safe.

        Rounds and flushes run to their end when the fetcher is cancelled (`getmany`);
        one cancelled all the same (the event loop closing) may have left states half taken
        and outputs not waited for, and then the rounds are left to be read again, as after
        a crash. Waits at most ``timeout_s``.
        """
        if self.unflushed_since is None:
            return
        try:
            if not await self.wait_idle(timeout_s):
                log.warning("stopping: a round still in flight; its rounds are read again")
                return
            if self.interrupted:
                log.info("stopping: a round was interrupted; the rounds since the last flush "
                         "are read again")  # fmt: skip
                return
            await asyncio.wait_for(self.flush(consumer), timeout_s)
            log.info("stopping: the last rounds' states written and their offsets acknowledged")
        except Exception as exc:  # the stop goes on; the rounds are read again
            log.warning("stopping: the last rounds could not be flushed (%r)", exc)

    async def _flush_if_due(self, consumer: Consumer) -> None:
        since = self.unflushed_since
        if since is None or not consumer.flow_active:  # a revocation flushes for itself
            return
        if time.monotonic() - since >= self.flush_interval_s:
            await self._commit(consumer)  # it settles beside the next rounds

    async def flush(self, consumer: Consumer) -> None:
        """Commit the checkpoint and wait until it settled: its rounds' ranges acknowledged.

        What a revocation and a stop do before faust's own commit; a round's flush leaves
        the settling to run beside the next rounds (`Checkpoint.commit`).

        Raises what a step of `Checkpoint.commit` raised, acknowledging nothing.
        """
        await self._commit(consumer)
        await self.checkpoint.settled()

    async def _commit(self, consumer: Consumer) -> None:
        if self.unflushed_since is None:
            return
        t_flush = time.perf_counter()
        await self.checkpoint.commit(consumer)
        if self.stats.interval_s:
            self.stats.note("flush_ms", 1000 * (time.perf_counter() - t_flush))

    async def _round(self, consumer: Consumer, records: Mapping[Any, Sequence[Any]]) -> None:
        app = consumer.app
        generation = app.consumer_generation_id
        active = compat.active_partitions(consumer)
        take: dict[TP, tuple[int, Sequence[Any]]] = {}
        for raw_tp, recs in records.items():
            tp = _tp(raw_tp)
            if not recs:
                continue
            if tp not in active:
                # faust drops these too; the cursor notices the hole when it comes back.
                log.debug("batch path: %d records of inactive %s not applied", len(recs), tp)
                continue
            cursor = await self._cursor(consumer, tp)
            if recs[0].offset < cursor.expected:
                recs = [r for r in recs if r.offset >= cursor.expected]
                if not recs:
                    continue
            first = recs[0].offset
            start = cursor.expected
            if first > cursor.expected:
                if cursor.gap == (cursor.expected, first):
                    log.warning(
                        "%s: offsets %d..%d hold no records (read twice); passing over them",
                        tp,
                        cursor.expected,
                        first - 1,
                    )
                else:
                    log.warning(
                        "%s: a batch began at offset %d while %d was due; not applying it, "
                        "seeking back to %d",
                        tp,
                        first,
                        cursor.expected,
                        cursor.expected,
                    )
                    cursor.gap = (cursor.expected, first)
                    await consumer.seek_wait({tp: cursor.expected})
                    continue
            take[tp] = (start, recs)
        if not take or not consumer.flow_active or app.consumer_generation_id != generation:
            return
        stats = self.stats
        taken, cpu0 = 0, (0.0, 0.0)
        if stats.interval_s:
            cpu0 = stats.cpu_now()
            taken = sum(len(recs) for _, recs in take.values())
            stats.note("records", taken)
            oldest_tp = min(take, key=lambda tp: take[tp][1][0].timestamp_ms)
            oldest_ms = take[oldest_tp][1][0].timestamp_ms
            now_ms = time.time() * 1000
            stats.note_age(now_ms - oldest_ms, oldest_tp.topic, oldest_tp.partition)
            urgent = [take[tp][1][0].timestamp_ms for tp in take if tp.topic not in self.bulk]
            if urgent:  # what a spike's step waited before its round: fetch, round before
                stats.note("urgent_age_ms", now_ms - min(urgent))
        t_sink = time.perf_counter()
        await self.sink({tp: recs for tp, (_, recs) in take.items()})
        if self.bulk:
            self._size_bulk(time.perf_counter() - t_sink, take)
        if app.consumer_generation_id != generation:
            # The revocation did not wait for this round: its states and those of every
            # round not flushed may belong to partitions this worker no longer holds.
            log.info("batch path: rebalanced while applying a round; not acknowledging it")
            self.checkpoint.abort()
            return
        inbound = compat.inbound_times(app)
        now = time.monotonic()
        for tp, (start, recs) in take.items():
            last = recs[-1].offset
            self.checkpoint.add(FoldedRange(tp, start, last, generation), now)
            cursor = self.cursors[tp]
            cursor.expected, cursor.gap = last + 1, None
            if inbound is not None:
                inbound[tp] = now  # faust's livelock detector reads this
        if stats.interval_s:
            now_s = time.perf_counter()
            stats.note("round_ms", 1000 * (now_s - t_sink))
            wall_s = time.time()
            stats.round_span(wall_s - (now_s - t_sink), wall_s, taken, cpu0, stats.cpu_now())
            stats.maybe_report()

    def _size_bulk(self, round_s: float, take: Mapping[TP, tuple[int, Sequence[Any]]]) -> None:
        """Size the next fetch's share of the bulk topics from this round's cost."""
        bulk = self.bulk
        held = sum(compat.counted_bytes(recs) for tp, (_, recs) in take.items() if tp.topic in bulk)
        self.share = bulk_share(self.share, round_s, held)
        most = self.share.most_bytes
        self.limits = None if most is None else dict.fromkeys(self.bulk, most)
        if most is not None:
            self.stats.note("bulk_kb", most / 1024)

    async def _cursor(self, consumer: Consumer, tp: TP) -> _Cursor:
        cursor = self.cursors.get(tp)
        if cursor is None:
            committed = await consumer.committed_offset(tp)
            if committed is None or committed < 0:  # no commit yet: from the partition's start
                committed = (await consumer.earliest_offsets(tp))[tp]
            cursor = self.cursors[tp] = _Cursor(committed)
            log.debug("batch path: %s starts at offset %d", tp, committed)
        return cursor


def _tp(tp: Any) -> TP:
    return tp if type(tp) is TP else TP(tp.topic, tp.partition)
