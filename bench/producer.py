"""What RunEmitter costs a training loop, and how many events/s it delivers to a real broker.

Two measurements:

1. Calling-thread cost: ``RunEmitter.step`` (validation, event, encode, enqueue) and
   ``heartbeat`` timed one call at a time (perf_counter_ns around each call) over many
   calls, while the delivery thread ships the same events to a real broker, so the
   figures include contention for the GIL. Done twice: encoding on the calling thread
   (the default) and in the delivery thread.
2. Sustained delivery: N step events emitted as fast as the loop can, timed from the
   first call to the moment the broker has acknowledged the last one (``flush``), for a
   few kafka-python producer settings (linger_ms, batch_size, compression).

Figures on a shared 2-core machine swing by 2x between runs: compare settings within one
run, and prefer process CPU per event (less sensitive to other load) to events/s.

3. With ``--relay`` (only this): the training process's cost per heartbeat when its emitter
   hands records to a node relay (`controller.relay`, in a separate process as in
   ``runwatch launch --relay``) vs producing to Kafka itself: process CPU per event (emit
   loop + flush until acked), the calling thread's p99 and worst stall, and the relay
   process's own CPU per event.

Usage: python bench/producer.py [--bootstrap HOST:PORT] [--calls 200000] [--events 200000]
       python bench/producer.py --relay [--events 50000]
Without --bootstrap or RUNWATCH_BOOTSTRAP it starts the embedded broker in a temp dir.
Prints human-readable figures, then one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kafka
from kafka import codec

from runwatch.admin import create_catalogue
from runwatch.procs import exit_on_sigterm
from runwatch.producers import RunEmitter
from runwatch.producers.emitter import PRODUCER_DEFAULTS


@contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    from runwatch.broker import ephemeral_broker

    with (
        tempfile.TemporaryDirectory(prefix="runwatch-bench-") as tmp,
        ephemeral_broker(Path(tmp) / "broker") as info,
    ):
        yield info.bootstrap


def percentiles_us(samples_ns: list[int]) -> dict[str, float]:
    ordered = sorted(samples_ns)
    n = len(ordered)

    def at(q: float) -> float:
        return round(ordered[min(n - 1, int(q * n))] / 1000, 3)

    return {
        "median_us": at(0.5),
        "p90_us": at(0.9),
        "p99_us": at(0.99),
        "p999_us": at(0.999),
        "max_us": round(ordered[-1] / 1000, 1),
        "mean_us": round(statistics.fmean(ordered) / 1000, 3),
    }


def timer_overhead_ns(n: int = 200_000) -> int:
    pc = time.perf_counter_ns
    samples = []
    for _ in range(n):
        t0 = pc()
        samples.append(pc() - t0)
    return sorted(samples)[n // 2]


def time_calls(call: Callable[[int], None], n: int) -> list[int]:
    pc = time.perf_counter_ns
    samples = [0] * n
    for i in range(n):
        t0 = pc()
        call(i)
        samples[i] = pc() - t0
    return samples


def calling_thread_cost(bootstrap: str, prefix: str, calls: int) -> dict[str, Any]:
    """Time step() and heartbeat() one call at a time, for both places encoding can happen.

    The two emitters run side by side and the modes take turns in blocks of calls, so
    whatever else the machine does affects both alike.
    """
    emitters = {}
    for mode, on_caller in (("thread_encodes", False), ("caller_encodes", True)):
        em = RunEmitter(
            f"bench-cost-{mode}-{uuid.uuid4().hex[:6]}",
            bootstrap=bootstrap,
            topic_prefix=prefix,
            max_buffered=2 * calls + 20_000,
        )
        em._encode_on_caller = on_caller
        em.heartbeat(0)
        em.flush(30.0)  # connected, metadata known: measure the steady state
        emitters[mode] = em

    def step_call(em: RunEmitter) -> Callable[[int], None]:
        return lambda i: em.step(
            i, loss=3.14159, step_time_s=0.25, tokens=32768, grad_norm=0.9, lr=6e-4
        )

    def heartbeat_call(em: RunEmitter) -> Callable[[int], None]:
        return lambda i: em.heartbeat(i, step_time_s=0.25)

    samples: dict[str, dict[str, list[int]]] = {m: {"step": [], "heartbeat": []} for m in emitters}
    block = 10_000
    for em in emitters.values():  # warm-up
        time_calls(step_call(em), block)
        time_calls(heartbeat_call(em), block)
    for _ in range(max(1, calls // block)):
        for mode, em in emitters.items():
            samples[mode]["step"] += time_calls(step_call(em), block)
            samples[mode]["heartbeat"] += time_calls(heartbeat_call(em), block)
    result: dict[str, Any] = {}
    for mode, em in emitters.items():
        delivered_all = em.close(300.0)
        result[mode] = {
            "step": percentiles_us(samples[mode]["step"]),
            "heartbeat": percentiles_us(samples[mode]["heartbeat"]),
            "delivered_all": delivered_all,
            "dropped": em.stats.dropped,
        }
    return result


def sustained(bootstrap: str, prefix: str, events: int, config: dict[str, Any]) -> dict[str, Any]:
    em = RunEmitter(
        f"bench-rate-{uuid.uuid4().hex[:6]}",
        bootstrap=bootstrap,
        topic_prefix=prefix,
        max_buffered=events + 10,
        client_config=config,
    )
    em.heartbeat(0)
    em.flush(30.0)
    started = time.perf_counter()
    cpu_started = time.process_time()
    for i in range(events):
        em.step(i, loss=3.14159, step_time_s=0.25, tokens=32768, grad_norm=0.9, lr=6e-4)
    emitted_s = time.perf_counter() - started
    flushed = em.flush(300.0)
    elapsed_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    em.close(30.0)
    stats = em.stats
    return {
        "config": config,
        "events": events,
        "delivered_all": flushed and stats.delivered == events + 1,
        "emit_phase_s": round(emitted_s, 3),
        "total_s": round(elapsed_s, 3),
        "events_per_s": round(events / elapsed_s),
        "process_cpu_us_per_event": round(cpu_s / events * 1e6, 1),
    }


def raw_kafka_python(bootstrap: str, prefix: str, events: int) -> dict[str, Any]:
    """The ceiling: kafka-python alone sending pre-encoded records with the same settings."""
    from kafka import KafkaProducer

    from runwatch.schemas.codec import encode
    from runwatch.schemas.events import StepCompleted

    value = encode(
        StepCompleted(
            run_id="bench-raw",
            ts_ns=time.time_ns(),
            seq=1,
            step=1,
            loss=3.14159,
            step_time_s=0.25,
            tokens=32768,
            grad_norm=0.9,
            lr=6e-4,
        )
    )
    config = {k: v for k, v in PRODUCER_DEFAULTS.items() if k not in ("acks", "enable_idempotence")}
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", **config)
    topic = f"{prefix}.steps"
    producer.send(topic, value, key=b"bench-raw").get(30)
    started = time.perf_counter()
    cpu_started = time.process_time()
    for _ in range(events):
        producer.send(topic, value, key=b"bench-raw")
    producer.flush(300)
    elapsed_s = time.perf_counter() - started
    cpu_us = (time.process_time() - cpu_started) / events * 1e6
    producer.close(10)
    return {
        "events": events,
        "total_s": round(elapsed_s, 3),
        "events_per_s": round(events / elapsed_s),
        "process_cpu_us_per_event": round(cpu_us, 1),
    }


RELAY_CHILD = """
import sys
from pathlib import Path
from runwatch.controller.relay import RelayServer
relay = RelayServer(Path(sys.argv[1]), sys.argv[2], sys.argv[3], run_ids=[sys.argv[4]])
print("ready", flush=True)
sys.stdin.read()
relay.close()
"""


def cpu_ticks_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def relay_vs_direct(bootstrap: str, prefix: str, events: int) -> dict[str, Any]:
    """Heartbeats through a relay process vs straight to Kafka, in this (the training) process."""
    import subprocess

    out: dict[str, Any] = {}
    relay_run = f"bench-relay-{uuid.uuid4().hex[:6]}"  # the relay speaks for this run only
    with tempfile.TemporaryDirectory(prefix="runwatch-relay-bench-") as tmp:
        path = Path(tmp) / "relay.sock"
        child = subprocess.Popen(
            [sys.executable, "-c", RELAY_CHILD, str(path), bootstrap, prefix, relay_run],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[1],
        )
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
            for mode in ("direct", "relay"):
                em = RunEmitter(
                    relay_run if mode == "relay" else f"bench-{mode}-{uuid.uuid4().hex[:6]}",
                    bootstrap=bootstrap,
                    topic_prefix=prefix,
                    max_buffered=events + 10,
                    relay_socket=str(path) if mode == "relay" else None,
                )
                em.heartbeat(0)
                em.flush(30.0)
                gc.collect()
                relay_cpu = cpu_ticks_s(child.pid)
                cpu_started = time.process_time()
                started = time.perf_counter()
                samples = time_calls(lambda i, em=em: em.heartbeat(i, step_time_s=0.25), events)
                flushed = em.flush(300.0)
                elapsed_s = time.perf_counter() - started
                cpu_s = time.process_time() - cpu_started
                relay_cpu = cpu_ticks_s(child.pid) - relay_cpu
                em.close(30.0)
                out[mode] = {
                    "events": events,
                    "delivered_all": flushed and em.stats.delivered == events + 1,
                    "process_cpu_us_per_event": round(cpu_s / events * 1e6, 1),
                    "relay_process_cpu_us_per_event": (
                        round(relay_cpu / events * 1e6, 1) if mode == "relay" else 0.0
                    ),
                    "events_per_s": round(events / elapsed_s),
                    "heartbeat": percentiles_us(samples),
                }
        finally:
            if child.stdin is not None:
                child.stdin.close()
            child.wait(60)
    return out


def configs() -> list[dict[str, Any]]:
    none = {"compression_type": None}
    out: list[dict[str, Any]] = [
        {"linger_ms": 0, "batch_size": 16 * 1024, **none},  # kafka-python's own defaults
        {"linger_ms": 5, "batch_size": 256 * 1024, **none},
        {"linger_ms": 20, "batch_size": 1024 * 1024, **none},
        {"linger_ms": 5, "batch_size": 256 * 1024, "compression_type": "gzip"},  # the default
        {"linger_ms": 50, "batch_size": 1024 * 1024, "compression_type": "gzip"},
    ]
    if codec.has_lz4():
        out.append({"linger_ms": 5, "batch_size": 256 * 1024, "compression_type": "lz4"})
    if codec.has_zstd():
        out.append({"linger_ms": 5, "batch_size": 256 * 1024, "compression_type": "zstd"})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("RUNWATCH_BOOTSTRAP"))
    parser.add_argument("--calls", type=int, default=200_000, help="timed calls per method")
    parser.add_argument("--events", type=int, default=200_000, help="events per throughput run")
    parser.add_argument("--quick", action="store_true", help="20k calls and events, 2 configs")
    parser.add_argument(
        "--relay", action="store_true", help="only: heartbeats through a node relay vs direct"
    )
    args = parser.parse_args()
    exit_on_sigterm()  # stop the children it started when it is stopped itself
    if args.relay:
        with broker(args.bootstrap) as bootstrap:
            prefix = f"bench{uuid.uuid4().hex[:8]}"
            create_catalogue(bootstrap, prefix=prefix)
            result = relay_vs_direct(bootstrap, prefix, args.events)
            for mode, r in result.items():
                hb = r["heartbeat"]
                print(
                    f"{mode:7s} {r['process_cpu_us_per_event']:6.1f} us CPU/event in the "
                    f"training process (+{r['relay_process_cpu_us_per_event']:.1f} in the "
                    f"relay), heartbeat() p99 {hb['p99_us']:.1f} us, worst "
                    f"{hb['max_us'] / 1000:.1f} ms, {r['events_per_s']} events/s"
                    f"{'' if r['delivered_all'] else ', NOT ALL DELIVERED'}"
                )
            print(json.dumps({"bench": "producer-relay", "events": args.events, **result}))
        return 0
    calls, events = (20_000, 20_000) if args.quick else (args.calls, args.events)
    matrix = configs()[1::2] if args.quick else configs()

    with broker(args.bootstrap) as bootstrap:
        prefix = f"bench{uuid.uuid4().hex[:8]}"
        create_catalogue(bootstrap, prefix=prefix)
        overhead = timer_overhead_ns()
        print(
            f"broker {bootstrap}; python {platform.python_version()}, kafka-python "
            f"{kafka.__version__}; timer overhead {overhead} ns (included below)"
        )
        gc.collect()
        cost = calling_thread_cost(bootstrap, prefix, calls)
        print(f"\ncalling-thread cost over {calls} calls each (delivery running meanwhile):")
        for mode, result in cost.items():
            for method in ("step", "heartbeat"):
                r = result[method]
                print(
                    f"  {mode:15s} {method:9s} median {r['median_us']:6.2f} us  "
                    f"p99 {r['p99_us']:6.2f} us  p99.9 {r['p999_us']:7.2f} us  "
                    f"max {r['max_us']:8.1f} us"
                )
        print(f"\nsustained delivery of {events} step events (emit loop + flush until acked):")
        rates = []
        for config in matrix:
            result = sustained(bootstrap, prefix, events, {**config})
            rates.append(result)
            print(
                f"  {json.dumps(config):75s} {result['events_per_s']:>8d} events/s  "
                f"{result['process_cpu_us_per_event']:6.1f} us CPU/event  "
                f"(emit loop {result['emit_phase_s']:.2f} s, total {result['total_s']:.2f} s"
                f"{'' if result['delivered_all'] else ', NOT ALL DELIVERED'})"
            )
        raw = raw_kafka_python(bootstrap, prefix, events)
        print(
            f"  {'kafka-python alone, emitter defaults, pre-encoded':75s} "
            f"{raw['events_per_s']:>8d} events/s  "
            f"{raw['process_cpu_us_per_event']:6.1f} us CPU/event  (the ceiling)"
        )
        defaults = {
            k: PRODUCER_DEFAULTS[k] for k in ("linger_ms", "batch_size", "compression_type")
        }
        print(f"\nemitter defaults: {defaults}")
        print(
            json.dumps(
                {
                    "bench": "producer",
                    "bootstrap": bootstrap,
                    "timer_overhead_ns": overhead,
                    "calls": calls,
                    "calling_thread": cost,
                    "sustained": rates,
                    "kafka_python_alone": raw,
                    "defaults": defaults,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
