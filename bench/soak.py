"""Soak: sustained load, workers SIGKILLed on a schedule, the broker restarted once.

What it proves, as one JSON line: under a steady stream from many runs, with crashes
that land wherever they land,

* every run's applied step and heartbeat counts equal what its partitions hold (none lost,
  none applied twice: ``counts_exact``);
* every run's audit agrees (``audits_agree`` of ``runs``): no verdict lost, none doubled
  under a second id, none the replay would not raise;
* every planted loss spike is judged once (``spikes_judged`` of ``spikes_planted``; the
  same verdict re-published after a crash has the same id and counts once, and the count
  of such identical re-publications is printed as ``verdict_republished``).

and, as context, the latency of those spikes (produce -> verdict readable) while the
load runs: ``latency_*`` over every spike, ``calm_latency_*`` over the spikes sent at
least ``--settle-s`` after the last fault (the figure to compare with an idle worker's).

The bench starts its own broker in a temporary directory (the outage must not reach
anything else), two ``runwatch processors`` workers of one app, and one producer thread
that paces ``--rate`` events/s: each run sends a step and a heartbeat per rank, round
after round. Every ``--kill-every-s`` seconds one worker (alternating) is SIGKILLed and
started again at once; at half time the broker is SIGKILLed and started again on the same
port and data directory (``--broker-restart none`` skips it).

``--rate`` should be about 80 % of what the workers drain (``bench/processors.py`` prints a
worker's figure); ``--faults none`` measures latency under load without crashes.

    .venv/bin/python bench/soak.py [--duration-s 180] [--rate 4000] [--runs 40 --world 8]

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
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from runwatch.admin import create_catalogue
from runwatch.broker.lifecycle import EmbeddedBroker
from runwatch.processors.audit import audit_all
from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.fleet import latest_states, wait_until_processed
from runwatch.procs import ManagedProcess, exit_on_sigterm
from runwatch.schemas.codec import decode, encode, encode_key
from runwatch.schemas.events import AnomalyDetected, Heartbeat, RunStarted, StepCompleted
from runwatch.schemas.topics import names

SETS = ("hang_timeout_s=3600", "dead_rank_timeout_s=3600", "rank_heartbeat_threshold=10")
SPIKE_EVERY = 50  # a loss spike at every 50th step of a run, from step 100 on
COMMAND_KEY = "soak-command-key-0123456789abcdef"


@dataclass
class Load:
    """The producer thread's account: what it sent and when it sent each spike."""

    rounds: int = 0
    events: int = 0
    spikes_sent_s: dict[tuple[str, int], float] = field(default_factory=dict)
    error: str | None = None


def produce(bootstrap: str, prefix: str, runs: list[str], world: int, rate: float,
            stop: threading.Event, load: Load) -> None:  # fmt: skip
    """Pace steps and heartbeats at ``rate`` events/s until ``stop`` is set.

    The producer is idempotent with unbounded retries, so a broker restart delays records
    but neither drops nor duplicates one: the log holds each event exactly once.
    """
    topics = names(prefix)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        delivery_timeout_ms=600_000,
        request_timeout_ms=30_000,
    )
    rng = random.Random(0)
    for run in runs:
        started = encode(RunStarted(run_id=run, ts_ns=time.time_ns(), world_size=world))
        producer.send(topics.steps, key=encode_key(run), value=started)
        producer.send(topics.heartbeats, key=encode_key(run), value=started)
    per_round = len(runs) * (1 + world)
    round_s = per_round / rate
    t0 = time.monotonic()
    try:
        while not stop.is_set():
            step = load.rounds + 1
            for run in runs:
                ts = time.time_ns()
                spike = step >= 100 and step % SPIKE_EVERY == 0
                loss = 9.0 if spike else 3.0 - 0.001 * step + rng.gauss(0, 0.02)
                ev = StepCompleted(
                    run_id=run, ts_ns=ts, seq=step, step=step, loss=loss, step_time_s=0.5,
                    grad_norm=1.0 + rng.gauss(0, 0.01), tokens=4096,
                )  # fmt: skip
                if spike:
                    load.spikes_sent_s[(run, step)] = time.monotonic()
                producer.send(topics.steps, key=encode_key(run), value=encode(ev))
                for rank in range(world):
                    hb = Heartbeat(run_id=run, ts_ns=ts, seq=step, rank=rank, step=step)
                    producer.send(topics.heartbeats, key=encode_key(run), value=encode(hb))
            load.rounds = step
            load.events += per_round
            ahead_s = t0 + step * round_s - time.monotonic()
            if ahead_s > 0:
                stop.wait(ahead_s)  # pacing the load, not synchronisation
        producer.flush()
    except Exception as exc:  # reported in the JSON line, never swallowed
        load.error = f"{type(exc).__name__}: {exc}"
    finally:
        producer.close()


class VerdictWatch(threading.Thread):
    """Reads the anomalies topic as it grows and notes when each spike's verdict appears."""

    def __init__(self, bootstrap: str, topic: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.stop = bootstrap, topic, stop
        self.first_seen_s: dict[tuple[str, int], float] = {}
        self.ids: Counter[str] = Counter()
        self.ids_of: dict[tuple[str, int], set[str]] = {}

    def run(self) -> None:
        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
            reconnect_backoff_max_ms=1000,
        )  # fmt: skip
        tps = [TopicPartition(self.topic, p) for p in consumer.partitions_for_topic(self.topic)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        while not self.stop.is_set():
            for records in consumer.poll(timeout_ms=200).values():
                now = time.monotonic()
                for rec in records:
                    ev = decode(rec.value)
                    if isinstance(ev, AnomalyDetected) and ev.kind == "loss_spike":
                        self.ids[ev.verdict_id] += 1
                        self.first_seen_s.setdefault((ev.run_id, ev.step), now)
                        self.ids_of.setdefault((ev.run_id, ev.step), set()).add(ev.verdict_id)
        consumer.close()


def start_worker(bootstrap: str, prefix: str, root: Path, name: str) -> ManagedProcess:
    args = ["processors", "--bootstrap", bootstrap, "--prefix", prefix, "--app-id",
            f"{prefix}-app", "--session-timeout", "6"]  # fmt: skip
    for s in SETS:
        args += ["--set", s]
    env = {**os.environ, "RUNWATCH_COMMAND_KEY": COMMAND_KEY}
    # One log per incarnation: a restarted worker must not overwrite its predecessor's.
    log = next(
        root / f"{name}-{n}.log" for n in range(1000) if not (root / f"{name}-{n}.log").exists()
    )
    return ManagedProcess.runwatch(name, args, log, env=env, cwd=root)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def log_counts(bootstrap: str, prefix: str) -> dict[str, Counter[str]]:
    """Steps and heartbeats per run as the log holds them: the ground truth."""
    topics = names(prefix)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    tps = [
        TopicPartition(t, p)
        for t in (topics.steps, topics.heartbeats)
        for p in consumer.partitions_for_topic(t)
    ]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    end = consumer.end_offsets(tps)
    counts: dict[str, Counter[str]] = {"steps": Counter(), "heartbeats": Counter()}
    while any(consumer.position(tp) < end[tp] for tp in tps):
        for records in consumer.poll(timeout_ms=500, max_records=50_000).values():
            for rec in records:
                ev = decode(rec.value)
                if isinstance(ev, StepCompleted):
                    counts["steps"][ev.run_id] += 1
                elif isinstance(ev, Heartbeat):
                    counts["heartbeats"][ev.run_id] += 1
    consumer.close()
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=180.0)
    parser.add_argument("--rate", type=float, default=4000.0, help="events/s offered")
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--faults", choices=["all", "none"], default="all")
    parser.add_argument("--kill-every-s", type=float, default=30.0)
    parser.add_argument("--broker-restart", choices=["kill", "none"], default="kill")
    parser.add_argument("--settle-s", type=float, default=15.0)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    exit_on_sigterm()  # stop the children it started when it is stopped itself

    root = Path(tempfile.mkdtemp(prefix="runwatch-soak-"))
    prefix = "soak"
    runs = [f"soak-{i:03d}" for i in range(args.runs)]
    faults: list[tuple[float, str]] = []
    with ExitStack() as stack:
        if not args.keep:
            stack.callback(shutil.rmtree, root, True)
        broker = EmbeddedBroker(root / "broker")
        bootstrap = broker.start().bootstrap
        stack.callback(broker.stop)
        create_catalogue(bootstrap, prefix=prefix, partitions=args.partitions)
        workers = [start_worker(bootstrap, prefix, root, f"worker{i}") for i in range(2)]
        stack.callback(lambda: [w.stop() for w in workers])
        stop = threading.Event()
        load = Load()
        producer = threading.Thread(
            target=produce, args=(bootstrap, prefix, runs, args.world, args.rate, stop, load)
        )
        watched = threading.Event()  # the watcher reads on until the verdicts are all in
        watch = VerdictWatch(bootstrap, names(prefix).anomalies, watched)
        t0 = time.monotonic()
        producer.start()
        watch.start()
        next_kill = t0 + args.kill_every_s
        broker_at = t0 + args.duration_s / 2 if args.broker_restart == "kill" else None
        victim = 0
        while (now := time.monotonic()) < t0 + args.duration_s and load.error is None:
            if args.faults == "all" and now >= next_kill:
                workers[victim].kill()
                workers[victim] = start_worker(bootstrap, prefix, root, f"worker{victim}")
                faults.append((now - t0, f"SIGKILL worker{victim}"))
                victim, next_kill = 1 - victim, time.monotonic() + args.kill_every_s
            if args.faults == "all" and broker_at is not None and now >= broker_at:
                broker.kill()
                broker.start()
                faults.append((now - t0, "SIGKILL broker, restarted"))
                broker_at, next_kill = None, time.monotonic() + args.kill_every_s
            time.sleep(0.1)  # the fault schedule's resolution, not synchronisation
        stop.set()
        producer.join()
        end_s = time.monotonic() - t0
        topics = names(prefix)
        drain0 = time.monotonic()
        wait_until_processed(bootstrap, f"{prefix}-app", [topics.steps, topics.heartbeats],
                             timeout_s=900)  # fmt: skip
        wait_until_processed(bootstrap, f"{prefix}-app", [topics.anomalies], timeout_s=300)
        drain_s = time.monotonic() - drain0
        deadline = time.monotonic() + 60
        while set(load.spikes_sent_s) - set(watch.first_seen_s) and time.monotonic() < deadline:
            time.sleep(0.2)  # the watcher reads on its own thread; poll its account
        watched.set()
        watch.join(timeout=5)

        truth = log_counts(bootstrap, prefix)
        views = latest_states(bootstrap, f"{prefix}-app")
        wrong: list[str] = []
        for run in runs:
            view = views.get(run)
            steps = view.steps.steps_observed if view and view.steps else 0
            beats = view.liveness.heartbeats if view and view.liveness else 0
            if (steps, beats) != (truth["steps"][run], truth["heartbeats"][run]):
                wrong.append(f"{run}: applied {steps}/{beats}, log {truth['steps'][run]}/"
                             f"{truth['heartbeats'][run]}")  # fmt: skip
        cfg = with_overrides(DetectorConfig(), dict(s.split("=") for s in SETS))
        receipts = audit_all(bootstrap, prefix, cfg, group=f"{prefix}-app", wait_s=30)
        disagree = [r.run_id for r in receipts if not r.agrees]
        dead_letters = sum(r.dead_letters for r in receipts)

    last_fault_s = max((t for t, _ in faults), default=-1e9)
    lat_ms, calm_ms = [], []
    for key, sent in load.spikes_sent_s.items():
        if key in watch.first_seen_s:
            ms = (watch.first_seen_s[key] - sent) * 1000
            lat_ms.append(ms)
            if sent - t0 > last_fault_s + args.settle_s or not faults:
                calm_ms.append(ms)
    result = {
        "bench": "soak",
        "duration_s": round(end_s, 1),
        "offered_events_per_s": args.rate,
        "produced_events_per_s": round(load.events / end_s, 1),
        "events": load.events,
        "runs": len(runs),
        "world": args.world,
        "faults": [f"{t:.0f}s {what}" for t, what in faults],
        "drain_after_load_s": round(drain_s, 1),
        "counts_exact": not wrong,
        "counts_wrong": wrong[:10],
        "audits_agree": len(receipts) - len(disagree),
        "audits": len(receipts),
        "disagreeing_runs": disagree[:10],
        "dead_letters": dead_letters,
        "spikes_planted": len(load.spikes_sent_s),
        "spikes_judged": len(set(load.spikes_sent_s) & set(watch.first_seen_s)),
        "spikes_doubled": sum(len(ids) > 1 for ids in watch.ids_of.values()),
        "unplanted_spikes": len(set(watch.first_seen_s) - set(load.spikes_sent_s)),
        "verdict_republished": sum(n - 1 for n in watch.ids.values()),
        "latency_p50_ms": round(statistics.median(lat_ms), 1) if lat_ms else None,
        "latency_p99_ms": round(percentile(lat_ms, 0.99), 1) if lat_ms else None,
        "calm_latency_p50_ms": round(statistics.median(calm_ms), 1) if calm_ms else None,
        "calm_latency_p99_ms": round(percentile(calm_ms, 0.99), 1) if calm_ms else None,
        "producer_error": load.error,
        "dir": str(root) if args.keep else None,
    }
    print(json.dumps(result))
    ok = (
        not wrong
        and not disagree
        and result["spikes_judged"] == result["spikes_planted"]
        and result["spikes_doubled"] == 0
    )
    return 0 if ok and load.error is None else 1


if __name__ == "__main__":
    sys.exit(main())
