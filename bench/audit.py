"""Audit time of a small run while its partition grows, and replay speed.

For each size N (default 10k, 100k, 1M) a fresh topic catalogue (4 partitions) gets N
records of other runs, all keyed to land in the same partition as the audited run, with
record timestamps an hour old (the fleet's earlier history); then a 1k-record run is
emitted by a real `RunEmitter`. Measured:

* ``audit_s``: `processors.audit.load_run_log` + `audit` of the run (what `runwatch audit
  --run` does, lag check aside): reads the run's partition from its RunStarted on;
* ``full_scan_s``: the previous way, every partition of the five topics from offset 0,
  filtered by key (`read_history` + `records_of_run` + `audit`), for comparison;
* replay speed, in process (no Kafka): records/s of the pure fold (`replay`) and of
  decode + fold (`records_of_run` + `audit`) over a 200k-record run, first with CPython's
  garbage collector as it comes, then set as `runwatch audit` sets it
  (`common.gc_tuning`).

Prints a table and one JSON line. Usage:
python bench/audit.py [--bootstrap HOST:PORT] [--sizes 10000,100000,1000000]
[--full-scan-max 1000000]
"""

from __future__ import annotations

import sys

# Run as a script, this file's directory comes first on sys.path and its name would
# shadow the `processors` package it measures.
if sys.path and sys.path[0] == __import__("os").path.dirname(__file__):
    sys.path.pop(0)

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from kafka import KafkaProducer

from runwatch.admin import create_catalogue
from runwatch.common.gc_tuning import tune_for_throughput
from runwatch.processors.audit import AuditReceipt, audit, load_run_log, records_of_run
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.replay import replay
from runwatch.processors.logread import partition_for, read_history
from runwatch.procs import exit_on_sigterm
from runwatch.producers import RunEmitter
from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import TICK_RUN_ID, Heartbeat, RunStarted, StepCompleted, Tick
from runwatch.schemas.records import RawRecord
from runwatch.schemas.topics import TopicNames, names

PARTITIONS = 4
RUN = "bench-run"
RUN_STEPS = 499  # RunStarted x3 + 499 steps + 499 heartbeats + RunEnded x3 = 1,004 records
HOUR_MS = 3600 * 1000


def other_keys(count: int) -> list[bytes]:
    """Run ids of other runs that hash to the audited run's partition."""
    target = partition_for(RUN, PARTITIONS)
    out: list[bytes] = []
    i = 0
    while len(out) < count:
        run_id = f"other-{i}"
        if partition_for(run_id, PARTITIONS) == target:
            out.append(run_id.encode())
        i += 1
    return out


def fill(bootstrap: str, prefix: str, n: int) -> None:
    """N records of 50 other runs (steps and heartbeats), an hour old, in the run's partition."""
    topics = names(prefix)
    keys = other_keys(50)
    stamp_ms = int(time.time() * 1000) - HOUR_MS
    step = {k: encode(_step(k.decode(), 1)) for k in keys}
    beat = {
        k: encode(Heartbeat(run_id=k.decode(), ts_ns=stamp_ms * 10**6, rank=0, step=1))
        for k in keys
    }
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks=1,
        linger_ms=20,
        batch_size=1 << 20,
        max_request_size=8 << 20,
    )
    for i in range(n):
        key = keys[i % len(keys)]
        topic, value = (topics.steps, step[key]) if i % 2 else (topics.heartbeats, beat[key])
        producer.send(topic, key=key, value=value, timestamp_ms=stamp_ms + i // 1000)
    producer.flush(300)
    producer.close()


def _step(run_id: str, n: int, ts_ns: int = 0) -> StepCompleted:
    return StepCompleted(
        run_id=run_id,
        ts_ns=ts_ns,
        step=n,
        loss=4.0 - n * 1e-4,
        step_time_s=0.1,
        grad_norm=1.0,
        tokens=4096,
    )


def emit_run(bootstrap: str, prefix: str) -> None:
    """The audited run: a real emitter, one rank."""
    emitter = RunEmitter(RUN, bootstrap=bootstrap, topic_prefix=prefix, rank=0, world_size=1)
    emitter.run_started(vocab_size=256, peak_flops_per_s=1e12)
    for s in range(1, RUN_STEPS + 1):
        emitter.step(
            s, loss=4.0 - 1e-3 * s, step_time_s=0.1, grad_norm=1.0, tokens=4096, examples=64
        )
        emitter.heartbeat(s, step_time_s=0.1)
    emitter.run_ended("completed", final_step=RUN_STEPS)
    assert emitter.flush(60.0), "events not delivered"
    emitter.close(30.0)


def timed(fn: Callable[[], AuditReceipt], repeats: int) -> tuple[float, AuditReceipt]:
    """Median seconds of ``repeats`` calls, and the last result."""
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def replay_speed(steps: int = 100_000) -> dict[str, float]:
    """Records/s of the fold alone and of decode + fold, over one big in-memory run."""
    topics = names("mem")
    t0 = 1_700_000_000 * 10**9
    hb: list[RawRecord] = []
    st: list[RawRecord] = []
    key = encode_key("mem-run")
    started = RunStarted(run_id="mem-run", ts_ns=t0, world_size=1, vocab_size=256, dtype="bf16")
    hb.append(RawRecord(topics.heartbeats, 0, 0, key, encode(started), 0))
    st.append(RawRecord(topics.steps, 0, 0, key, encode(started), 0))
    for s in range(1, steps + 1):
        ts = t0 + s * 10**8
        st.append(RawRecord(topics.steps, 0, s, key, encode(_step("mem-run", s, ts)), 0))
        beat = Heartbeat(run_id="mem-run", ts_ns=ts, rank=0, step=s, step_time_s=0.1)
        hb.append(RawRecord(topics.heartbeats, 0, len(hb), key, encode(beat), 0))
        if s % 10 == 0:
            tick = Tick(run_id=TICK_RUN_ID, ts_ns=ts, partition=0)
            hb.append(
                RawRecord(topics.heartbeats, 0, len(hb), TICK_RUN_ID.encode(), encode(tick), 0)
            )
    history = {topics.steps: st, topics.heartbeats: hb}
    cfg = DetectorConfig()
    n = len(st) + len(hb)
    t = time.perf_counter()
    log = records_of_run("mem-run", history, topics)
    receipt = audit(log, cfg)
    decode_fold_s = time.perf_counter() - t
    t = time.perf_counter()
    replay([*log.inputs, *log.recorded_anomalies], cfg)
    fold_s = time.perf_counter() - t
    assert receipt.input_records == n
    return {
        "replay_records": n,
        "fold_records_per_s": round(n / fold_s),
        "decode_fold_records_per_s": round(n / decode_fold_s),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap")
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--full-scan-max",
        type=int,
        default=1_000_000,
        help="measure the old full scan only up to this size (it grows with the topics)",
    )
    args = parser.parse_args()
    exit_on_sigterm()  # stop the children it started when it is stopped itself
    sizes = [int(s) for s in args.sizes.split(",")]
    cfg = DetectorConfig()
    rows = []
    with ExitStack() as stack:
        bootstrap = args.bootstrap
        if bootstrap is None:
            from runwatch.resolve import resolve_bootstrap

            try:
                bootstrap = resolve_bootstrap(None)
            except Exception:  # no broker configured: start a throwaway one
                import tempfile

                from runwatch.broker import ephemeral_broker

                tmp = stack.enter_context(tempfile.TemporaryDirectory())
                bootstrap = stack.enter_context(ephemeral_broker(Path(tmp))).bootstrap
        for n in sizes:
            prefix = f"bench-audit-{uuid.uuid4().hex[:8]}"
            create_catalogue(bootstrap, prefix=prefix, partitions=PARTITIONS)
            t = time.perf_counter()
            fill(bootstrap, prefix, n)
            fill_s = time.perf_counter() - t
            emit_run(bootstrap, prefix)

            def partition_read(prefix: str = prefix) -> AuditReceipt:
                return audit(load_run_log(bootstrap, prefix, RUN), cfg)

            audit_s, receipt = timed(partition_read, args.repeats)
            topics = names(prefix)
            wanted = {encode_key(RUN), TICK_RUN_ID.encode()}

            def full_scan(topics: TopicNames = topics, wanted: set[bytes] = wanted) -> AuditReceipt:
                history = read_history(
                    bootstrap,
                    [
                        topics.steps,
                        topics.heartbeats,
                        topics.checkpoints,
                        topics.anomalies,
                        topics.commands,
                    ],
                    key_filter=lambda k: k in wanted,
                )
                return audit(records_of_run(RUN, history, topics), cfg)

            scan_s: float | None = None
            if n <= args.full_scan_max:
                scan_s, scanned = timed(full_scan, 1)
                assert receipt == scanned, "partition read and full scan disagree"
            rows.append(
                {
                    "other_records": n,
                    "run_records": receipt.input_records,
                    "audit_s": round(audit_s, 3),
                    "full_scan_s": None if scan_s is None else round(scan_s, 3),
                    "fill_records_per_s": round(n / fill_s),
                }
            )
            scan = "not measured" if scan_s is None else f"{scan_s:6.3f} s"
            print(
                f"{n:>9} other records in the partition: audit {audit_s:6.3f} s "
                f"(full scan {scan}), run of {receipt.input_records} records",
                flush=True,
            )
    default_gc = replay_speed()  # CPython's collector as it comes
    tune_for_throughput()  # as `runwatch audit` and `runwatch replay` run
    speed = {**replay_speed(), **{f"default_gc_{k}": v for k, v in default_gc.items()}}
    print(
        f"replay of {speed['replay_records']} records: "
        f"fold {speed['fold_records_per_s']:,} records/s, "
        f"decode + fold {speed['decode_fold_records_per_s']:,} records/s "
        f"(with CPython's default GC: fold {speed['default_gc_fold_records_per_s']:,}, "
        f"decode + fold {speed['default_gc_decode_fold_records_per_s']:,})"
    )
    print(json.dumps({"bench": "audit", "partitions": PARTITIONS, "sizes": rows, **speed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
