"""Processor throughput and detection latency through a real broker and a real worker.

Phases, against one backlog produced once:

0. Ceiling: the backlog read with aiokafka ``getmany`` in this process, decoded and folded
   through the same `fold_batch` (no faust, no outputs published, no state written): what
   consuming, decoding and folding cost on their own. It is measured again right before
   each worker, so a worker and its ceiling run under the same load of the box.
1. Throughput: one `runwatch processors` worker (a subprocess) drains the backlog.
   Events/s is over the worker's own rounds, from the start of its first to the end of
   the one that reached the backlog's end (its `RoundStats` lines), as the quixstreams
   peer is timed from its first event to its last, so worker start-up is not counted;
   the drain is over when the group's committed offsets reach the end. The ``ratio`` is
   the worker over the ceiling measured just before it. On a shared box the load of other
   processes moves wall-clock figures between two measurements, so CPU per event (the
   worker's process, every thread, over the same window; the ceiling's process) is printed
   too, with its ratio (``cpu_ratio``): the part of the comparison the neighbours' load
   does not move.
2. Peers (issue 23): on the same backlog, right after the worker, bench/peers.py's
   quixstreams app doing the same core job (robust z on a 50-step loss window per run,
   last-seen step per rank) and its confluent-kafka read+decode ceiling, each in a process
   of its own; the table puts them beside the worker with the issue's goals (at least 2x
   quixstreams' events/s, at most 3 us CPU per unpacked event). A peer whose package is
   not installed (``pip install -e '.[peers]'``) is named and skipped; ``--no-peers``
   skips both.
3. Latency: with the worker idle, a paced stream of steps where every 20th
   step of a run is a loss spike; latency is from just before `send` of the spike to the
   moment a consumer of the anomalies topic reads its verdict.

Where the time goes: the same events are decoded and folded in-process (no Kafka, no
faust) to split the per-event cost into decode, fold and the rest (faust, aiokafka,
changelog writes).

Where the worker's own CPU goes: ``--py-spy FILE`` samples the worker with py-spy from its
first commit to the end of the drain and prints the share of the samples per part of the
work (`PROFILE_PARTS`), in microseconds of the drain's CPU per event (docs/processors.md,
"Where the microseconds go per event").

Usage: python bench/processors.py [--bootstrap HOST:PORT] [--runs 200] [--steps 60]
       [--py-spy FILE] [--worker-log FILE] [--no-peers]
"""

from __future__ import annotations

import sys

# Run as a script, this file's directory comes first on sys.path and its name would
# shadow the `processors` package it measures.
if sys.path and sys.path[0] == __import__("os").path.dirname(__file__):
    sys.path.pop(0)

import argparse
import asyncio
import importlib.util
import json
import operator
import os
import random
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, NamedTuple

import aiokafka
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from runwatch.admin import create_catalogue
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.fleet import committed_offsets
from runwatch.processors.pipeline import fold_batch
from runwatch.processors.settings import BATCH_MAX
from runwatch.procs import ManagedProcess, exit_on_sigterm
from runwatch.schemas.codec import decode, encode, encode_key
from runwatch.schemas.events import AnomalyDetected, Heartbeat, RunStarted, StepCompleted
from runwatch.schemas.records import RawRecord, split
from runwatch.schemas.topics import names

WORLD = 8


def backlog(runs: int, steps: int) -> list[tuple[str, bytes, bytes]]:
    """(topic role, key, value) for every event of the throughput phase, in emit order."""
    rng = random.Random(0)
    out: list[tuple[str, bytes, bytes]] = []
    t0 = time.time_ns()
    for r in range(runs):
        run = f"bench-{r:04d}"
        started = encode(RunStarted(run_id=run, ts_ns=t0, world_size=WORLD))
        out += [("steps", encode_key(run), started), ("heartbeats", encode_key(run), started)]
    for s in range(1, steps + 1):
        for r in range(runs):
            run = f"bench-{r:04d}"
            ts = t0 + s * 50_000_000
            loss = 4.0 - 0.01 * s + rng.gauss(0, 0.02)
            step = StepCompleted(
                run_id=run,
                ts_ns=ts,
                seq=s,
                step=s,
                loss=loss,
                step_time_s=0.05,
                grad_norm=1.0 + rng.gauss(0, 0.01),
                tokens=4096,
            )
            out.append(("steps", encode_key(run), encode(step)))
            for rank in range(WORLD):
                hb = Heartbeat(run_id=run, ts_ns=ts, seq=s, rank=rank, step=s, step_time_s=0.05)
                out.append(("heartbeats", encode_key(run), encode(hb)))
    return out


def produce(bootstrap: str, prefix: str, events: list[tuple[str, bytes, bytes]]) -> float:
    topics = names(prefix)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, batch_size=512 * 1024, acks=1
    )
    t = time.perf_counter()
    for role, key, value in events:
        producer.send(topics.of(role), key=key, value=value)
    producer.flush()
    producer.close()
    return time.perf_counter() - t


def start_worker(
    bootstrap: str,
    prefix: str,
    partitions: int,
    log: Path,
    app_id: str,
    batch_max: int | None,
) -> ManagedProcess:
    args = [
        "processors", "--bootstrap", bootstrap, "--prefix", prefix, "--app-id", app_id,
        "--partitions", str(partitions),
        *(["--batch-max", str(batch_max)] if batch_max is not None else []),
        "--set", "hang_timeout_s=3600", "--set", "dead_rank_timeout_s=3600",
    ]  # fmt: skip
    env = {
        **os.environ,
        "RUNWATCH_COMMAND_KEY": "bench-command-key-0123456789",
        "RUNWATCH_BATCH_STATS_S": str(STATS_S),  # its rounds' span: `drain_window`
    }
    return ManagedProcess.runwatch("processors", args, log, env=env)


STATS_S = 0.5
"""The worker's `RoundStats` interval: its lines stamp when its rounds began and ended."""


def stats_lines(log: Path) -> list[dict[str, Any]]:
    """The worker's `RoundStats` lines (``batch path stats: {json}``), in order."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if "batch path stats: " in line:
            out.append(json.loads(line.split("batch path stats: ", 1)[1]))
    return out


class DrainWindow(NamedTuple):
    """A drain by the workers' own clocks: when it ran and the CPU it took meanwhile."""

    start_s: float
    """When the first round of any worker began (epoch seconds)."""
    end_s: float
    """When the round that reached the backlog's last record ended (epoch seconds)."""
    cpu_s: float
    """The workers' CPU seconds over their rounds up to ``end_s``, every thread, summed."""
    main_cpu_s: float
    """Of which their main threads' (the event loop, the decode and the fold)."""


def drain_window(logs: Path | Sequence[Path], records: int) -> DrainWindow | None:
    """When the workers' first round began and the round that reached ``records`` ended.

    From the `RoundStats` lines of each worker's log (every input record is counted in one
    round, each round's end, records and CPU clocks listed in its line's ``rounds``), the
    rounds of all of them in the order they ended; None while they do not count ``records``
    yet: the line of the drain's last round comes at the next interval, after the offsets
    it committed may already have been seen. The end is that round's own, not its line's
    ``last_end``: a line also holds the rounds after the backlog's end, the first of them
    after an idle fetch wait of up to a second (a drain of the default backlog once read
    2.0 s that way; measured round by round, 0.9-1.0 s). The CPU is each worker's own
    clocks, from its first round's start to its last round up to that end, summed: a drain
    of 1-2 s spans only a few looks at ``/proc`` from outside, and interpolating between
    them misplaced CPU at both edges.
    """
    starts: dict[int, tuple[float, float, float]] = {}  # worker -> its first start and clocks
    ends: list[tuple[float, int, int, float, float]] = []  # (end, records, worker, clocks)
    for worker, log in enumerate([logs] if isinstance(logs, Path) else logs):
        lines = [s for s in stats_lines(log) if "first_start" in s]
        if lines:
            cpu0, main0 = lines[0]["first_start_cpu_s"]
            starts[worker] = (float(lines[0]["first_start"]), cpu0, main0)
        for line in lines:
            for end_s, count, cpu_s, main_s in line["rounds"]:
                ends.append((float(end_s), int(count), worker, cpu_s, main_s))
    ends.sort(key=operator.itemgetter(0))  # stable: one worker's rounds keep their order
    done = 0
    clocks: dict[int, tuple[float, float]] = {}  # worker -> its clocks at its latest round
    for end_s, count, worker, cpu_s, main_s in ends:
        done += count
        clocks[worker] = (cpu_s, main_s)
        if done >= records:
            return DrainWindow(
                min(start for start, _, _ in starts.values()),
                end_s,
                sum(cpu - starts[w][1] for w, (cpu, _) in clocks.items()),
                sum(main - starts[w][2] for w, (_, main) in clocks.items()),
            )
    return None


def wait_drain_window(
    logs: Path | Sequence[Path], records: int, timeout_s: float = 30.0
) -> DrainWindow:
    """`drain_window`, once the workers' stats lines count ``records`` (looks every 0.1 s).

    The line of the drain's last round comes at the next stats interval, after the offsets
    it committed may already have been seen.

    Raises:
        SystemExit: They did not count ``records`` within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while (window := drain_window(logs, records)) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"the workers' stats lines do not count {records} records: {logs}")
        time.sleep(0.1)  # the next stats line is written at the next interval
    return window


def committed_total(group: str, bootstrap: str, topics: set[str]) -> int:
    done = committed_offsets(bootstrap, group)
    return sum(n for (topic, _), n in done.items() if topic in topics and n > 0)


def end_total(consumer: KafkaConsumer, topics: list[str]) -> int:
    tps = [TopicPartition(t, p) for t in topics for p in consumer.partitions_for_topic(t) or ()]
    return sum(consumer.end_offsets(tps).values())


async def _ceiling(
    bootstrap: str,
    topics: list[str],
    partitions: list[tuple[str, int]],
    target: int,
    batch_max: int,
) -> float:
    consumer = aiokafka.AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, max_poll_records=batch_max
    )
    await consumer.start()
    try:
        tps = [aiokafka.TopicPartition(t, p) for t, p in partitions]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        cfg = DetectorConfig()
        role_of = {t: role for role, t in zip(("steps", "heartbeats"), topics, strict=True)}
        states: dict[str, dict[str, object]] = {role: {} for role in role_of.values()}
        done = 0
        t0, cpu0 = time.perf_counter(), time.process_time()
        while done < target:
            fetched = await consumer.getmany(timeout_ms=1000, max_records=batch_max)
            by_role: dict[str, list[RawRecord]] = {}
            for tp, recs in fetched.items():
                by_role.setdefault(role_of[tp.topic], []).extend(
                    RawRecord(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp or 0)
                    for r in recs
                )
                done += len(recs)
            for role, raws in by_role.items():
                good, _ = split(raws, role)
                known = states[role]
                res = fold_batch(role, good, known.get, lambda p: (), cfg)
                known.update(res.states)
        return done / (time.perf_counter() - t0), (time.process_time() - cpu0) / done
    finally:
        await consumer.stop()


def ceiling(bootstrap: str, prefix: str, batch_max: int = 5000) -> dict[str, float]:
    """The raw ceiling: aiokafka getmany + decode + fold_batch of the backlog, no faust."""
    topics = names(prefix)
    inputs = [topics.steps, topics.heartbeats]
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    target = end_total(consumer, inputs)
    parts = [(t, p) for t in inputs for p in sorted(consumer.partitions_for_topic(t) or ())]
    consumer.close()
    rate, cpu_s = asyncio.run(_ceiling(bootstrap, inputs, parts, target, batch_max))
    return {"ceiling_events_per_s": rate, "ceiling_cpu_us_per_event": 1e6 * cpu_s}


def throughput(
    bootstrap: str,
    prefix: str,
    partitions: int,
    worker_log: Path,
    stack: ExitStack,
    batch_max: int | None,
    py_spy: Path | None = None,
    app_id: str | None = None,
) -> tuple[dict[str, float], ManagedProcess]:
    """One worker of a new app id drains the backlog; returns its figures and the worker.

    ``app_id``: the worker's (default ``<prefix>-app``; a second drain of one backlog needs
    another). With ``py_spy``, the worker is sampled by ``py-spy record`` (raw collapsed stacks into
    that file) from its first commit to the end of the drain, so start-up is not counted.
    """
    topics = names(prefix)
    inputs = [topics.steps, topics.heartbeats]
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    target = end_total(consumer, inputs)
    app_id = app_id or f"{prefix}-app"
    worker = start_worker(bootstrap, prefix, partitions, worker_log, app_id, batch_max)
    stack.callback(worker.stop)  # also when the measurement fails
    spy: subprocess.Popen[bytes] | None = None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        done = committed_total(app_id, bootstrap, set(inputs))
        if done >= target:
            break
        if py_spy is not None and spy is None and done > 0:
            spy = start_py_spy(worker.proc.pid, py_spy)
        time.sleep(0.1)  # sampling interval of a measurement, not synchronisation
    else:
        raise SystemExit(f"worker did not drain the backlog; see {worker_log}")
    # The drain's last round may end after its commit was seen.
    window = wait_drain_window(worker_log, target)
    if spy is not None:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file when interrupted
        spy.wait(timeout=60)
    consumer.close()
    # From the start of its first round to the end of the round that reached the backlog's
    # end: what the quixstreams peer is timed over too (its first event to its last). The
    # commits lag the rounds (a checkpoint every 0.2 s, its offsets committed beside the
    # next rounds), so timing from the first commit left out the first rounds' work and
    # overstated a short drain's rate several-fold.
    drain_s = max(window.end_s - window.start_s, 1e-9)
    cpu_us = 1e6 * window.cpu_s / target
    figures = {
        "drain_s": drain_s,
        "events_per_s": target / drain_s,
        "cpu_us_per_event": cpu_us,
        "main_cpu_us_per_event": 1e6 * window.main_cpu_s / target,
    }
    return figures, worker


def start_py_spy(pid: int, out: Path, *, gil: bool = False) -> subprocess.Popen[bytes]:
    """``py-spy record`` of every thread of ``pid`` into ``out`` (raw collapsed stacks).

    With ``gil``, only the thread holding the GIL is sampled: where the Python threads'
    CPU goes, without the samples of a thread waiting for the GIL (which py-spy otherwise
    counts where the wait began: a socket write, the selector).
    """
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    argv = [exe, "record", "--pid", str(pid), "--rate", "250", "--format", "raw"]
    argv += ["--nonblocking", "--threads", *(["--gil"] if gil else []), "--output", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


PROFILE_PARTS: list[tuple[str, tuple[str, ...]]] = [
    # (part, frame substrings): a sample counts for the first part one of its frames names
    ("other threads (aiokafka consumer thread: fetch, record parsing)", ("_bootstrap (",)),
    # faust's ProducerBuffer sends the changelog records `Table.__setitem__` queued
    ("flush: state writes, changelog acks", ("write_unwritten", "write_states", "ProducerBuffer.")),
    ("flush: outputs acknowledged, ranges, commit", ("commit (", "outputs_acknowledged")),
    ("state encoding", ("encode_state", "state_codec.py")),
    ("decode and bounds checks", ("records.py", "split (")),
    ("the fold (reducers, carried states)", ("fold_batch", "fold_chunks", "processors/core/")),
    # the verdicts, commands and dead letters of a round (not any frame named *send)
    ("outputs handed to the producer", ("_Agent.send (", "finish (")),
    ("the clock's Ticks", ("clock (",)),
    ("the round: cursors, ranges, RawRecords", ("_round (", "__call__ (")),
    ("fetch hand-over (main thread)", ("getmany", "next_records", "_wait_next_records")),
    # produce and fetch requests built and written to their sockets (aiokafka's sender, fetcher)
    ("aiokafka requests (main thread: produce, fetch)", ("aiokafka/",)),
]


def profile_counts(raw: Path) -> dict[str, int]:
    """The worker's samples per part (`PROFILE_PARTS`; the rest is "other")."""
    counts: dict[str, int] = {}
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack.split(";")
        part = next(
            (name for name, keys in PROFILE_PARTS if any(k in f for f in frames for k in keys)),
            "other",
        )
        counts[part] = counts.get(part, 0) + int(n)
    return counts


def profile_split(raw: Path) -> dict[str, float]:
    """Share of the worker's samples per part (`PROFILE_PARTS`; the rest is "other")."""
    counts = profile_counts(raw)
    total = sum(counts.values())
    return {part: n / max(total, 1) for part, n in sorted(counts.items(), key=lambda kv: -kv[1])}


def latency(bootstrap: str, prefix: str, spikes: int) -> dict[str, float]:
    topics = names(prefix)
    reader = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="latest")
    tps = [
        TopicPartition(topics.anomalies, p) for p in reader.partitions_for_topic(topics.anomalies)
    ]
    reader.assign(tps)
    reader.seek_to_end(*tps)
    reader.poll(timeout_ms=100)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks=1)
    rng = random.Random(1)
    sent: dict[tuple[str, int], float] = {}
    seen: dict[tuple[str, int], float] = {}
    run_count = 20
    runs = [f"lat{r}-{uuid.uuid4().hex[:6]}" for r in range(run_count)]
    for run in runs:
        value = encode(RunStarted(run_id=run, ts_ns=time.time_ns(), world_size=1))
        producer.send(topics.steps, key=encode_key(run), value=value)
    producer.flush()
    total_steps = 20 * (spikes // run_count + 1)
    for step in range(1, total_steps + 1):
        for run in runs:
            spike = step > 20 and step % 20 == 0
            loss = 9.0 if spike else 3.0 + rng.gauss(0, 0.02)
            ev = StepCompleted(
                run_id=run, ts_ns=time.time_ns(), step=step, loss=loss, step_time_s=0.05
            )
            if spike:
                sent[(run, step)] = time.perf_counter()
            producer.send(topics.steps, key=encode_key(run), value=encode(ev))
        producer.flush()
        for records in reader.poll(timeout_ms=5).values():
            now = time.perf_counter()
            for rec in records:
                a = decode(rec.value)
                if isinstance(a, AnomalyDetected):
                    seen.setdefault((a.run_id, a.step), now)
        time.sleep(0.01)  # pacing the producer at ~100 steps/s per run, not synchronisation
    deadline = time.monotonic() + 30
    while len(seen.keys() & sent.keys()) < len(sent) and time.monotonic() < deadline:
        for records in reader.poll(timeout_ms=100).values():
            now = time.perf_counter()
            for rec in records:
                a = decode(rec.value)
                if isinstance(a, AnomalyDetected):
                    seen.setdefault((a.run_id, a.step), now)
    lat_ms = sorted((seen[k] - sent[k]) * 1000 for k in sent if k in seen)
    producer.close()
    reader.close()
    return {
        "spikes": len(sent),
        "detected": len(lat_ms),
        "p50_ms": statistics.median(lat_ms),
        "p99_ms": lat_ms[min(len(lat_ms) - 1, int(0.99 * len(lat_ms)))],
        "max_ms": lat_ms[-1],
    }


def breakdown(runs: int, steps: int) -> dict[str, float]:
    """Per-event cost of decode and fold in-process: the part of the worker that is ours."""
    events = backlog(runs, steps)
    raws = {
        role: [RawRecord(role, 0, i, k, v) for i, (r, k, v) in enumerate(events) if r == role]
        for role in ("steps", "heartbeats")
    }
    cfg = DetectorConfig()
    out: dict[str, float] = {}
    total = 0
    for role, recs in raws.items():
        t = time.perf_counter()
        good, _ = split(recs, role)
        t_dec = time.perf_counter() - t
        states: dict[str, object] = {}
        t = time.perf_counter()
        for i in range(0, len(good), 5000):
            res = fold_batch(role, good[i : i + 5000], states.get, lambda p: (), cfg)
            states.update(res.states)
        t_fold = time.perf_counter() - t
        out[f"{role}_decode_us"] = 1e6 * t_dec / len(recs)
        out[f"{role}_fold_us"] = 1e6 * t_fold / len(recs)
        total += len(recs)
    return out


RUNWATCH_OVER_QUIX_GOAL = 2.0
"""Issue 23's goal: runwatch's worker drains at least this many times quixstreams' events/s."""
CPU_US_PER_EVENT_GOAL = 3.0
"""Issue 23's goal: at most this much CPU per unpacked event in runwatch's worker."""


def _peers_module() -> Any:
    """bench/peers.py as a module: the peers and how they are run live there, once."""
    spec = importlib.util.spec_from_file_location(
        "bench_peers", Path(__file__).with_name("peers.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def peer_figures(bootstrap: str, prefix: str, events: int) -> dict[str, dict[str, float] | None]:
    """The peers of bench/peers.py draining this run's backlog, each in a process of its own.

    Returns:
        Per peer (quixstreams, confluent): its figures, or None when it is not installed.
    """
    peers = _peers_module()
    out: dict[str, dict[str, float] | None] = {}
    for name, _ in peers.PEERS:
        out[name] = (
            peers.run_peer(name, bootstrap, prefix, events) if peers.installed(name) else None
        )
    return out


def print_peers(tput: dict[str, float], peers: dict[str, dict[str, float] | None]) -> None:
    """The worker beside the peers on the same backlog, with issue 23's goals."""
    print(f"  {'contender':<34} {'events/s':>10} {'us CPU/event':>13}")
    rows = [("runwatch worker", tput["events_per_s"], tput["cpu_us_per_event"])]
    labels = {"quixstreams": "quixstreams app (same core job)",
              "confluent": "confluent-kafka read+decode ceiling"}  # fmt: skip
    for name, fig in peers.items():
        if fig is None:
            print(f"  {labels[name]:<34} not installed (pip install -e '.[peers]')")
            continue
        rows.append((labels[name], fig["events_per_s"], fig["cpu_us_per_event"]))
    for label, rate, cpu in rows:
        print(f"  {label:<34} {rate:>10,.0f} {cpu:>13.2f}")
    quix = peers.get("quixstreams")
    if quix is not None:
        ratio = tput["events_per_s"] / quix["events_per_s"]
        tput["over_quixstreams_events_per_s"] = ratio
        print(
            f"  runwatch / quixstreams events/s: {ratio:.2f} (goal >= {RUNWATCH_OVER_QUIX_GOAL:g})"
        )
    print(
        f"  runwatch CPU per event: {tput['cpu_us_per_event']:.2f} us "
        f"(goal <= {CPU_US_PER_EVENT_GOAL:g} us)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("RUNWATCH_BOOTSTRAP"))
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--spikes", type=int, default=200)
    parser.add_argument(
        "--batch-max",
        type=int,
        default=None,
        help="the worker's --batch-max, and the ceiling's records per getmany (default: "
        "the worker's, processors.settings.BATCH_MAX)",
    )
    parser.add_argument(
        "--worker-log",
        type=Path,
        default=None,
        help="keep the worker's log here (with RUNWATCH_BATCH_STATS_S=1 it holds the rounds' "
        "and flushes' timing lines)",
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        default=None,
        help="sample the worker's drain with py-spy into this file (raw collapsed stacks) "
        "and print the share of its samples per part of the work",
    )
    parser.add_argument(
        "--no-peers",
        action="store_true",
        help="skip the quixstreams app and the confluent-kafka ceiling (bench/peers.py) that "
        "otherwise drain the same backlog after the worker",
    )
    args = parser.parse_args()
    exit_on_sigterm()  # stop the children it started when it is stopped itself
    with ExitStack() as stack:
        bootstrap = args.bootstrap
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        if not bootstrap:
            from runwatch.broker import ephemeral_broker

            bootstrap = stack.enter_context(ephemeral_broker(tmp / "kafka")).bootstrap
        prefix = f"bench{uuid.uuid4().hex[:6]}"
        create_catalogue(bootstrap, prefix=prefix, partitions=args.partitions)
        events = backlog(args.runs, args.steps)
        tput: dict[str, float] = {
            "events": len(events),
            "produce_s": produce(bootstrap, prefix, events),
        }
        del events
        batch_max = args.batch_max or BATCH_MAX
        # The ceiling right before the worker: the box's load drifts over minutes.
        tput.update(ceiling(bootstrap, prefix, batch_max))
        figures, _ = throughput(
            bootstrap, prefix, args.partitions, args.worker_log or tmp / "worker.log", stack,
            args.batch_max, args.py_spy,
        )  # fmt: skip
        tput.update(figures)
        tput["batch_max"] = batch_max
        tput["ratio"] = tput["events_per_s"] / tput["ceiling_events_per_s"]
        tput["cpu_ratio"] = tput["ceiling_cpu_us_per_event"] / tput["cpu_us_per_event"]
        peers = {} if args.no_peers else peer_figures(bootstrap, prefix, int(tput["events"]))
        lat = latency(bootstrap, prefix, args.spikes)
    parts = breakdown(min(args.runs, 50), args.steps)
    print(
        f"throughput: {tput['events']} events ({args.runs} runs x {args.steps} steps x "
        f"(1 step + {WORLD} heartbeats)), one worker, {args.partitions} partitions"
    )
    print(
        f"  ceiling (aiokafka getmany + decode + fold_batch, no faust), just before: "
        f"{tput['ceiling_events_per_s']:,.0f} events/s, "
        f"{tput['ceiling_cpu_us_per_event']:.1f} us CPU per event"
    )
    print(
        f"  worker: sustained {tput['events_per_s']:,.0f} events/s "
        f"(drained in {tput['drain_s']:.1f} s), {tput['ratio']:.2f} of the ceiling "
        f"(goal >= 0.6); {tput['cpu_us_per_event']:.1f} us CPU per event, of which "
        f"{tput['main_cpu_us_per_event']:.1f} on its main thread (ceiling/worker "
        f"{tput['cpu_ratio']:.2f})"
    )
    print(
        f"latency: {lat['detected']}/{lat['spikes']} spikes, produce -> verdict readable: "
        f"p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms, max {lat['max_ms']:.1f} ms"
    )
    if args.py_spy is not None:
        split_ = profile_split(args.py_spy)
        tput["profile"] = split_  # type: ignore[assignment]
        cpu_us = tput["cpu_us_per_event"]
        print(f"worker drain, py-spy samples per part ({args.py_spy}), of {cpu_us:.1f} us:")
        for part, share in split_.items():
            print(f"  {part:<62} {100 * share:5.1f} %  {share * cpu_us:5.2f} us")
    if peers:
        print_peers(tput, peers)
    print("in-process cost per event (no Kafka, no faust):")
    for k, v in parts.items():
        print(f"  {k:<22} {v:6.2f} us")
    print(
        json.dumps(
            {
                "bench": "processors",
                **tput,
                **{f"latency_{k}": v for k, v in lat.items()},
                **parts,
                "peers": peers,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
