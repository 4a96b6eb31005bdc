"""The fold's CPU per event in a paced load's rounds against a drain's, in-process.

`bench/latency.py` finds the worker paying 1.4-1.7x its drain's CPU per event under a
paced load. This bench asks how much of that the fold's own per-round work explains (a
`Replayer` per chunk, the touched runs' states preloaded and encoded once per round, the
collection between rounds), with no Kafka, no faust and no event loop: the latency bench's
mix (``--runs`` runs, each step one `StepCompleted` record and one pack of ``--world``
heartbeats, 4 partitions) is decoded and folded exactly as the worker does it
(`schemas.records.split`, `processors.pipeline.fold_chunks` in chunks of
`processors.app.FOLD_CHUNK_EVENTS` events, states carried from round to round, the
collector run only between rounds as `runwatch processors` runs it), in rounds of each
``--rounds`` size. Sizes alternate ``--repeat`` times; CPU is the process's.

``--neighbour`` adds what the worker has beside it under a paced load and not in a
drain: a process on the same CPU (both pinned) that touches a 64 MB array at random in
bursts (as the broker and the load generator do between the worker's slices), so every
slice of the fold starts with caches another process filled.

``--gap-ms`` adds the other thing a paced worker does and a draining one does not: it
waits for its next fetch between rounds (4-5 ms at p50 at 80 % load), and its CPU idles
meanwhile. Each round of every size then sleeps that long after it (sleep is not CPU
time): whatever the idle costs the next round (caches another tenant of the host filled,
a clock that slowed) shows in the rounds' CPU per event, most in the small rounds'.

    .venv/bin/python bench/rounds.py [--rounds 500,20000] [--repeat 3] [--neighbour]
                                     [--gap-ms 5]

Prints CPU microseconds per event per round size (worst and best of the repeats), the
small rounds' worst over the large rounds' best, then one JSON line (``bench: rounds``).
"""

from __future__ import annotations

import sys

# Run as a script, this file's directory comes first on sys.path and its name would
# shadow the `processors` package it measures.
if sys.path and sys.path[0] == __import__("os").path.dirname(__file__):
    sys.path.pop(0)

import argparse
import json
import os
import random
import subprocess
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from runwatch.common.gc_tuning import collect_between_rounds, tune_for_rounds
from runwatch.processors.app import FOLD_CHUNK_EVENTS
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.pipeline import fold_chunks
from runwatch.schemas.codec import encode, encode_pack
from runwatch.schemas.events import Heartbeat, RunStarted, StepCompleted
from runwatch.schemas.records import RawRecord, split
from runwatch.schemas.topics import TopicRole

PARTITIONS = 4
T0_NS = 1_700_000_000_000_000_000
STEP_NS = 300_000_000
ROLES = (TopicRole.STEPS, TopicRole.HEARTBEATS)
NEIGHBOUR = """
import time, numpy as np
a = np.ones(8_000_000)
idx = np.random.default_rng(0).integers(0, a.size, 1_000_000)
while True:
    a[idx] += 1.0
    time.sleep(0.002)
"""
"""The neighbour: random touches over 64 MB (caches filled with its lines), then a pause."""


def build_log(runs: int, world: int, steps: int) -> tuple[list[tuple[TopicRole, RawRecord]], int]:
    """The latency bench's mix as records in log order, and its number of events."""
    rng = random.Random(1)
    offsets: dict[tuple[TopicRole, int], int] = {}
    log: list[tuple[TopicRole, RawRecord]] = []

    def record(role: TopicRole, run: int, value: bytes, ts_ns: int) -> None:
        partition = run % PARTITIONS
        offset = offsets.get((role, partition), 0)
        offsets[role, partition] = offset + 1
        key = f"run-{run:04d}".encode()
        topic = f"bench.{role}"
        log.append((role, RawRecord(topic, partition, offset, key, value, ts_ns // 1_000_000)))

    names = [f"run-{run:04d}" for run in range(runs)]
    for run, name in enumerate(names):
        record(
            TopicRole.STEPS,
            run,
            encode(RunStarted(run_id=name, ts_ns=T0_NS, world_size=world)),
            T0_NS,
        )
    for step in range(1, steps + 1):
        ts_ns = T0_NS + step * STEP_NS
        for run, name in enumerate(names):
            loss = 3.0 + rng.gauss(0.0, 0.02)
            grad = 1.0 + rng.random() * 0.1
            step_event = StepCompleted(
                run_id=name,
                ts_ns=ts_ns,
                step=step,
                loss=loss,
                step_time_s=0.3,
                grad_norm=grad,
                tokens=65_536,
            )
            record(TopicRole.STEPS, run, encode(step_event), ts_ns)
            beats = [
                encode(
                    Heartbeat(
                        run_id=name,
                        ts_ns=ts_ns + rank,
                        rank=rank,
                        step=step,
                        step_time_s=0.3 + rng.random() * 0.003,
                        host=f"h{rank // 8}",
                        pid=1000 + rank,
                    )
                )
                for rank in range(world)
            ]
            record(TopicRole.HEARTBEATS, run, encode_pack(name, ts_ns + world, beats), ts_ns)
    events = sum(1 if role is TopicRole.STEPS else world for role, _ in log)
    return log, events


def fold_in_rounds(
    log: list[tuple[TopicRole, RawRecord]],
    round_records: int,
    cfg: DetectorConfig,
    gap_s: float = 0.0,
) -> float:
    """CPU seconds to fold ``log`` in rounds of ``round_records`` records, as the worker does.

    ``gap_s``: an idle wait after each round, as a paced worker's wait for its next fetch.
    """
    stores: dict[TopicRole, dict[str, Any]] = {role: {} for role in ROLES}
    members: dict[TopicRole, dict[int, set[str]]] = {role: {} for role in ROLES}
    start = time.process_time()
    for first in range(0, len(log), round_records):
        rnd = log[first : first + round_records]
        for role in ROLES:
            raws = [record for r, record in rnd if r is role]
            if not raws:
                continue
            good, _ = split(raws, role)
            store, known = stores[role], members[role]
            chunks = fold_chunks(
                role,
                good,
                store.get,
                lambda p, k=known: sorted(k.get(p, ())),
                cfg,
                FOLD_CHUNK_EVENTS,
            )
            last = deque(chunks, maxlen=1)  # each chunk's states and encoded: the same dicts
            if last:
                store.update(last[0].states)
                for run_id in last[0].encoded:
                    known.setdefault(int(run_id[4:]) % PARTITIONS, set()).add(run_id)
        collect_between_rounds()
        if gap_s:
            time.sleep(gap_s)  # the measured idle between rounds, not synchronisation
    return time.process_time() - start


@contextmanager
def neighbour(wanted: bool) -> Iterator[None]:
    """A cache-filling process on this process's CPU (both pinned to CPU 0), or nothing."""
    if not wanted:
        yield
        return
    os.sched_setaffinity(0, {0})
    proc = subprocess.Popen(
        [sys.executable, "-c", NEIGHBOUR], preexec_fn=lambda: os.sched_setaffinity(0, {0})
    )
    try:
        time.sleep(1.0)  # its array allocated and being touched
        yield
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    """Fold the mix in each round size, alternated; print the figures and a JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--world", type=int, default=32)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", default="500,20000", help="records per round, small first")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--neighbour", action="store_true", help="a cache-filling process on the same CPU"
    )
    parser.add_argument(
        "--gap-ms", type=float, default=0.0, help="idle wait after every round (a fetch's wait)"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.rounds.split(",")]
    log, events = build_log(args.runs, args.world, args.steps)
    cfg = DetectorConfig()
    tune_for_rounds()
    us: dict[int, list[float]] = {size: [] for size in sizes}
    with neighbour(args.neighbour):
        for _ in range(args.repeat):
            for size in sizes:
                cpu_s = fold_in_rounds(log, size, cfg, args.gap_ms / 1000)
                us[size].append(1e6 * cpu_s / events)
    print(
        f"{len(log):,} records, {events:,} events; neighbour on the same CPU: "
        f"{args.neighbour}; idle after each round: {args.gap_ms:g} ms"
    )
    for size, values in us.items():
        worst, best = max(values), min(values)
        print(f"rounds of {size:>6,} records: {worst:.3f} us CPU per event (best {best:.3f})")
    small, large = sizes[0], sizes[-1]
    ratio = max(us[small]) / min(us[large])
    print(f"rounds of {small:,} (worst) over rounds of {large:,} (best): {ratio:.2f}x")
    summary = {
        "bench": "rounds",
        "events": events,
        "neighbour": args.neighbour,
        "gap_ms": args.gap_ms,
        "us_per_event": {str(size): [round(v, 3) for v in values] for size, values in us.items()},
        "small_worst_over_large_best": round(ratio, 3),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
