"""The processors' states under a flood of distinct run ids (issue 19, finding 10).

One trainer credential writes what its topics accept (steps, heartbeats, checkpoints) for
``--runs`` distinct run ids: per run id one StepCompleted with a NaN loss (so the steps
reducer raises ``nonfinite_loss`` and the policy gets an anomaly of its own), one
Heartbeat and one CheckpointCommitted, as the redteam flood did (no RunStarted: a script
writes raw records). Next to it, ``--real`` honest runs start, step, checkpoint and end.

The records go through the entry point the worker's agents use (`processors.pipeline.
fold_chunks`, a round of ``--round`` records per role, chunks as in `processors.app`), and
the states land in a table of encoded bytes per role (what the memory store holds), with
evicted runs deleted as the agents delete them. The anomalies the fold raises are read back
as the anomalies topic's records and folded by the policy, as the worker does.

Phases (log time, never the wall clock, is what drives retention):

1. ``flood``: the flood and the honest runs' start, steps and checkpoints, at log time T.
2. ``ended``: the honest runs end at T + 1 min, and other traffic carries the log on to
   T + 2 days: a Tick per heartbeat partition, and in each steps, checkpoints and anomalies
   partition records of one other run up to the next offset that sweeps it (`filler`).

``--waves N`` repeats 1 and 2 with new run ids (the memory a process keeps once states are
freed is reused, so a bounded worker's resident memory stops growing). Figures after each
phase: resident memory (``VmRSS``, MiB, this process), the number of
states per kind, and the table bytes. For "before" figures run it from an older tree:
``--tree DIR`` re-executes this script with ``PYTHONPATH=DIR`` (e.g. a ``git archive`` of
main). One JSON line at the end.

    PYTHONPATH=$PWD .venv/bin/python bench/flood.py --runs 100000
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.state_codec import decode_state
from runwatch.processors.logread import partition_for
from runwatch.processors.pipeline import fold_chunks
from runwatch.schemas.events import (
    AnomalyDetected,
    CheckpointCommitted,
    Event,
    Heartbeat,
    Provenance,
    RunEnded,
    RunStarted,
    StepCompleted,
    Tick,
)
from runwatch.schemas.records import Decoded
from runwatch.schemas.topics import FOLD_ORDER, TopicRole, folding

S = 1_000_000_000
HOUR_NS = 3600 * S
PARTITIONS = {
    TopicRole.STEPS: 16,
    TopicRole.HEARTBEATS: 64,
    TopicRole.CHECKPOINTS: 8,
    TopicRole.ANOMALIES: 8,
}
"""The catalogue's default partition counts (`schemas.topics`)."""
FOLD_CHUNK_EVENTS = 4096
"""As `processors.app.FOLD_CHUNK_EVENTS`."""
SWEEP_EVERY_RECORDS = 1024
"""As `processors.core.retention.SWEEP_EVERY_RECORDS` (spelled here: "before" trees lack it)."""


def rss_mib() -> float:
    """This process's resident memory in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return -1.0


class Worker:
    """The agents' tables (run -> encoded state per role) fed as the worker feeds them."""

    def __init__(self, cfg: DetectorConfig, round_records: int) -> None:
        self.cfg = cfg
        self.round = round_records
        self.tables: dict[TopicRole, dict[str, bytes]] = {role: {} for role in FOLD_ORDER}
        self.offsets: dict[tuple[TopicRole, int], int] = {}
        self.partition_of: dict[tuple[TopicRole, str], int] = {}
        self.dead = 0
        self.commands = 0
        self.anomalies: list[AnomalyDetected] = []

    def _partition(self, role: TopicRole, run_id: str) -> int:
        key = (role, run_id)
        where = self.partition_of.get(key)
        if where is None:
            where = self.partition_of[key] = partition_for(run_id, PARTITIONS[role])
        return where

    def record(self, role: TopicRole, event: Event, partition: int | None = None) -> Decoded:
        """``event`` as the next record of its partition of ``role``."""
        p = self._partition(role, event.run_id) if partition is None else partition
        offset = self.offsets.get((role, p), 0)
        self.offsets[(role, p)] = offset + 1
        return Decoded(Provenance(topic=f"flood.{role}", partition=p, offset=offset), event)  # type: ignore[arg-type]

    def feed(self, role: TopicRole, items: list[Decoded]) -> None:
        """Fold ``items`` round by round, as the agents do; anomalies go to the policy."""
        for start in range(0, len(items), self.round):
            self._round(role, items[start : start + self.round])
        if role != TopicRole.ANOMALIES and self.anomalies:
            verdicts, self.anomalies = self.anomalies, []
            self.feed(TopicRole.ANOMALIES, [self.record(TopicRole.ANOMALIES, v) for v in verdicts])

    def _round(self, role: TopicRole, items: list[Decoded]) -> None:
        table = self.tables[role]
        kind = folding(role).state

        def load(run_id: str) -> Any:
            raw = table.get(run_id)
            return None if raw is None else decode_state(kind, raw)

        index: dict[int, list[str]] = {}  # one pass per round, as the agents' memory table

        def runs_in(partition: int) -> list[str]:
            if not index:
                for r in table:
                    index.setdefault(self._partition(role, r), []).append(r)
            return index.get(partition, [])

        encoded: dict[str, bytes] = {}
        evicted: frozenset[str] = frozenset()
        for result in fold_chunks(role, items, load, runs_in, self.cfg, FOLD_CHUNK_EVENTS):
            self.dead += len(result.dead)
            for out in result.outputs:
                if isinstance(out, AnomalyDetected):
                    self.anomalies.append(out)
                else:
                    self.commands += 1
            encoded, evicted = result.encoded, result.evicted
        for run_id in evicted:
            table.pop(run_id, None)
        table.update(encoded)

    def figures(self) -> dict[str, Any]:
        gc.collect()
        return {
            "rss_mib": rss_mib(),
            "states": {str(folding(r).state): len(t) for r, t in self.tables.items()},
            "table_mib": round(
                sum(len(v) for t in self.tables.values() for v in t.values()) / 2**20, 1
            ),
            "dead_letters": self.dead,
            "commands": self.commands,
        }


def flood_events(runs: int, t0_ns: int, wave: int = 1) -> Iterator[tuple[TopicRole, Event]]:
    """What one trainer credential writes for ``runs`` fresh run ids (new ones per wave)."""
    for i in range(runs):
        run_id = f"flood{wave}-{i:06d}"
        yield (
            TopicRole.STEPS,
            StepCompleted(
                run_id=run_id, ts_ns=t0_ns, step=1, loss=math.nan, step_time_s=0.5, tokens=4096
            ),
        )
        yield TopicRole.HEARTBEATS, Heartbeat(run_id=run_id, ts_ns=t0_ns, rank=0, step=1)
        yield (
            TopicRole.CHECKPOINTS,
            CheckpointCommitted(run_id=run_id, ts_ns=t0_ns, step=1, path=f"/ckpt/{run_id}/1"),
        )


def honest_events(real: int, t0_ns: int, steps: int) -> Iterator[tuple[TopicRole, Event]]:
    """``real`` honest runs: RunStarted on every folded topic, steps, heartbeats, checkpoints."""
    for i in range(real):
        run_id = f"real-{i:03d}"
        begun = RunStarted(run_id=run_id, ts_ns=t0_ns - HOUR_NS, world_size=1)
        for role in (TopicRole.STEPS, TopicRole.HEARTBEATS, TopicRole.CHECKPOINTS):
            yield role, begun
        for n in range(1, steps + 1):
            ts = t0_ns - HOUR_NS + n * S
            yield (
                TopicRole.STEPS,
                StepCompleted(run_id=run_id, ts_ns=ts, step=n, loss=2.0 + 1 / n, step_time_s=1.0),
            )
            yield TopicRole.HEARTBEATS, Heartbeat(run_id=run_id, ts_ns=ts, rank=0, step=n)
        yield (
            TopicRole.CHECKPOINTS,
            CheckpointCommitted(
                run_id=run_id, ts_ns=t0_ns - HOUR_NS + steps * S, step=steps, path=f"/c/{run_id}"
            ),
        )


def feed_all(worker: Worker, events: Iterator[tuple[TopicRole, Event]]) -> None:
    by_role: dict[TopicRole, list[Decoded]] = {role: [] for role in FOLD_ORDER}
    for role, event in events:
        by_role[role].append(worker.record(role, event))
    for role in FOLD_ORDER:
        if by_role[role]:
            worker.feed(role, by_role[role])


def filler(role: TopicRole, partition: int, i: int, now_ns: int) -> Event:
    """The ``i``-th record of other traffic in a partition at log time ``now_ns``."""
    run_id = f"filler-{partition}"
    if role == TopicRole.HEARTBEATS:
        return Tick(run_id="*", ts_ns=now_ns, partition=partition)
    if role == TopicRole.STEPS:
        return StepCompleted(run_id=run_id, ts_ns=now_ns, step=i + 1, loss=2.0, step_time_s=1.0)
    if role == TopicRole.CHECKPOINTS:
        return CheckpointCommitted(run_id=run_id, ts_ns=now_ns, step=i + 1, path=f"/f/{i}")
    return AnomalyDetected(
        run_id=run_id, ts_ns=now_ns, seq=i, verdict_id=f"{run_id}-{i}", kind="loss_spike",
        step=i + 1, incarnation=0,
    )  # fmt: skip


def later(worker: Worker, real: int, now_ns: int) -> None:
    """The honest runs end, and log time reaches ``now_ns`` in every partition.

    Each partition gets other traffic at ``now_ns`` up to and including its next offset
    that is a multiple of `SWEEP_EVERY_RECORDS` (a Tick for heartbeats): that many more
    records is what a partition takes to be swept.
    """
    events: list[tuple[TopicRole, Event]] = []
    for i in range(real):
        end = RunEnded(
            run_id=f"real-{i:03d}", ts_ns=now_ns - 2 * 24 * HOUR_NS + 60 * S, status="completed"
        )
        events += [(r, end) for r in (TopicRole.STEPS, TopicRole.HEARTBEATS, TopicRole.CHECKPOINTS)]
    feed_all(worker, iter(events))
    for role in FOLD_ORDER:
        items: list[Decoded] = []
        for p in range(PARTITIONS[role]):
            offset = worker.offsets.get((role, p), 0)
            count = 1 if role == TopicRole.HEARTBEATS else -offset % SWEEP_EVERY_RECORDS + 1
            items += [worker.record(role, filler(role, p, i, now_ns), p) for i in range(count)]
        worker.feed(role, items)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100_000, help="distinct flood run ids")
    parser.add_argument("--real", type=int, default=50, help="honest runs beside the flood")
    parser.add_argument("--round", type=int, default=2000, help="records per round per role")
    parser.add_argument("--tree", default="", help="run the fold of this source tree instead")
    parser.add_argument("--label", default="")
    parser.add_argument("--waves", type=int, default=1, help="floods, two days of log apart")
    args = parser.parse_args()
    if args.tree:
        at = sys.argv.index("--tree")
        argv = [*sys.argv[1:at], *sys.argv[at + 2 :]]
        env = {**os.environ, "PYTHONPATH": str(Path(args.tree).resolve())}
        sys.exit(subprocess.run([sys.executable, __file__, *argv], env=env, check=False).returncode)
    cfg = DetectorConfig()
    worker = Worker(cfg, args.round)
    t0_ns = 1_800_000_000 * S
    result: dict[str, Any] = {"bench": "flood", "label": args.label, "runs": args.runs}
    result["start"] = worker.figures()
    started = time.perf_counter()
    feed_all(worker, iter([*honest_events(args.real, t0_ns, 20), *flood_events(args.runs, t0_ns)]))
    result["flood"] = {**worker.figures(), "fold_s": round(time.perf_counter() - started, 1)}
    result["real_states_after_flood"] = {
        str(folding(role).state): sum(1 for r in worker.tables[role] if r.startswith("real-"))
        for role in FOLD_ORDER
    }
    started = time.perf_counter()
    later(worker, args.real, t0_ns + 2 * 24 * HOUR_NS)
    result["ended"] = {**worker.figures(), "fold_s": round(time.perf_counter() - started, 1)}
    phases = ["start", "flood", "ended"]
    for wave in range(2, args.waves + 1):  # the same flood again, new run ids, 2 days on
        t_ns = t0_ns + (wave - 1) * 2 * 24 * HOUR_NS + HOUR_NS
        started = time.perf_counter()
        feed_all(worker, flood_events(args.runs, t_ns, wave))
        result[f"flood{wave}"] = {
            **worker.figures(),
            "fold_s": round(time.perf_counter() - started, 1),
        }
        later(worker, 0, t_ns + 2 * 24 * HOUR_NS)
        result[f"ended{wave}"] = worker.figures()
        phases += [f"flood{wave}", f"ended{wave}"]
    for phase in phases:
        f = result[phase]
        print(f"{phase:7} rss {f['rss_mib']:>7} MiB  table {f['table_mib']:>6} MiB  "
              f"states {f['states']}  dead {f['dead_letters']}  cmds {f['commands']}")  # fmt: skip
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()
