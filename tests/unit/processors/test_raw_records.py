"""The raw record path (`compat._unpack_raw`, `compat._drain_raw`) against aiokafka's own.

Record batches are built with aiokafka's own batch builder and read back both ways: by
aiokafka 0.14.0's `PartitionRecords` and `FetchResult.getall` (the code the raw path
ports), and by the raw path. Every case must give the same records, in the same order,
and leave the same position behind: plain batches, a fetch offset inside a batch,
control batches, an aborted transaction under both isolation levels, a corrupt batch,
and drains cut at every ``max_records``.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka.consumer.fetcher import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    FetchResult,
    PartitionRecords,
)
from aiokafka.consumer.subscription_state import SubscriptionState
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition

from runwatch.processors import compat
from runwatch.schemas.records import RawRecord

TP = TopicPartition("runwatch.heartbeats", 3)
TS_MS = 1_767_000_000_000
_CRC_AT = 17  # v2 batch: the CRC (4 bytes) sits after offset, length, leader epoch, magic
_ATTRIBUTES_AT = 21  # and covers everything from the attributes (2 bytes) on
_CONTROL_BIT = 0x20
_ABORT_KEY = struct.pack(">hh", 0, 0)  # a control record: version 0, type 0 (abort)


def batch(
    base_offset: int,
    count: int,
    *,
    producer_id: int = -1,
    transactional: bool = False,
    control: bool = False,
    pad: int = 0,
    blank: bool = False,
) -> bytes:
    """One v2 record batch of ``count`` records from ``base_offset``, as the broker sends it.

    Each value is ``{"offset": N}``, followed by ``pad`` spaces (a pack's size, say), or
    empty (``blank``).
    """
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=int(transactional),
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1,
        batch_size=1 << 20,
    )
    for i in range(count):
        if control:
            builder.append(i, timestamp=TS_MS + i, key=_ABORT_KEY, value=b"", headers=[])
        else:
            key = b"run-%d" % (base_offset + i)
            value = b"" if blank else b'{"offset": %d}' % (base_offset + i) + b" " * pad
            builder.append(i, timestamp=TS_MS + i, key=key, value=value, headers=[])
    data = bytearray(builder.build())
    data[0:8] = struct.pack(">q", base_offset)
    if control:
        attributes = struct.unpack_from(">h", data, _ATTRIBUTES_AT)[0] | _CONTROL_BIT
        struct.pack_into(">h", data, _ATTRIBUTES_AT, attributes)
        struct.pack_into(">I", data, _CRC_AT, calc_crc32c(bytes(data[_ATTRIBUTES_AT:])))
    return bytes(data)


def partition_records(
    data: bytes,
    fetch_offset: int = 0,
    *,
    aborted: list[tuple[int, int]] | None = None,
    isolation: int = READ_UNCOMMITTED,
) -> PartitionRecords:
    return PartitionRecords(
        TP, MemoryRecords(data), aborted, fetch_offset, None, None, True, isolation
    )


def as_tuples(records: list[Any]) -> list[tuple[Any, ...]]:
    """aiokafka's records and raw ones in one shape: (topic, partition, offset, key, value, ts)."""
    out = []
    for r in records:
        if type(r) is RawRecord:
            out.append(tuple(r))
        else:
            out.append((r.topic, r.partition, r.offset, r.key, r.value, r.timestamp or 0))
    return out


def unpacked_both_ways(data: bytes, fetch_offset: int = 0, **kwargs: Any) -> tuple[Any, Any]:
    ours = partition_records(data, fetch_offset, **kwargs)
    theirs = partition_records(data, fetch_offset, **kwargs)
    raw = list(compat._unpack_raw(ours, TP.topic, TP.partition))
    return (as_tuples(raw), ours.next_fetch_offset), (
        as_tuples(list(theirs)),
        theirs.next_fetch_offset,
    )


PLAIN = batch(0, 5) + batch(5, 3) + batch(8, 7)
TRANSACTIONS = (
    batch(0, 3, producer_id=7, transactional=True)
    + batch(3, 1, producer_id=7, transactional=True, control=True)
    + batch(4, 3)
    + batch(7, 2, producer_id=9, transactional=True)
)


@pytest.mark.parametrize(
    ("data", "fetch_offset", "kwargs"),
    [
        pytest.param(PLAIN, 0, {}, id="plain-batches"),
        pytest.param(PLAIN, 6, {}, id="fetch-offset-inside-a-batch"),
        pytest.param(PLAIN, 15, {}, id="fetch-offset-past-the-end"),
        pytest.param(batch(0, 2) + batch(2, 1, control=True) + batch(3, 2), 0, {}, id="control"),
        pytest.param(TRANSACTIONS, 0, {}, id="aborted-read-uncommitted"),
        pytest.param(
            TRANSACTIONS,
            0,
            {"aborted": [(7, 0)], "isolation": READ_COMMITTED},
            id="aborted-read-committed",
        ),
        pytest.param(TRANSACTIONS, 0, {"isolation": READ_COMMITTED}, id="committed-read-committed"),
    ],
)
def test_unpack_gives_aiokafkas_records_and_position(
    data: bytes, fetch_offset: int, kwargs: dict[str, Any]
) -> None:
    (raw, raw_next), (theirs, their_next) = unpacked_both_ways(data, fetch_offset, **kwargs)
    assert raw == theirs
    assert raw_next == their_next


def test_read_committed_skips_the_aborted_transaction() -> None:
    (raw, _), _ = unpacked_both_ways(TRANSACTIONS, aborted=[(7, 0)], isolation=READ_COMMITTED)
    assert [r[2] for r in raw] == [4, 5, 6, 7, 8]  # producer 7's 0..2 aborted, 3 a marker


def test_every_record_is_a_raw_record_with_the_broker_timestamp() -> None:
    records = partition_records(batch(40, 3))
    raw = list(compat._unpack_raw(records, TP.topic, TP.partition))
    assert all(type(r) is RawRecord for r in raw)
    assert raw[0] == RawRecord(TP.topic, TP.partition, 40, b"run-40", b'{"offset": 40}', TS_MS)


def test_a_corrupt_batch_raises_as_aiokafka_does() -> None:
    data = bytearray(PLAIN)
    data[-1] ^= 0xFF  # the last batch's last byte: its CRC no longer holds
    ours = compat._unpack_raw(partition_records(bytes(data)), TP.topic, TP.partition)
    with pytest.raises(CorruptRecordException):
        list(ours)
    with pytest.raises(CorruptRecordException):
        list(partition_records(bytes(data)))


def drains(data: bytes, max_records: int | None, raw: bool) -> Iterator[tuple[Any, int]]:
    """Each call's records and the position after it, until the fetch result is spent."""

    async def run() -> list[tuple[Any, int]]:
        subscription = SubscriptionState()
        subscription.assign_from_user({TP})
        assignment = subscription.subscription.assignment
        state = assignment.state_value(TP)
        state.seek(0)
        result = FetchResult(
            TP, assignment=assignment, partition_records=partition_records(data), backoff=0
        )
        calls = []
        while result.has_more():
            drain = (
                (lambda r, tp, n: compat._drain_raw(r, tp, n)[0])
                if raw
                else (lambda r, _tp, n: r.getall(n))
            )
            got = drain(result, TP, max_records)
            calls.append((as_tuples(got), state.position))
        return calls

    yield from asyncio.run(run())


@pytest.mark.parametrize("max_records", [None, 1, 4, 5, 8, 15, 16, 100])
def test_drains_cut_at_max_records_as_getall(max_records: int | None) -> None:
    assert list(drains(PLAIN, max_records, raw=True)) == list(drains(PLAIN, max_records, raw=False))


def test_a_started_aiokafka_generator_is_read_by_aiokafka() -> None:
    async def run() -> list[Any]:
        subscription = SubscriptionState()
        subscription.assign_from_user({TP})
        assignment = subscription.subscription.assignment
        assignment.state_value(TP).seek(0)
        result = FetchResult(
            TP, assignment=assignment, partition_records=partition_records(PLAIN), backoff=0
        )
        first = result.getall(2)  # aiokafka's generator started: the raw path must not replace it
        return as_tuples(first) + as_tuples(compat._drain_raw(result, TP, None)[0])

    records = asyncio.run(run())
    assert [r[2] for r in records] == list(range(15))


# ---------------------------------------------------------------------------------------
# A call's limits per topic (`compat._fetched` with ``limits``): the bulk topics come last and
# leave what is over their limit buffered, each record still taken exactly once, in order.

HEARTBEATS = "runwatch.heartbeats"
STEPS = "runwatch.steps"


class _Buffered:
    """What `compat._fetched` reads of aiokafka's `Fetcher`: the fetch results it buffered.

    Built on aiokafka's own `SubscriptionState` and `FetchResult`s; only the fetch task that
    fills ``_records`` from the broker is absent (no call here waits for a fetch).
    """

    def __init__(
        self, counts: dict[TopicPartition, int], pads: dict[TopicPartition, int] | None = None
    ) -> None:
        """``pads``: spaces after each value of a partition; -1: empty values."""
        self._subscriptions = SubscriptionState()
        self._subscriptions.assign_from_user(set(counts))
        assignment = self._subscriptions.subscription.assignment
        self._records: dict[TopicPartition, FetchResult] = {}
        for tp, count in counts.items():
            assignment.state_value(tp).seek(0)
            records = PartitionRecords(
                tp,
                MemoryRecords(
                    batch(
                        0,
                        count,
                        pad=max(0, (pads or {}).get(tp, 0)),
                        blank=(pads or {}).get(tp, 0) < 0,
                    )
                ),
                None,
                0,
                None,
                None,
                True,
                READ_UNCOMMITTED,
            )
            self._records[tp] = FetchResult(
                tp, assignment=assignment, partition_records=records, backoff=0
            )
        self._wait_consume_future = None
        self.emptied = 0

    def _notify(self, _future: Any) -> None:
        self.emptied += 1  # aiokafka's fetch task would now fetch the emptied partitions again


def calls(
    counts: dict[TopicPartition, int],
    limits: dict[str, int] | None,
    max_records: int | None,
    pads: dict[TopicPartition, int] | None = None,
) -> list[dict[TopicPartition, list[int]]]:
    """Each `_fetched` call's offsets per partition, until nothing is buffered."""
    raw = frozenset({HEARTBEATS, STEPS})

    async def run() -> list[dict[TopicPartition, list[int]]]:
        fetcher = _Buffered(counts, pads)  # aiokafka's subscription state needs a running loop
        out: list[dict[TopicPartition, list[int]]] = []
        while fetcher._records:
            got = await compat._fetched(fetcher, None, 0, max_records, raw, limits)
            # A drain cut exactly at a partition's last record leaves its result buffered,
            # and the next call takes nothing of it but drops it (aiokafka's ``getall``
            # does the same): one empty call, never two in a row.
            assert got or (out and out[-1]), "two calls in a row took nothing"
            out.append({tp: [r.offset for r in recs] for tp, recs in got.items()})
        return [call for call in out if call]

    return asyncio.run(run())


HB0, HB1, ST0 = (
    TopicPartition(HEARTBEATS, 0),
    TopicPartition(HEARTBEATS, 1),
    TopicPartition(STEPS, 0),
)
BUFFERED = {HB0: 10, HB1: 7, ST0: 3}  # the heartbeats first in the buffer, as fetched
B = len(b'{"offset": 0}') + compat.RECORD_OVERHEAD_BYTES
"""What a record of offset 0-9 counts against a limit: a limit of k * B is k records."""


@pytest.mark.parametrize(
    ("limits", "max_records"),
    [
        pytest.param(None, None, id="no-limit"),
        pytest.param({HEARTBEATS: 1}, None, id="one-byte:one-heartbeat-a-call"),
        pytest.param({HEARTBEATS: 4 * B}, None, id="four"),
        pytest.param({HEARTBEATS: 4 * B - 1}, None, id="under-four:still-four"),
        pytest.param({HEARTBEATS: 10 * B}, None, id="one-partition's-worth"),
        pytest.param({HEARTBEATS: 4 * B}, 5, id="four-under-max-records-5"),
        pytest.param({HEARTBEATS: 100 * B}, 2, id="max-records-binds-first"),
    ],
)
def test_every_record_is_taken_once_in_order(limits, max_records) -> None:
    taken: dict[TopicPartition, list[int]] = {}
    for call in calls(BUFFERED, limits, max_records):
        for tp, offsets in call.items():
            taken.setdefault(tp, []).extend(offsets)
    assert taken == {tp: list(range(n)) for tp, n in BUFFERED.items()}


@pytest.mark.parametrize("records", [1, 4, 10, 16])
def test_a_call_takes_records_until_their_bytes_reach_the_limit(records: int) -> None:
    for call in calls(BUFFERED, {HEARTBEATS: records * B}, None):
        assert sum(len(v) for tp, v in call.items() if tp.topic == HEARTBEATS) <= records


def test_the_other_topics_are_taken_whole_and_first() -> None:
    # the steps were buffered last, behind 17 heartbeat records; max_records 3 binds
    first, *_ = calls(BUFFERED, {HEARTBEATS: 4 * B}, 3)
    assert first == {ST0: [0, 1, 2]}
    without_limits, *_ = calls(BUFFERED, None, 3)
    assert without_limits == {HB0: [0, 1, 2]}  # aiokafka's order: the steps would wait


def test_the_limit_is_for_the_topic_not_each_partition() -> None:
    first, second, *_ = calls(BUFFERED, {HEARTBEATS: 12 * B}, None)
    assert first == {HB0: list(range(10)), HB1: [0, 1], ST0: [0, 1, 2]}
    assert second == {HB1: [2, 3, 4, 5, 6]}


def test_the_limit_counts_bytes_so_large_records_come_fewer_to_a_call() -> None:
    # HB0 holds four packs of ~1 KB, HB1 ten loose heartbeats: a call of ten loose
    # heartbeats' bytes takes one pack, and all ten loose ones in one call, where a limit
    # in records let ten packs in.
    pads = {HB0: 1000}
    first, second, *rest = calls({HB0: 4, HB1: 10}, {HEARTBEATS: 10 * B}, None, pads)
    assert first == {HB0: [0]}  # 1,077 counted bytes reach 770 with the first record
    assert second == {HB0: [1]}
    assert rest[-1] == {HB1: list(range(10))}  # 770 bytes: all ten in one call


def test_records_without_a_value_still_count_against_the_limit() -> None:
    # Empty values (a flood any producer can write): each counts RECORD_OVERHEAD_BYTES, so
    # a call takes limit / overhead of them, not all.
    overhead = compat.RECORD_OVERHEAD_BYTES
    got = calls({HB0: 10}, {HEARTBEATS: 3 * overhead}, None, {HB0: -1})
    assert got == [{HB0: [0, 1, 2]}, {HB0: [3, 4, 5]}, {HB0: [6, 7, 8]}, {HB0: [9]}]
