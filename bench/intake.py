"""A record's way in, per record, in one process: the old path against the new, alternated.

Two steps of the worker's intake, each timed both ways on the same input (CPU time of
this thread, the collector off as the worker runs its rounds, the best of ``--repeat``
passes, the two ways alternated ``--rounds`` times; the worst of the rounds is printed):

1. **fetch**: record batches as the broker sends them (built with aiokafka's own batch
   builder: ``--batches`` batches of ``--per-batch`` loose heartbeats) read the way
   aiokafka's ``FetchResult.getall`` reads them (a `ConsumerRecord` per record through
   ``PartitionRecords``' generator), then made `RawRecord`s as the round used to, against
   the raw path (`processors.compat._drain_raw`: `RawRecord`s straight from the batches);
2. **check**: the records checked one by one (`schemas.records.check`, what `split` did
   per record) against `split`'s chunks (`schemas.codec.decode_many` and
   `records._admit_plain`);
3. **ticks** and **packs**: the same heartbeats with a Tick, or a pack of 512
   heartbeats, at one place in 230 (seeded), `split` as it was (a chunk holding one went
   one record at a time) against `split` now (such a chunk goes on in pieces around them,
   `records._around`).

Usage: python bench/intake.py [--batches 40] [--per-batch 500] [--repeat 5] [--rounds 3]
"""

from __future__ import annotations

import sys

# Run as a script, this file's directory comes first on sys.path and its name would
# shadow the `processors` package it measures.
if sys.path and sys.path[0] == __import__("os").path.dirname(__file__):
    sys.path.pop(0)

import argparse
import asyncio
import gc
import json
import random
import struct
import time
from collections.abc import Callable
from typing import Any

from aiokafka.consumer.fetcher import READ_UNCOMMITTED, FetchResult, PartitionRecords
from aiokafka.consumer.subscription_state import SubscriptionState
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from runwatch.processors import compat
from runwatch.schemas import records as records_module
from runwatch.schemas.codec import decode_many, encode, encode_key, encode_pack
from runwatch.schemas.events import Heartbeat, Tick
from runwatch.schemas.records import SPLIT_CHUNK, DeadLetter, RawRecord, check, split
from runwatch.schemas.topics import TopicRole

TP = TopicPartition("bench.heartbeats", 0)
RUN = "bench-0001"
T0_NS = 1_767_000_000_000_000_000


def heartbeat_values(count: int) -> list[bytes]:
    """Loose heartbeats of one world-8 run, as `bench/processors.py`'s backlog has them."""
    return [
        encode(
            Heartbeat(
                run_id=RUN, ts_ns=T0_NS + i, seq=i // 8, rank=i % 8, step=i // 8, step_time_s=0.05
            )
        )
        for i in range(count)
    ]


def fetched_bytes(values: list[bytes], per_batch: int) -> bytes:
    """The values as v2 record batches from offset 0, as one fetch response holds them."""
    out = bytearray()
    for base in range(0, len(values), per_batch):
        builder = DefaultRecordBatchBuilder(
            magic=2,
            compression_type=0,
            is_transactional=0,
            producer_id=-1,
            producer_epoch=-1,
            base_sequence=-1,
            batch_size=1 << 24,
        )
        for i, value in enumerate(values[base : base + per_batch]):
            builder.append(
                i, timestamp=T0_NS // 1_000_000, key=encode_key(RUN), value=value, headers=[]
            )
        batch = bytearray(builder.build())
        batch[0:8] = struct.pack(">q", base)
        out += batch
    return bytes(out)


def fetch_result(data: bytes) -> FetchResult:
    subscription = SubscriptionState()
    subscription.assign_from_user({TP})
    assignment = subscription.subscription.assignment
    assignment.state_value(TP).seek(0)
    records = PartitionRecords(TP, MemoryRecords(data), None, 0, None, None, True, READ_UNCOMMITTED)
    return FetchResult(TP, assignment=assignment, partition_records=records, backoff=0)


def via_consumer_records(data: bytes) -> list[RawRecord]:
    """aiokafka's records, then a `RawRecord` each (the round's copy before the raw path)."""
    result = fetch_result(data)
    new = tuple.__new__
    topic, partition = TP.topic, TP.partition
    return [
        new(RawRecord, (topic, partition, r.offset, r.key, r.value, r.timestamp or 0))
        for r in result.getall(None)
    ]


def via_raw(data: bytes) -> list[RawRecord]:
    return compat._drain_raw(fetch_result(data), TP, None)


def one_by_one(records: list[RawRecord]) -> tuple[int, int]:
    good = dead = 0
    for record in records:
        if type(check(record, TopicRole.HEARTBEATS)) is DeadLetter:
            dead += 1
        else:
            good += 1
    return good, dead


def chunked(records: list[RawRecord]) -> tuple[int, int]:
    good, dead = split(records, TopicRole.HEARTBEATS)
    return len(good), len(dead)


def with_odd_ones(records: list[RawRecord], kind: str) -> list[RawRecord]:
    """``records`` with a Tick or a pack of 512 heartbeats at one place in 230 (seeded)."""
    if kind == "ticks":
        key, value = b"*", encode(Tick(run_id="*", ts_ns=T0_NS, partition=0))
    else:
        beats = [encode(Heartbeat(run_id=RUN, ts_ns=T0_NS, rank=r, step=0)) for r in range(512)]
        key, value = encode_key(RUN), encode_pack(RUN, T0_NS, beats)
    rng = random.Random(230)
    out = list(records)
    for _ in range(len(records) // 230):
        out.insert(rng.randrange(len(out)), records[0]._replace(key=key, value=value))
    return [r._replace(offset=i) for i, r in enumerate(out)]


def whole_chunks(records: list[RawRecord]) -> tuple[int, int]:
    """`split` as it was: a chunk not admitted whole went one record at a time."""
    good: list[Any] = []
    dead: list[Any] = []
    role = TopicRole.HEARTBEATS
    for start in range(0, len(records), SPLIT_CHUNK):
        chunk = records[start : start + SPLIT_CHUNK]
        events = decode_many([r.value or b"" for r in chunk])
        if events is None or not records_module._admit_plain(chunk, events, role, good):
            records_module._one_by_one(chunk, events, role, good, dead)
    return len(good), len(dead)


def cpu_us_per_record(fn: Callable[[Any], Any], arg: Any, count: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.thread_time()
        fn(arg)
        best = min(best, time.thread_time() - start)
    return best / count * 1e6


async def main(args: argparse.Namespace) -> dict[str, Any]:
    values = heartbeat_values(args.batches * args.per_batch)
    data = fetched_bytes(values, args.per_batch)
    records = via_raw(data)
    assert records == via_consumer_records(data), "the two fetch paths must give the same records"
    assert one_by_one(records) == chunked(records) == (len(records), 0)
    n = len(records)
    ticks, packs = with_odd_ones(records, "ticks"), with_odd_ones(records, "packs")
    for mixed in (ticks, packs):
        assert whole_chunks(mixed) == chunked(mixed) == (len(mixed), 0)
    pairs = {
        "fetch": ((via_consumer_records, data), (via_raw, data)),
        "check": ((one_by_one, records), (chunked, records)),
        "ticks": ((whole_chunks, ticks), (chunked, ticks)),
        "packs": ((whole_chunks, packs), (chunked, packs)),
    }
    figures: dict[str, dict[str, list[float]]] = {k: {"old": [], "new": []} for k in pairs}
    gc.disable()
    try:
        for _ in range(args.rounds):
            for step, ((old_fn, old_arg), (new_fn, new_arg)) in pairs.items():
                count = len(old_arg) if isinstance(old_arg, list) else n
                figures[step]["old"].append(cpu_us_per_record(old_fn, old_arg, count, args.repeat))
                figures[step]["new"].append(cpu_us_per_record(new_fn, new_arg, count, args.repeat))
    finally:
        gc.enable()
    print(
        f"intake of {n:,} loose heartbeats ({args.batches} batches of {args.per_batch}), "
        f"µs CPU per record, best of {args.repeat} per round, {args.rounds} rounds alternated:"
    )
    out: dict[str, Any] = {"bench": "intake", "records": n}
    labels = {
        "fetch": ("aiokafka ConsumerRecords + RawRecord copy", "raw path (compat._drain_raw)"),
        "check": ("check, one record at a time", "split's chunks (decode_many, _admit_plain)"),
        "ticks": ("a chunk with a Tick: one at a time", "in pieces around it (_around)"),
        "packs": ("a chunk with a pack: one at a time", "in pieces around it (_around)"),
    }
    for step, ways in figures.items():
        old, new = ways["old"], ways["new"]
        print(f"  {step:5s}  {labels[step][0]:44s} {min(old):.3f}-{max(old):.3f}")
        print(
            f"  {'':5s}  {labels[step][1]:44s} {min(new):.3f}-{max(new):.3f}  "
            f"(worst {max(old) / max(new):.2f}x fewer)"
        )
        out[f"{step}_old_us"] = old
        out[f"{step}_new_us"] = new
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--per-batch", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    result = asyncio.run(main(parser.parse_args()))
    print(json.dumps(result))
