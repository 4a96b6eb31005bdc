"""One fleet worker's share of `bench/fleet.py`'s load, folded in one process as its runs age.

`bench/fleet.py --sweep` found the workers dearer at one rate once the fleet's runs passed
the ledger's horizon; on a box shared with the broker and the load generator a 5 % change
hides in the windows' noise. This folds the same records without Kafka, faust or the
box's other tenants: the fleet of `bench/fleet.py` (``--runs`` runs, those over 64 ranks
packed), the partitions its topics have (steps 16, heartbeats 64), the records of the even
partitions (a worker's half of them; the two large runs' fall on odd ones, so at 1,000
runs these are ~500 small runs, ~9,700 events a step), cut into paced rounds of
``--round`` events, each round's roles in `FOLD_ORDER` through `schemas.records.split`
and `processors.pipeline.fold_chunks` (`bench/fold_path.py`'s `fold_rounds`), the states
carried from round to round. It goes on in slices of ``--slice`` steps and prints, per
slice, the CPU per event of the decode and of the fold (this thread's CPU; the collector
off during a round, its young generation collected after it, as the worker does). No
state is written: what a round's fold costs per event as the states it walks grow.

    .venv/bin/python bench/fleet_age.py [--runs 1000] [--slices 18] [--slice 30] [--round 3600]

The default round is ~40 ms of 90,000 events/s (one of two workers at 180,000 events/s;
the fetch linger's round); the default 18 slices of 30 steps take the runs past the
default ledger horizon (512 steps).
"""

from __future__ import annotations

import sys

# Run as a script, this file's directory comes first on sys.path and its name would
# shadow the `processors` package it measures.
if sys.path and sys.path[0] == __import__("os").path.dirname(__file__):
    sys.path.pop(0)

import argparse
import importlib.util
import json
import random
import time
from pathlib import Path
from typing import Any

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.logread import partition_for
from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import RunStarted
from runwatch.schemas.records import RawRecord
from runwatch.schemas.topics import FOLD_ORDER, TopicRole

PARTITIONS = {TopicRole.STEPS: 16, TopicRole.HEARTBEATS: 64}
"""The fleet's input topics' partitions (`schemas.topics`' catalogue)."""


def _sibling(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", Path(__file__).with_name(f"{name}.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class _Topics:
    steps = TopicRole.STEPS.value
    heartbeats = TopicRole.HEARTBEATS.value


class Worker:
    """One worker's half of the fleet's partitions, its offsets and its runs' states."""

    def __init__(self, runs: int) -> None:
        self.fleet = _sibling("fleet")
        self.fold_path = _sibling("fold_path")
        self.runs = self.fleet.fleet(runs, 64)  # `bench/fleet.py`'s --pack-above default
        self.rng = random.Random(0)
        self.offsets: dict[tuple[TopicRole, int], int] = {}
        self.states: dict[TopicRole, dict[str, Any]] = {}
        self.cfg = DetectorConfig()

    def records(self, first: int, last: int) -> tuple[list[tuple[TopicRole, RawRecord, int]], int]:
        """Steps ``first..last`` of every run (their RunStarted first at step 1), this worker's."""
        raw: list[tuple[str, bytes, bytes, int]] = []
        if first == 1:
            for run in self.runs:
                started = encode(RunStarted(run_id=run.run_id, ts_ns=time.time_ns(),
                                            world_size=run.world))  # fmt: skip
                raw += [(role.value, encode_key(run.run_id), started, 1) for role in PARTITIONS]
        for step in range(first, last + 1):
            for run in self.runs:
                # 512 heartbeats a packed record: `bench/fleet.py`'s --pack default
                raw += self.fleet.step_records(run, step, _Topics, 512, self.rng, False)
        now_ms = int(time.time() * 1000)
        out: list[tuple[TopicRole, RawRecord, int]] = []
        events = 0
        for topic, key, value, n in raw:
            role = TopicRole(topic)
            partition = partition_for(key.decode(), PARTITIONS[role])
            if partition % 2:
                continue  # the other worker's
            offset = self.offsets.get((role, partition), 0)
            self.offsets[(role, partition)] = offset + 1
            out.append((role, RawRecord(f"f.{topic}", partition, offset, key, value, now_ms), n))
            events += n
        return out, events

    def fold(
        self, records: list[tuple[TopicRole, RawRecord, int]], round_events: int
    ) -> tuple[float, float]:
        """Fold ``records`` in rounds of ``round_events``; CPU seconds of decode and fold."""
        return self.fold_path.fold_rounds(_rounds(records, round_events), self.states, self.cfg)


def _rounds(
    records: list[tuple[TopicRole, RawRecord, int]], round_events: int
) -> list[dict[TopicRole, list[RawRecord]]]:
    """Records in arrival order cut into rounds of about ``round_events`` events, each
    role's records in partition order (as a fetch hands them over), the roles in
    `FOLD_ORDER`."""
    rounds: list[dict[TopicRole, list[RawRecord]]] = []
    current: dict[TopicRole, list[RawRecord]] = {}
    events = 0
    for role, record, n in records:
        current.setdefault(role, []).append(record)
        events += n
        if events >= round_events:
            rounds.append(current)
            current, events = {}, 0
    if current:
        rounds.append(current)
    for taken in rounds:
        for batch in taken.values():
            batch.sort(key=lambda r: (r.partition, r.offset))
    return [{role: taken[role] for role in FOLD_ORDER if role in taken} for taken in rounds]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--slices", type=int, default=18)
    parser.add_argument("--slice", type=int, default=30, help="steps per slice")
    parser.add_argument("--round", type=int, default=3600, help="events per round")
    args = parser.parse_args()
    worker = Worker(args.runs)
    points = []
    for i in range(args.slices):
        first, last = i * args.slice + 1, (i + 1) * args.slice
        records, events = worker.records(first, last)
        decode_s, fold_s = worker.fold(records, args.round)
        point = {
            "steps": [first, last],
            "events": events,
            "decode_us_per_event": round(1e6 * decode_s / events, 3),
            "fold_us_per_event": round(1e6 * fold_s / events, 3),
            "us_per_event": round(1e6 * (decode_s + fold_s) / events, 3),
        }
        points.append(point)
        print(
            f"steps {first}-{last}: {events:,} events, decode {point['decode_us_per_event']} "
            f"+ fold {point['fold_us_per_event']} = {point['us_per_event']} us per event",
            flush=True,
        )
    print(json.dumps({"bench": "fleet_age", "runs": args.runs, "round_events": args.round,
                      "slices": points}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
