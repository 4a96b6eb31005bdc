"""Recovery at scale: a SIGKILLed worker's successor with 10,000 runs in its tables.

Setup (once, on topics of a fresh prefix): ``--runs`` runs (default 10,000), each with a
RunStarted (steps and heartbeats topics), ``--steps`` steps of ``--world`` ranks (a
StepCompleted each, the ranks' heartbeats in one packed record per step) and one
alert-only ``straggler`` verdict on the anomalies topic, so every run has a step-health,
a liveness and a policy state. The verdicts are written by the bench, not by a worker:
they are what the policy table folds, and a worker would need hundreds of steps per run
to raise one honestly.

Then, per store (``--stores``, default ``memory,rocksdb``), with an app id of its own:

1. a `runwatch processors` worker starts and drains the backlog; the bench waits until
   the group committed every input record (`processors.fleet.wait_until_processed`), so
   every state is in the changelogs, then SIGKILLs it;
2. a probe is written: a StepCompleted with a NaN loss for one of the runs;
3. a successor starts. **Processing again** is measured from just before the successor's
   process is spawned to the moment the probe's ``nonfinite_loss`` verdict is readable on
   the anomalies topic: start-up, group join, the tables' recovery (faust processes no
   input before every assigned changelog partition is restored) and the fold of the
   probe. Also: its peak RSS (``VmHWM``, read once the verdict is out) and the changelog
   records and bytes it had to replay.

Cases: ``memory`` (faust's ``memory://``, what runwatch ran before ``--store``: the
successor replays every changelog record); ``rocksdb-local`` (the successor reopens the
killed worker's data dir: it replays only the changelog records past the offsets the
databases hold, read here from the databases themselves once the worker is dead);
``rocksdb-fresh`` (a successor on another host: an empty data dir, a full replay into
RocksDB). State size: the latest record of every key of the changelogs (what a store
holds), and the RocksDB data dir on disk.

The worker's clock writes a Tick into every heartbeat partition every ``--tick-interval``
seconds, and a Tick rewrites the liveness state of every *live* run of its partition (an
ended run's is left alone): the liveness changelog grows by up to one record per live run
per interval while a worker runs (until Kafka compacts a rolled segment, every 10 minutes
or 64 MiB: `processors.app.CHANGELOG_COMPACTION`), so the replayed figures depend on how
long the first worker ran (``--hold-s`` keeps it running that long after its drain) and on
how many runs are live (``--ended-share`` ends the others).

Uses the broker of ``$RUNWATCH_BOOTSTRAP`` (or ``--bootstrap``); ``--own-broker`` starts
one in a temporary directory. On this 2-core machine the defaults take a few minutes:

    .venv/bin/python bench/recovery_state.py [--runs 10000] [--stores memory,rocksdb]

Workers run ``python -m runwatch.cli`` from the current directory.
"""

from __future__ import annotations

import sys

# Run as a script, this file's directory comes first on sys.path and its name would
# shadow the `processors` package it measures.
if sys.path and sys.path[0] == __import__("os").path.dirname(__file__):
    sys.path.pop(0)

import argparse
import json
import math
import os
import shutil
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from runwatch.admin import create_catalogue
from runwatch.broker.lifecycle import EmbeddedBroker
from runwatch.processors.fleet import wait_until_processed
from runwatch.processors.settings import changelog_topic
from runwatch.procs import ManagedProcess, exit_on_sigterm
from runwatch.schemas.codec import decode, encode, encode_key, encode_pack
from runwatch.schemas.events import AnomalyDetected, Heartbeat, RunEnded, RunStarted, StepCompleted
from runwatch.schemas.topics import names

SETS = ("hang_timeout_s=3600", "dead_rank_timeout_s=3600", "startup_timeout_s=3600")
TABLES = ("step-health", "liveness", "policy", "checkpoints")
COMMAND_KEY = "recovery-command-key-0123456789abcdef"
OFFSET_KEY = b"__faust\0offset__"  # where faust's RocksDB store keeps a database's offset

TP = tuple[str, int]


def run_id(i: int) -> str:
    return f"run-{i:05d}"


def setup(
    bootstrap: str, prefix: str, runs: int, steps: int, world: int, ended: int = 0
) -> dict[str, int]:
    """Write the backlog (the last ``ended`` runs end after their steps); records per topic."""
    topics = names(prefix)
    out = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20,
                        batch_size=512 * 1024)  # fmt: skip
    counts = {topics.steps: 0, topics.heartbeats: 0, topics.anomalies: 0}

    def send(topic: str, key: bytes, value: bytes) -> None:
        out.send(topic, key=key, value=value)
        counts[topic] += 1

    for i in range(runs):
        rid, ts = run_id(i), time.time_ns()
        key = encode_key(rid)
        started = encode(RunStarted(run_id=rid, ts_ns=ts, world_size=world))
        send(topics.steps, key, started)
        send(topics.heartbeats, key, started)
        for step in range(1, steps + 1):
            ev = StepCompleted(run_id=rid, ts_ns=ts + step, seq=step, step=step,
                               loss=3.0 - 0.01 * step, step_time_s=1.0, grad_norm=1.0,
                               tokens=4096)  # fmt: skip
            send(topics.steps, key, encode(ev))
            beats = [
                encode(Heartbeat(run_id=rid, ts_ns=ts + step, seq=step, rank=r, step=step))
                for r in range(world)
            ]
            send(topics.heartbeats, key, encode_pack(rid, ts + step, beats))
        verdict = AnomalyDetected(run_id=rid, ts_ns=ts + steps, verdict_id=f"bench-{rid}",
                                  kind="straggler", step=steps, rank=0,
                                  detail="bench: a policy state per run")  # fmt: skip
        send(topics.anomalies, key, encode(verdict))
        if i >= runs - ended:
            end = encode(RunEnded(run_id=rid, ts_ns=ts + steps + 1, status="completed"))
            send(topics.steps, key, end)
            send(topics.heartbeats, key, end)
    out.flush()
    out.close()
    return counts


def offsets(bootstrap: str, topics: list[str]) -> tuple[dict[TP, int], dict[TP, int]]:
    """(beginning, end) offsets of every partition of ``topics``."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    tps = [TopicPartition(t, p) for t in topics for p in consumer.partitions_for_topic(t) or ()]
    begin = {(tp.topic, tp.partition): n for tp, n in consumer.beginning_offsets(tps).items()}
    end = {(tp.topic, tp.partition): n for tp, n in consumer.end_offsets(tps).items()}
    consumer.close()
    return begin, end


def read_range(bootstrap: str, start: dict[TP, int], end: dict[TP, int]
               ) -> tuple[int, int, dict[str, dict[bytes, int]]]:  # fmt: skip
    """Records and key + value bytes in [start, end) per partition, and the latest value
    size of every key per topic (what a store holds after replaying them)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             max_partition_fetch_bytes=8 * 1024 * 1024)  # fmt: skip
    todo = {TopicPartition(t, p): n for (t, p), n in end.items() if n > start.get((t, p), 0)}
    records = size = 0
    latest: dict[str, dict[bytes, int]] = {}
    if todo:
        consumer.assign(list(todo))
        for tp in todo:
            consumer.seek(tp, start.get((tp.topic, tp.partition), 0))
        while todo:
            for tp, batch in consumer.poll(timeout_ms=500, max_records=50_000).items():
                for rec in batch:
                    if tp not in todo or rec.offset >= todo[tp]:
                        continue
                    records += 1
                    size += len(rec.key or b"") + len(rec.value or b"")
                    latest.setdefault(tp.topic, {})[rec.key or b""] = len(rec.key or b"") + len(
                        rec.value or b""
                    )
                if tp in todo and consumer.position(tp) >= todo[tp]:
                    del todo[tp]
    consumer.close()
    return records, size, latest


def persisted_offsets(data_dir: Path, app_id: str) -> dict[TP, int]:
    """The changelog offset each RocksDB database of ``data_dir`` holds (faust resumes after it)."""
    from rocksdict import AccessType, Options, Rdict

    out: dict[TP, int] = {}
    for db_path in sorted(data_dir.glob("v*/tables/*.db")):
        table, _, part = db_path.name.removesuffix(".db").rpartition("-")
        db = Rdict(str(db_path), options=Options(raw_mode=True),
                   access_type=AccessType.read_only())  # fmt: skip
        raw = db.get(OFFSET_KEY)
        db.close()
        if raw is not None:
            out[(changelog_topic(app_id, table), int(part))] = int(raw)
    return out


def wait_group_empty(bootstrap: str, group: str, timeout_s: float) -> None:
    """Return once ``group`` has no members (a killed worker's session has expired)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    deadline = time.monotonic() + timeout_s
    try:
        while admin.describe_groups([group]).get(group, {}).get("members"):
            if time.monotonic() > deadline:
                raise SystemExit(f"group {group} still has members after {timeout_s:.0f} s")
            time.sleep(0.5)  # polling the coordinator's view
    finally:
        admin.close()


RESTORE_START = "Restoring state from changelog topics"
RESTORE_DONE = "Done reading from changelog topics"


def log_marks(log_path: Path, wall0: float) -> dict[str, float]:
    """Seconds from the spawn to the first line with each of faust's recovery messages."""
    out: dict[str, float] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        for mark in (RESTORE_START, RESTORE_DONE):
            if mark in line and mark not in out:
                stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                out[mark] = round(stamp - wall0, 2)
    return out


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return math.nan


class VerdictWatch(threading.Thread):
    """Notes when a ``nonfinite_loss`` verdict of each probe run becomes readable."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                      enable_auto_commit=False)  # fmt: skip
        tps = [TopicPartition(topic, p) for p in self.consumer.partitions_for_topic(topic)]
        self.consumer.assign(tps)
        self.consumer.seek_to_end(*tps)
        for tp in tps:
            self.consumer.position(tp)  # resolve "the end" now, before any probe is written
        self.stop = threading.Event()
        self.seen_s: dict[str, float] = {}
        self.seen = threading.Condition()

    def run(self) -> None:
        while not self.stop.is_set():
            for batch in self.consumer.poll(timeout_ms=100).values():
                now = time.monotonic()
                for rec in batch:
                    ev = decode(rec.value)
                    if isinstance(ev, AnomalyDetected) and ev.kind == "nonfinite_loss":
                        with self.seen:
                            self.seen_s.setdefault(ev.run_id, now)
                            self.seen.notify_all()
        self.consumer.close()

    def wait(self, run: str, timeout_s: float) -> float:
        with self.seen:
            if not self.seen.wait_for(lambda: run in self.seen_s, timeout=timeout_s):
                raise SystemExit(f"no verdict for the probe {run} in {timeout_s:.0f} s")
            return self.seen_s[run]


class Bench:
    """One prefix, its backlog, and the workers of every case."""

    def __init__(self, bootstrap: str, prefix: str, root: Path, args: argparse.Namespace) -> None:
        self.bootstrap, self.prefix, self.root, self.args = bootstrap, prefix, root, args
        self.topics = names(prefix)
        self.inputs = [self.topics.steps, self.topics.heartbeats, self.topics.anomalies]
        self.probes = 0
        self.workers: list[ManagedProcess] = []

    def start(self, app_id: str, store: str, data_dir: Path, name: str,
              extra: tuple[str, ...] = ()) -> ManagedProcess:  # fmt: skip
        args = [*extra, "processors", "--bootstrap", self.bootstrap, "--prefix", self.prefix,
                "--app-id", app_id, "--store", store, "--data-dir", str(data_dir),
                "--tick-interval", str(self.args.tick_interval), "--loglevel", "info"]  # fmt: skip
        for s in SETS:
            args += ["--set", s]
        env = {**os.environ, "RUNWATCH_COMMAND_KEY": COMMAND_KEY}
        worker = ManagedProcess.runwatch(name, args, self.root / f"{name}.log", env=env,
                                         cwd=self.root)  # fmt: skip
        self.workers.append(worker)
        return worker

    def fill(self, app_id: str, store: str, data_dir: Path) -> dict[str, Any]:
        """A worker drains the backlog; SIGKILLed once all of it is committed."""
        t0 = time.monotonic()
        worker = self.start(app_id, store, data_dir, f"{app_id}-first")
        wait_until_processed(self.bootstrap, app_id, self.inputs, timeout_s=self.args.timeout_s)
        drained_s = time.monotonic() - t0
        if self.args.hold_s > 0:  # steady state: the clock's Ticks go on rewriting states
            time.sleep(self.args.hold_s)  # the measured interval, not synchronisation
            wait_until_processed(self.bootstrap, app_id, self.inputs,
                                 timeout_s=self.args.timeout_s)  # fmt: skip
        worker.kill()
        return {"first_worker_s": round(drained_s, 1),
                "first_worker_total_s": round(time.monotonic() - t0, 1)}  # fmt: skip

    def successor(self, app_id: str, store: str, data_dir: Path, case: str,
                  start_at: dict[TP, int] | None) -> dict[str, Any]:  # fmt: skip
        """Probe, start a successor, time it to the probe's verdict; SIGKILL it.

        The successor starts once the group has no member left (the killed worker's
        session expired): the figure is the successor's own, not the failover detection
        (``--session-timeout``, configured) that comes before it in a real crash.
        """
        changelogs = [changelog_topic(app_id, t) for t in TABLES]
        begin, end = offsets(self.bootstrap, changelogs)
        start = begin if start_at is None else {tp: max(begin[tp], start_at.get(tp, -1) + 1)
                                                for tp in end}  # fmt: skip
        total, total_bytes, state = read_range(self.bootstrap, begin, end)
        replayed, replayed_bytes = total, total_bytes
        if start_at is not None:
            replayed, replayed_bytes, _ = read_range(self.bootstrap, start, end)
        wait_group_empty(self.bootstrap, app_id, self.args.timeout_s)  # the dead one expired
        watch = VerdictWatch(self.bootstrap, self.topics.anomalies)
        watch.start()
        probe = run_id(self.probes)
        self.probes += 1
        out = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        nan = StepCompleted(run_id=probe, ts_ns=time.time_ns(), seq=10_000,
                            step=self.args.steps + 1, loss=float("nan"), step_time_s=1.0,
                            grad_norm=1.0, tokens=4096)  # fmt: skip
        out.send(self.topics.steps, key=encode_key(probe), value=encode(nan))
        out.flush()
        out.close()
        t0, wall0 = time.monotonic(), time.time()
        worker = self.start(app_id, store, data_dir, f"{app_id}-{case}")
        t_verdict = watch.wait(probe, self.args.timeout_s)
        rss = peak_rss_mb(worker.proc.pid)
        worker.kill()
        watch.stop.set()
        watch.join(timeout=5)
        marks = log_marks(worker.log_path, wall0)
        return {
            "case": case,
            "processing_again_s": round(t_verdict - t0, 2),
            "restore_starts_s": marks.get(RESTORE_START),
            "restore_done_s": marks.get(RESTORE_DONE),
            "successor_peak_rss_mb": round(rss, 1),
            "changelog_records_replayed": replayed,
            "changelog_bytes_replayed": replayed_bytes,
            "changelog_records_total": total,
            "changelog_bytes_total": total_bytes,
            "state_keys": sum(len(v) for v in state.values()),
            "state_bytes": sum(sum(v.values()) for v in state.values()),
            "rocksdb_dir_bytes": dir_bytes(data_dir) if store == "rocksdb" else None,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=2, help="steps per run in the backlog")
    parser.add_argument("--world", type=int, default=4, help="ranks per run (one pack a step)")
    parser.add_argument("--stores", default="memory,rocksdb", help="comma-separated")
    parser.add_argument(
        "--ended-share",
        type=float,
        default=0.0,
        help="share of the runs that ended (RunEnded after their steps), as most of a "
        "long-lived fleet's state is; the probes use the first, live, runs",
    )
    parser.add_argument("--tick-interval", type=float, default=1.0, help="the workers' clock")
    parser.add_argument("--hold-s", type=float, default=0.0,
                        help="keep the first worker running this long after its drain")  # fmt: skip
    parser.add_argument("--bootstrap", default=os.environ.get("RUNWATCH_BOOTSTRAP"))
    parser.add_argument("--own-broker", action="store_true", help="start a broker of its own")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    exit_on_sigterm()  # stop the children it started when it is stopped itself
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    root = Path(tempfile.mkdtemp(prefix="runwatch-recovery-state-"))
    prefix = f"rstate{uuid.uuid4().hex[:8]}"
    cases: list[dict[str, Any]] = []
    with ExitStack() as stack:
        if not args.keep:
            stack.callback(shutil.rmtree, root, True)
        bootstrap = args.bootstrap
        if args.own_broker or not bootstrap:
            broker = EmbeddedBroker(root / "broker")
            bootstrap = broker.start().bootstrap
            stack.callback(broker.stop)
        bench = Bench(bootstrap, prefix, root, args)
        stack.callback(lambda: [w.stop() for w in bench.workers])
        create_catalogue(bootstrap, prefix=prefix)  # the catalogue's fleet-sized partitions
        t0 = time.monotonic()
        backlog = setup(
            bootstrap, prefix, args.runs, args.steps, args.world,
            ended=int(args.runs * args.ended_share),
        )  # fmt: skip
        setup_s = time.monotonic() - t0
        for store in stores:
            app_id = f"{prefix}-{store}"
            data_dir = root / f"{store}-a"
            filled = bench.fill(app_id, store, data_dir)
            if store == "memory":
                cases.append({**filled, **bench.successor(app_id, store, data_dir, "memory",
                                                          None)})  # fmt: skip
                continue
            local = persisted_offsets(data_dir, app_id)
            cases.append({**filled, **bench.successor(app_id, store, data_dir, "rocksdb-local",
                                                      local)})  # fmt: skip
            fresh = root / f"{store}-fresh"
            cases.append(bench.successor(app_id, store, fresh, "rocksdb-fresh", None))

    print(f"recovery_state: {args.runs:,} runs x ({args.steps} steps, {args.world} ranks), "
          f"backlog {sum(backlog.values()):,} records written in {setup_s:.1f} s")  # fmt: skip
    head = ("case", "first_worker_s", "restore_starts_s", "restore_done_s",
            "processing_again_s", "successor_peak_rss_mb",
            "changelog_records_replayed", "changelog_bytes_replayed", "changelog_records_total",
            "state_keys", "state_bytes", "rocksdb_dir_bytes")  # fmt: skip
    print(" | ".join(head))
    for c in cases:
        print(" | ".join(str(c.get(h, "")) for h in head))
    result = {"bench": "recovery_state", "runs": args.runs, "steps": args.steps,
              "world": args.world, "tick_interval_s": args.tick_interval, "hold_s": args.hold_s,
              "ended_share": args.ended_share,
              "backlog_records": sum(backlog.values()), "cases": cases}  # fmt: skip
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
