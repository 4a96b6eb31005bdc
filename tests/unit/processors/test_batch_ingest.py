"""The batch path's bookkeeping (`processors.engine.BatchIngest`, `Checkpoint`), case by case.

What is tested here is this module's own logic: which records of a fetched round it
applies, which it refuses, where it seeks, when it flushes and what it acknowledges. The consumer below is a
stand-in that records the calls BatchIngest makes on faust's consumer (seek, ack of a
range, the committed offset); it claims nothing about Kafka or faust. That the path works
against a real broker and real faust workers is shown by the integration tests in
tests/integration/processors/.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any, NamedTuple

import pytest
from faust.types import TP

from runwatch.processors.engine import BatchIngest, RoundStats

IN = TP("in", 0)
OTHER = TP("in", 1)


class Rec(NamedTuple):
    offset: int


def recs(first: int, last: int) -> list[Rec]:
    return [Rec(o) for o in range(first, last + 1)]


class StandInConsumer:
    """Records what BatchIngest asks of faust's consumer."""

    def __init__(self, committed: int | None = 0, earliest: int = 0) -> None:
        self.app = SimpleNamespace(
            consumer_generation_id=1,
            monitor=SimpleNamespace(stream_inbound_time={}),
            conf=SimpleNamespace(broker_commit_every=None, broker_commit_interval=3600.0),
        )
        self.flow_active = True
        self.active = {IN, OTHER}
        self.committed = committed
        self.earliest = earliest
        self.acked: list[tuple[TP, int, int]] = []
        self.seeks: list[dict[TP, int]] = []
        self._n_acked = 0
        self.commits = 0

    def _get_active_partitions(self) -> set[TP]:
        return self.active

    async def seek_wait(self, partitions: Mapping[TP, int]) -> None:
        self.seeks.append(dict(partitions))

    def ack_range(self, tp: TP, first: int, last: int) -> None:
        self.acked.append((tp, first, last))

    async def committed_offset(self, tp: TP) -> int | None:
        return self.committed

    async def earliest_offsets(self, *tps: TP) -> dict[TP, int]:
        return {tp: self.earliest for tp in tps}

    async def commit(self) -> None:
        self.commits += 1


class Stopped(Exception):
    """What the stand-in sink's `stop` raises where the real one stops the worker."""


class Sink:
    def __init__(self) -> None:
        self.rounds: list[dict[TP, list[int]]] = []
        self.fail: Exception | None = None
        self.fail_flush: Exception | None = None
        self.on_call: Any = None
        self.flushes = 0
        self.discards = 0
        self.stopped: list[str] = []
        self.acks: asyncio.Event | None = None

    async def __call__(self, batches: Mapping[TP, Sequence[Rec]]) -> None:
        self.rounds.append({tp: [r.offset for r in rs] for tp, rs in batches.items()})
        if self.on_call is not None:
            self.on_call()
        if self.fail is not None:
            raise self.fail

    async def outputs_acknowledged(self) -> None:
        pass

    async def write_states(self) -> Any:
        if self.fail_flush is not None:
            raise self.fail_flush
        self.flushes += 1
        return self.acknowledged

    async def acknowledged(self) -> None:
        """Kafka's acknowledgement of the states written: at once, or when `acks` is set."""
        if self.acks is not None:
            await self.acks.wait()

    def discard(self) -> None:
        self.discards += 1

    async def stop(self, what: str, exc: Exception) -> None:
        self.stopped.append(what)
        raise Stopped(what) from exc  # the real one never returns: the worker stops


def run_round(ingest: BatchIngest, consumer: StandInConsumer, round_: dict[TP, list[Rec]]) -> None:
    async def round_and_commit() -> None:
        try:
            await ingest.round(consumer, round_)  # type: ignore[arg-type]
        finally:
            await ingest.before_writes()  # the commit it started, if any

    asyncio.run(round_and_commit())


def quiet_fetch(ingest: BatchIngest, consumer: StandInConsumer) -> None:
    """A fetch that brought no record: a flush if one is due, and its settling."""

    async def flush_and_settle() -> None:
        await ingest.maybe_flush(consumer)  # type: ignore[arg-type]
        await ingest.before_writes()

    asyncio.run(flush_and_settle())


def setup(committed: int | None = 0, earliest: int = 0, flush_interval_s: float = 0.0):
    """A BatchIngest that flushes after every round unless ``flush_interval_s`` says otherwise."""
    sink = Sink()
    ingest = BatchIngest({"in"}, sink, flush_interval_s=flush_interval_s)
    return ingest, StandInConsumer(committed, earliest), sink


def test_consecutive_batches_are_applied_and_acknowledged_as_ranges() -> None:
    ingest, consumer, sink = setup(committed=10)
    run_round(ingest, consumer, {IN: recs(10, 19), OTHER: recs(10, 12)})
    run_round(ingest, consumer, {IN: recs(20, 24)})
    assert sink.rounds == [
        {IN: list(range(10, 20)), OTHER: [10, 11, 12]},
        {IN: list(range(20, 25))},
    ]
    assert consumer.acked == [(IN, 10, 19), (OTHER, 10, 12), (IN, 20, 24)]
    assert consumer.seeks == []


def test_a_commit_comes_between_rounds_once_per_commit_interval() -> None:
    ingest, consumer, sink = setup(committed=0)
    run_round(ingest, consumer, {IN: recs(0, 9)})
    assert consumer.commits == 0  # the interval (3,600 s here) has not passed
    consumer.app.conf.broker_commit_interval = 0.0
    at_apply: list[int] = []
    sink.on_call = lambda: at_apply.append(consumer.commits)
    run_round(ingest, consumer, {IN: recs(10, 14)})
    assert at_apply == [0]  # after the round was applied, not before
    assert consumer.commits == 1 and consumer.acked[-1] == (IN, 10, 14)
    sink.fail = RuntimeError("state write failed")
    with pytest.raises(RuntimeError):
        run_round(ingest, consumer, {IN: recs(15, 19)})
    assert consumer.commits == 1  # a round not applied is neither acknowledged nor committed


def test_records_below_the_next_offset_are_already_applied_and_dropped() -> None:
    ingest, consumer, sink = setup(committed=0)
    run_round(ingest, consumer, {IN: recs(0, 9)})
    run_round(ingest, consumer, {IN: recs(5, 14)})  # a seek back to an older commit
    assert sink.rounds[1] == {IN: list(range(10, 15))}
    assert consumer.acked[-1] == (IN, 10, 14)
    run_round(ingest, consumer, {IN: recs(0, 14)})  # nothing new: no round at all
    assert len(sink.rounds) == 2


def test_a_batch_that_skips_offsets_is_refused_and_the_partition_sought_back() -> None:
    ingest, consumer, sink = setup(committed=0)
    run_round(ingest, consumer, {IN: recs(0, 9)})
    # faust fetched 10..14 and never delivered them: the next batch begins at 15.
    run_round(ingest, consumer, {IN: recs(15, 19), OTHER: recs(0, 1)})
    assert consumer.seeks == [{IN: 10}]
    assert sink.rounds[1] == {OTHER: [0, 1]}  # the other partition goes on
    assert (IN, 15, 19) not in consumer.acked
    run_round(ingest, consumer, {IN: recs(10, 19)})  # read again from 10
    assert sink.rounds[2] == {IN: list(range(10, 20))}
    assert consumer.acked[-1] == (IN, 10, 19)


def test_a_gap_seen_again_after_the_seek_holds_no_records_and_is_passed_over() -> None:
    ingest, consumer, sink = setup(committed=0)
    run_round(ingest, consumer, {IN: recs(0, 9)})
    run_round(ingest, consumer, {IN: recs(12, 15)})  # refused, sought back to 10
    run_round(ingest, consumer, {IN: recs(12, 15)})  # from 10 the log begins at 12
    assert consumer.seeks == [{IN: 10}]
    assert sink.rounds[-1] == {IN: [12, 13, 14, 15]}
    assert consumer.acked[-1] == (IN, 10, 15)  # the empty offsets are acknowledged too


def test_stale_records_after_a_seek_are_not_taken_for_a_real_gap() -> None:
    ingest, consumer, sink = setup(committed=0)
    run_round(ingest, consumer, {IN: recs(0, 9)})
    run_round(ingest, consumer, {IN: recs(12, 15)})  # refused, sought back to 10
    run_round(ingest, consumer, {IN: recs(16, 18)})  # another gap: refused again
    assert consumer.seeks == [{IN: 10}, {IN: 10}]
    assert len(sink.rounds) == 1


def test_without_a_commit_a_partition_starts_at_its_first_offset() -> None:
    # A new app id: faust's seek to the committed offset does not move a partition that
    # has none, so records fetched while it was paused would be skipped.
    ingest, consumer, sink = setup(committed=None, earliest=3)
    run_round(ingest, consumer, {IN: recs(7, 9)})
    assert consumer.seeks == [{IN: 3}]
    assert sink.rounds == []
    run_round(ingest, consumer, {IN: recs(3, 9)})
    assert consumer.acked == [(IN, 3, 9)]


def test_a_round_the_sink_did_not_apply_is_not_acknowledged() -> None:
    ingest, consumer, sink = setup(committed=0)
    sink.fail = RuntimeError("state write failed")
    with pytest.raises(RuntimeError):
        run_round(ingest, consumer, {IN: recs(0, 4)})
    assert consumer.acked == []
    assert ingest.idle.is_set()
    sink.fail = None
    run_round(ingest, consumer, {IN: recs(0, 4)})  # read again: still due from 0
    assert consumer.acked == [(IN, 0, 4)]


def test_a_round_applied_across_a_rebalance_is_not_acknowledged() -> None:
    ingest, consumer, sink = setup(committed=0)

    def rebalance() -> None:
        consumer.app.consumer_generation_id += 1

    sink.on_call = rebalance
    run_round(ingest, consumer, {IN: recs(0, 4)})
    assert len(sink.rounds) == 1
    assert consumer.acked == []
    assert sink.discards == 1 and sink.flushes == 0  # its states may not be this worker's


def test_rounds_are_acknowledged_only_once_a_flush_wrote_their_states() -> None:
    ingest, consumer, sink = setup(committed=0, flush_interval_s=3600.0)
    run_round(ingest, consumer, {IN: recs(0, 4)})
    run_round(ingest, consumer, {IN: recs(5, 9), OTHER: recs(0, 2)})
    assert len(sink.rounds) == 2  # folded, the next offsets moved on...
    assert consumer.acked == [] and sink.flushes == 0  # ...but nothing acknowledged
    asyncio.run(ingest.maybe_flush(consumer))  # a quiet fetch: not due yet
    assert sink.flushes == 0
    ingest.flush_interval_s = 0.0
    quiet_fetch(ingest, consumer)
    assert sink.flushes == 1
    assert consumer.acked == [(IN, 0, 4), (IN, 5, 9), (OTHER, 0, 2)]
    asyncio.run(ingest.maybe_flush(consumer))  # nothing left to flush
    assert sink.flushes == 1


def test_a_flush_that_fails_acknowledges_nothing() -> None:
    ingest, consumer, sink = setup(committed=0, flush_interval_s=3600.0)
    run_round(ingest, consumer, {IN: recs(0, 4)})
    sink.fail_flush = RuntimeError("state write failed")
    with pytest.raises(RuntimeError):
        asyncio.run(ingest.flush(consumer))  # type: ignore[arg-type]
    assert consumer.acked == [] and consumer.commits == 0


def test_a_commit_starts_after_a_flush_not_after_a_round() -> None:
    ingest, consumer, _sink = setup(committed=0, flush_interval_s=3600.0)
    consumer.app.conf.broker_commit_interval = 0.0
    run_round(ingest, consumer, {IN: recs(0, 4)})
    assert consumer.commits == 0
    asyncio.run(ingest.flush(consumer))  # type: ignore[arg-type]
    asyncio.run(ingest.before_writes())
    assert consumer.commits == 1 and consumer.acked == [(IN, 0, 4)]


def test_forgetting_with_rounds_not_flushed_drops_their_states() -> None:
    # A revocation that could not wait for the rounds in flight: their states are dropped
    # and they are read again from the commit (nothing of them was acknowledged).
    ingest, consumer, sink = setup(committed=0, flush_interval_s=3600.0)
    run_round(ingest, consumer, {IN: recs(0, 4)})
    ingest.forget()
    assert sink.discards == 1 and consumer.acked == []
    ingest.flush_interval_s = 0.0
    run_round(ingest, consumer, {IN: recs(0, 4)})  # due from the commit again
    assert sink.rounds[-1] == {IN: [0, 1, 2, 3, 4]}
    assert consumer.acked == [(IN, 0, 4)]


def test_records_of_an_inactive_partition_are_not_applied() -> None:
    ingest, consumer, sink = setup(committed=0)
    consumer.active = {OTHER}
    run_round(ingest, consumer, {IN: recs(0, 4)})
    assert sink.rounds == []
    consumer.active = {IN, OTHER}
    run_round(ingest, consumer, {IN: recs(5, 9)})  # the dropped 0..4 are not skipped
    assert consumer.seeks == [{IN: 0}]
    assert consumer.acked == []


def test_forgetting_a_partition_restarts_it_from_the_commit() -> None:
    ingest, consumer, sink = setup(committed=0)
    run_round(ingest, consumer, {IN: recs(0, 9)})
    ingest.forget()
    consumer.committed = 6
    run_round(ingest, consumer, {IN: recs(6, 12)})
    assert sink.rounds[-1] == {IN: list(range(6, 13))}
    assert consumer.acked[-1] == (IN, 6, 12)


def test_a_failed_offset_commit_stops_the_worker_before_the_next_states_are_written() -> None:
    ingest, consumer, sink = setup(committed=0, flush_interval_s=3600.0)
    consumer.app.conf.broker_commit_interval = 0.0

    async def failing_commit() -> None:
        raise RuntimeError("offset commit failed")

    consumer.commit = failing_commit  # type: ignore[method-assign]

    async def two_checkpoints() -> None:
        await ingest.round(consumer, {IN: recs(0, 4)})  # type: ignore[arg-type]
        await ingest.flush(consumer)  # type: ignore[arg-type]  # starts the commit (step 5)
        await ingest.round(consumer, {IN: recs(5, 9)})  # type: ignore[arg-type]
        await ingest.flush(consumer)  # type: ignore[arg-type]  # step 2 meets its failure

    with pytest.raises(Stopped):
        asyncio.run(two_checkpoints())
    assert sink.stopped == ["the offset commit before the last rounds' states"]
    assert sink.flushes == 1  # the second checkpoint wrote no state...
    assert consumer.acked == [(IN, 0, 4)]  # ...and acknowledged nothing


def test_the_next_round_folds_while_the_states_wait_for_kafka_and_nothing_is_acknowledged() -> None:
    # Step 4 of a checkpoint runs beside the next rounds: round 2 is folded while round 1's
    # states still wait for Kafka's acknowledgement, and no range of either is acknowledged
    # before the acknowledgements of round 1's states arrive.
    ingest, consumer, sink = setup(committed=0)
    sink.acks = asyncio.Event()
    consumer.app.conf.broker_commit_interval = 0.0

    async def overlapped() -> None:
        folded = asyncio.Event()
        sink.on_call = folded.set
        await ingest.round(consumer, {IN: recs(0, 4)})  # type: ignore[arg-type]
        assert sink.flushes == 1 and consumer.acked == []  # written, not acknowledged
        folded.clear()
        second = asyncio.ensure_future(ingest.round(consumer, {IN: recs(5, 9)}))  # type: ignore[arg-type]
        await folded.wait()
        assert len(sink.rounds) == 2  # round 2 folded beside round 1's wait...
        assert consumer.acked == [] and consumer.commits == 0  # ...nothing acknowledged
        assert sink.acks is not None
        sink.acks.set()  # Kafka answers
        await second
        await ingest.before_writes()
        assert consumer.acked == [(IN, 0, 4), (IN, 5, 9)]

    asyncio.run(overlapped())
    assert sink.flushes == 2


def test_a_checkpoint_whose_states_kafka_refuses_acknowledges_nothing_after_it() -> None:
    ingest, consumer, sink = setup(committed=0)

    async def refused() -> None:
        raise RuntimeError("changelog record refused")

    async def write_states() -> Any:
        sink.flushes += 1
        return refused

    sink.write_states = write_states  # type: ignore[method-assign]

    async def two_rounds() -> None:
        await ingest.round(consumer, {IN: recs(0, 4)})  # type: ignore[arg-type]
        await ingest.round(consumer, {IN: recs(5, 9)})  # type: ignore[arg-type]

    with pytest.raises(Stopped):
        asyncio.run(two_rounds())
    assert sink.stopped == ["the states of the checkpoint before the last rounds"]
    assert sink.flushes == 1  # the second round's states were not written...
    assert consumer.acked == []  # ...and neither round was acknowledged


class Stamped(NamedTuple):
    offset: int
    timestamp_ms: int
    value: bytes = b"{}"  # the bulk share counts the heartbeats' value bytes


def test_a_round_notes_how_long_its_urgent_records_waited_apart_from_the_bulk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``urgent_age_ms``: the oldest record outside the bulk topics, however old the bulk's."""
    monkeypatch.setenv(RoundStats.ENV, "3600")  # stats on, no line within the test
    steps, beats = TP("steps", 0), TP("beats", 0)
    sink = Sink()
    ingest = BatchIngest({"steps", "beats"}, sink, flush_interval_s=3600.0, bulk={"beats"})
    consumer = StandInConsumer()
    consumer.active = {steps, beats}
    now_ms = time.time() * 1000
    run_round(ingest, consumer, {beats: [Stamped(0, int(now_ms - 5_000))]})
    assert "urgent_age_ms" not in ingest.stats.samples  # a round of the bulk alone
    stamps = [int(now_ms - 300), int(now_ms - 100)]
    run_round(ingest, consumer, {steps: [Stamped(0, stamps[0]), Stamped(1, stamps[1])],
                                 beats: [Stamped(1, int(now_ms - 4_000))]})  # fmt: skip
    (urgent,) = ingest.stats.samples["urgent_age_ms"]
    assert 300 <= urgent < 4_000  # the steps' oldest, not the heartbeats'
    assert max(ingest.stats.samples["age_ms"]) >= 4_000
