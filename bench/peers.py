"""runwatch's worker beside a peer and a ceiling, on one backlog, in one run (issue 23).

The same backlog (`bench/processors.py`'s: ``--runs`` runs x ``--steps`` steps, each step
one `StepCompleted` and 8 `Heartbeat`s, keyed by run id) is produced once into an embedded
broker, then drained, ``--rounds`` times in alternating order, by:

* **runwatch**: one ``runwatch processors`` worker of a new app id (every detector, states
  flushed to changelogs, verdicts published; exactly `bench/processors.py`'s throughput
  phase): events/s from its committed offsets, CPU from ``/proc``.
* **quixstreams**: a quixstreams application doing the core job a user would otherwise
  write: a robust z (median and MAD) on a 50-step loss window per run, and the last-seen
  step per rank of each run, in quixstreams' RocksDB state, at-least-once.
* **confluent-kafka ceiling**: librdkafka's consumer reading every record and decoding it
  with runwatch's msgspec codec, nothing else: what reading and decoding cost.

``bench/processors.py`` runs the two peers too (`run_peer`), once each, after its worker
on its own backlog. Each peer runs in its own process (``--peer``), so its CPU is its own;
rates are counted from its first event to its last (start-up and group joins are not).
Prints one table with the worst of the rounds per contender and their ratios, then one
JSON line.

Needs the peers installed (they are not runwatch dependencies)::

    .venv/bin/pip install -e '.[peers]'
    PYTHONPATH=$PWD .venv/bin/python bench/peers.py --runs 100 --steps 100 --rounds 2
"""

from __future__ import annotations

import sys

# Run as a script, this file's directory comes first on sys.path and its sibling
# bench/processors.py would shadow the `processors` package.
if sys.path and sys.path[0] == __import__("os").path.dirname(__file__):
    sys.path.pop(0)

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runwatch.schemas.codec import decode  # noqa: E402
from runwatch.schemas.events import Heartbeat, StepCompleted  # noqa: E402
from runwatch.schemas.topics import names  # noqa: E402

WINDOW = 50
"""Loss window of the peer's robust z (runwatch's default spike window)."""
MIN_WINDOW = 10
"""Losses a window holds before the peer judges one."""


def _bench_processors() -> Any:
    """bench/processors.py as a module (its name would shadow the `processors` package)."""
    spec = importlib.util.spec_from_file_location(
        "bench_processors", REPO / "bench" / "processors.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Clock:
    """Wall and CPU time over the events counted: from `start` (before the first event is
    worked on) to the last `tick` (after the last one was)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.first: tuple[float, float] | None = None
        self.last: tuple[float, float] = (0.0, 0.0)

    @staticmethod
    def _now() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def start(self) -> None:
        """Open the interval, if it is not open yet."""
        if self.first is None:
            self.first = self._now()

    def tick(self, n: int = 1) -> bool:
        """Count ``n`` events worked on; True once the target is reached."""
        self.count += n
        self.last = self._now()
        return self.count >= self.target

    def figures(self) -> dict[str, float]:
        """Events, events/s and CPU µs per event over the interval."""
        if self.first is None or self.count < self.target:
            raise SystemExit(f"counted {self.count} of {self.target} events")
        wall = max(self.last[0] - self.first[0], 1e-9)
        cpu = self.last[1] - self.first[1]
        return {
            "events": self.count,
            "events_per_s": self.count / wall,
            "cpu_us_per_event": 1e6 * cpu / self.count,
        }


# --------------------------------------------------------------------------- the peers


def confluent_ceiling(bootstrap: str, prefix: str, target: int) -> dict[str, float]:
    """librdkafka reads every record of the inputs; runwatch's codec decodes each."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    topics = names(prefix)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"ceiling-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 * 1024 * 1024,
        }
    )
    parts = []
    for topic in (topics.steps, topics.heartbeats):
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        parts += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
    consumer.assign(parts)
    clock = _Clock(target)
    try:
        while True:
            batch = consumer.consume(num_messages=10_000, timeout=1.0)
            good = [m for m in batch if m.error() is None]
            if good:
                clock.start()
            for message in good:
                decode(message.value())
            if good and clock.tick(len(good)):
                return clock.figures()
    finally:
        consumer.close()


def _robust_z(event: Any, state: Any) -> float | None:
    """The peer's spike check: |loss - median| / (1.4826 MAD) over the run's last 50 losses."""
    if not isinstance(event, StepCompleted) or event.loss is None:
        return None
    window: list[float] = state.get("losses", [])
    z = None
    if len(window) >= MIN_WINDOW:
        median = statistics.median(window)
        mad = statistics.median([abs(x - median) for x in window])
        z = abs(event.loss - median) / (1.4826 * mad) if mad > 0 else 0.0
    window.append(event.loss)
    state.set("losses", window[-WINDOW:])
    return z


def _last_seen(event: Any, state: Any) -> None:
    """The peer's liveness table: the last step each rank of the run reported."""
    if not isinstance(event, Heartbeat):
        return
    ranks: dict[str, int] = state.get("ranks", {})
    ranks[str(event.rank)] = event.step
    state.set("ranks", ranks)


def quixstreams_peer(bootstrap: str, prefix: str, target: int, state_dir: Path) -> dict[str, float]:
    """A quixstreams app doing runwatch's core job on the same backlog (module docstring)."""
    from quixstreams import Application
    from quixstreams.models.serializers import Deserializer

    class RunwatchEvents(Deserializer):  # type: ignore[misc]
        def __call__(self, value: bytes, ctx: Any) -> Any:
            return decode(value)

    topics = names(prefix)
    app = Application(
        broker_address=bootstrap,
        consumer_group=f"quix-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        processing_guarantee="at-least-once",
        state_dir=str(state_dir),
        loglevel="WARNING",
    )
    clock = _Clock(target)

    def begin(event: Any) -> Any:
        clock.start()
        return event

    def count(_: Any) -> None:
        if clock.tick():
            app.stop()

    for topic, fold in ((topics.steps, _robust_z), (topics.heartbeats, _last_seen)):
        source = app.topic(topic, key_deserializer="bytes", value_deserializer=RunwatchEvents())
        sdf = app.dataframe(source)
        sdf = sdf.apply(begin).apply(fold, stateful=True)
        sdf.update(count)
    app.run()
    return clock.figures()


def _peer_main(args: argparse.Namespace) -> int:
    if args.peer == "confluent":
        figures = confluent_ceiling(args.bootstrap, args.prefix, args.target)
    else:
        with tempfile.TemporaryDirectory(prefix="quix-state-") as state:
            figures = quixstreams_peer(args.bootstrap, args.prefix, args.target, Path(state))
    print(json.dumps(figures), flush=True)
    return 0


PEERS: tuple[tuple[str, str], ...] = (
    ("quixstreams", "quixstreams"),
    ("confluent", "confluent_kafka"),
)
"""Each peer (``--peer``) and the package it needs."""


def installed(peer: str) -> bool:
    """Whether ``peer``'s package is installed (``pip install -e '.[peers]'``)."""
    return importlib.util.find_spec(dict(PEERS)[peer]) is not None


def run_peer(peer: str, bootstrap: str, prefix: str, target: int) -> dict[str, float]:
    """Drain the backlog of ``prefix`` (``target`` events) with ``peer`` in a process of its own.

    Returns:
        Its events, events/s and CPU µs per event (`_Clock.figures`).
    """
    cmd = [sys.executable, __file__, "--peer", peer, "--bootstrap", bootstrap]
    cmd += ["--prefix", prefix, "--target", str(target)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{peer} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


# --------------------------------------------------------------------------- the run


def _runwatch(bp: Any, bootstrap: str, prefix: str, partitions: int, log: Path) -> dict[str, float]:
    """`bench/processors.py`'s throughput phase, with an app id of its own per round."""
    app_id = f"{prefix}-app-{uuid.uuid4().hex[:6]}"
    with ExitStack() as stack:
        figures, _ = bp.throughput(bootstrap, prefix, partitions, log, stack, None, app_id=app_id)
    return dict(figures)


def _worst(samples: list[dict[str, float]]) -> dict[str, float]:
    return {
        "events_per_s": min(s["events_per_s"] for s in samples),
        "cpu_us_per_event": max(s["cpu_us_per_event"] for s in samples),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2, help="each contender drains this often")
    parser.add_argument("--peer", choices=("quixstreams", "confluent"), help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--target", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        return _peer_main(args)

    from runwatch.broker import ephemeral_broker

    bp = _bench_processors()
    events = bp.backlog(args.runs, args.steps)
    with (
        tempfile.TemporaryDirectory(prefix="peers-") as tmp,
        ephemeral_broker(Path(tmp) / "kafka") as broker,
    ):
        prefix = f"peers{uuid.uuid4().hex[:6]}"
        bp.create_catalogue(broker.bootstrap, prefix=prefix, partitions=args.partitions)
        bp.produce(broker.bootstrap, prefix, events)
        target = len(events)
        contenders: dict[str, Callable[[int], dict[str, float]]] = {
            "runwatch": lambda i: _runwatch(
                bp, broker.bootstrap, prefix, args.partitions, Path(tmp) / f"worker{i}.log"
            ),
            "quixstreams": lambda i: run_peer("quixstreams", broker.bootstrap, prefix, target),
            "confluent": lambda i: run_peer("confluent", broker.bootstrap, prefix, target),
        }
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in contenders}
        order = list(contenders)
        for i in range(args.rounds):
            for name in order if i % 2 == 0 else reversed(order):
                samples[name].append(contenders[name](i))
                print(f"round {i + 1} {name}: {samples[name][-1]}", file=sys.stderr, flush=True)
    worst = {name: _worst(s) for name, s in samples.items()}
    rw, quix, ceiling = worst["runwatch"], worst["quixstreams"], worst["confluent"]
    print(f"{'contender':<12} {'events/s':>10} {'µs CPU/event':>13}   (worst of {args.rounds})")
    for name, w in worst.items():
        print(f"{name:<12} {w['events_per_s']:>10,.0f} {w['cpu_us_per_event']:>13.2f}")
    result = {
        "bench": "peers",
        "events": target,
        "runs": args.runs,
        "steps": args.steps,
        "rounds": args.rounds,
        "worst": worst,
        "runwatch_over_quixstreams_events_per_s": rw["events_per_s"] / quix["events_per_s"],
        "runwatch_over_ceiling_cpu": rw["cpu_us_per_event"] / ceiling["cpu_us_per_event"],
        "samples": samples,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
