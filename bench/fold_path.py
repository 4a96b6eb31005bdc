"""The worker's main-thread work on the issue's backlog, in one process: decode, then fold.

The backlog of `bench/processors.py` (``--runs`` runs x ``--steps`` steps x (1 step + 8
loose heartbeats)) as `RawRecord`s on 4 partitions (each run's by Kafka's partitioner),
cut into rounds as a worker takes them (up to ``--round`` records, an equal share of each
topic-partition), then each round's roles in `FOLD_ORDER`: `schemas.records.split`, and
`processors.pipeline.fold_chunks` in chunks of the worker's `FOLD_CHUNK_EVENTS`, with the
states carried from round to round. No Kafka, no faust, no state writes: what is left of a
drain's CPU per event once fetch, the round and the flush are taken away. CPU time of this
thread, the collector off during a round and its young generation collected after it, as
the worker does (`common.gc_tuning`). Each pass prints; the worst is in the JSON line.

    .venv/bin/python bench/fold_path.py [--runs 200] [--steps 300] [--repeat 3]

Used for docs/processors.md, "Cython on the record path": the same command in a tree whose
hot modules were compiled with ``cythonize -i -3 -X annotation_typing=False``.

``--by-role`` then folds each topic role's records alone (its states carried, the same
rounds without the other roles; no state of one role depends on another's records) and
prints, per role, the split and the fold per record of that role and what the role adds
to the backlog's CPU per event (best of ``--repeat``): where a per-event goal has to be
found (docs/processors.md, "what 3 µs an event asks of a heartbeat").
"""

from __future__ import annotations

import sys

# Run as a script, this file's directory comes first on sys.path and its name would
# shadow the `processors` package it measures.
if sys.path and sys.path[0] == __import__("os").path.dirname(__file__):
    sys.path.pop(0)

import argparse
import gc
import importlib.util
import json
import random
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from runwatch.processors.app import FOLD_CHUNK_EVENTS
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.logread import partition_for
from runwatch.processors.pipeline import fold_chunks
from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import RunStarted
from runwatch.schemas.records import RawRecord, split
from runwatch.schemas.topics import FOLD_ORDER, TopicRole

PARTITIONS = 4


def _sibling(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", Path(__file__).with_name(f"{name}.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def packed_backlog(runs: int, steps: int, world: int) -> tuple[list[tuple[str, bytes, bytes]], int]:
    """`bench/latency.py`'s load as a backlog: per run and step, its step record and one pack
    of ``world`` heartbeats (its `LoadRun`), after each run's RunStarted; and its events."""
    latency = _sibling("latency")
    rng = random.Random(0)
    t0 = time.time_ns()
    out: list[tuple[str, bytes, bytes]] = []
    templates = {f"load-{r:04d}": latency.LoadRun(f"load-{r:04d}", world) for r in range(runs)}
    for run in templates:
        started = encode(RunStarted(run_id=run, ts_ns=t0, world_size=world))
        out += [("steps", encode_key(run), started), ("heartbeats", encode_key(run), started)]
    for step in range(1, steps + 1):
        for run, template in templates.items():
            for role, value in template.records(step, rng):
                out.append((role, encode_key(run), value))
    return out, 2 * runs + steps * runs * (1 + world)


def rounds(
    runs: int, steps: int, round_records: int, world: int = 0
) -> tuple[list[dict[TopicRole, list[RawRecord]]], int]:
    """The backlog's records in rounds (role -> records in partition order), and its events.

    ``world`` 0: `bench/processors.py`'s loose backlog; otherwise `packed_backlog`.
    """
    if world:
        events, count = packed_backlog(runs, steps, world)
    else:
        events = _sibling("processors").backlog(runs, steps)
        count = len(events)
    queues: dict[tuple[TopicRole, int], list[RawRecord]] = {}
    now_ms = int(time.time() * 1000)
    for role, key, value in events:
        partition = partition_for(key.decode(), PARTITIONS)
        queue = queues.setdefault((TopicRole(role), partition), [])
        queue.append(RawRecord(f"bench.{role}", partition, len(queue), key, value, now_ms))
    share = max(1, round_records // len(queues))
    out: list[dict[TopicRole, list[RawRecord]]] = []
    for start in range(0, max(map(len, queues.values())), share):
        taken: dict[TopicRole, list[RawRecord]] = {}
        for role in FOLD_ORDER:
            for partition in range(PARTITIONS):
                part = queues.get((role, partition), [])[start : start + share]
                if part:
                    taken.setdefault(role, []).extend(part)
        out.append(taken)
    return out, count


def one_pass(rounds_: list[dict[TopicRole, list[RawRecord]]]) -> tuple[float, float]:
    """CPU seconds of ``split`` and of the fold over every round, states carried."""
    return fold_rounds(rounds_, {}, DetectorConfig())


def fold_rounds(
    rounds_: Iterable[dict[TopicRole, list[RawRecord]]],
    states: dict[TopicRole, dict[str, Any]],
    cfg: DetectorConfig,
) -> tuple[float, float]:
    """CPU seconds of ``split`` and of the fold over every round, from and into ``states``.

    Each round's roles in the round's own order (`FOLD_ORDER` where the caller built it
    so); the collector off during a round, its young generation collected after it.
    """
    split_s = fold_s = 0.0
    for taken in rounds_:
        for role, records in taken.items():
            store = states.setdefault(role, {})
            gc.disable()
            t0 = time.thread_time()
            good, _ = split(records, role)
            t1 = time.thread_time()
            results = list(fold_chunks(role, good, store.get, lambda _: [], cfg, FOLD_CHUNK_EVENTS))
            t2 = time.thread_time()
            gc.enable()
            if results:
                store.update(results[-1].states)
            split_s, fold_s = split_s + t1 - t0, fold_s + t2 - t1
        gc.collect(0)
    return split_s, fold_s


def roles_alone(
    taken: list[dict[TopicRole, list[RawRecord]]], events: int, repeat: int
) -> dict[str, dict[str, float]]:
    """Per role, its records folded alone in the same rounds: µs per record of the role
    (split, fold) and µs it adds per event of the whole backlog, best of ``repeat``."""
    out: dict[str, dict[str, float]] = {}
    for role in FOLD_ORDER:
        alone = [{role: t[role]} for t in taken if role in t]
        records = sum(len(t[role]) for t in alone)
        if not records:
            continue
        split_s, fold_s = min(
            (fold_rounds(alone, {}, DetectorConfig()) for _ in range(repeat)), key=sum
        )
        split_us, fold_us = 1e6 * split_s / records, 1e6 * fold_s / records
        added_us = 1e6 * (split_s + fold_s) / events
        out[role.value] = {
            "records": records,
            "split_us_per_record": round(split_us, 3),
            "fold_us_per_record": round(fold_us, 3),
            "us_per_backlog_event": round(added_us, 3),
        }
        print(
            f"{role.value} alone, {records:,} records: split {split_us:.3f} us + fold "
            f"{fold_us:.3f} us a record, {added_us:.3f} us per backlog event"
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--round", type=int, default=20_000, help="records per round")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--world", type=int, default=0,
                        help="0: the loose backlog; N: bench/latency.py's load of packs of N "
                        "heartbeats as a backlog (a pack counts its events)")  # fmt: skip
    parser.add_argument("--by-role", action="store_true", help="then each role folded alone")
    args = parser.parse_args()
    taken, events = rounds(args.runs, args.steps, args.round, args.world)
    passes = []
    for _ in range(args.repeat):
        split_s, fold_s = one_pass(taken)
        us = (1e6 * split_s / events, 1e6 * fold_s / events)
        passes.append(us)
        print(f"{events:,} events in {len(taken)} rounds: split {us[0]:.3f} us, fold "
              f"{us[1]:.3f} us, together {sum(us):.3f} us CPU per event", flush=True)  # fmt: skip
    worst = max(passes, key=sum)
    by_role = roles_alone(taken, events, args.repeat) if args.by_role else {}
    print(json.dumps({"bench": "fold_path", "world": args.world, "round_records": args.round,
                      "events": events, "rounds": len(taken),
                      "split_us_per_event": round(worst[0], 3),
                      "fold_us_per_event": round(worst[1], 3),
                      "us_per_event": round(sum(worst), 3), "by_role": by_role}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
