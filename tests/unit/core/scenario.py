"""Random multi-run logs with faults, laid out as topic records, for property tests."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from runwatch.processors.core.replay import Record
from runwatch.schemas.events import (
    AnomalyDetected,
    CheckpointCommitted,
    Event,
    Heartbeat,
    InputEvent,
    Provenance,
    RunEnded,
    RunStarted,
    StepCompleted,
    Tick,
)

S = 1_000_000_000
ROLES = ("steps", "heartbeats", "checkpoints")


@dataclass
class Log:
    """Per (role, partition) streams of events; offsets are assigned on layout."""

    streams: dict[tuple[str, int], list[Event]] = field(default_factory=dict)

    def add(self, role: str, partition: int, event: Event) -> None:
        self.streams.setdefault((role, partition), []).append(event)

    def records(self, interleave_seed: int) -> list[Record]:
        """Every stream in order, streams interleaved at random (seeded)."""
        rng = random.Random(interleave_seed)
        cursors = {key: 0 for key in self.streams}
        out: list[Record] = []
        keys = sorted(self.streams)
        while keys:
            key = rng.choice(keys)
            role, partition = key
            i = cursors[key]
            event = self.streams[key][i]
            topic = f"runwatch.{role}"
            out.append((role, Provenance(topic=topic, partition=partition, offset=i), event))  # type: ignore[arg-type]
            cursors[key] = i + 1
            if cursors[key] == len(self.streams[key]):
                keys.remove(key)
        return out


def _run(log: Log, rng: random.Random, run_id: str, partition: int, n_steps: int) -> None:
    world = rng.randint(1, 4)
    spike_at = rng.randint(15, n_steps) if rng.random() < 0.5 and n_steps > 15 else -1
    nan_at = rng.randint(2, n_steps) if rng.random() < 0.3 else -1
    dead_rank, dead_from = (
        (rng.randrange(world), rng.randint(5, n_steps)) if rng.random() < 0.4 else (-1, 0)
    )
    slow_rank = rng.randrange(world) if rng.random() < 0.3 else -1
    restart_at = rng.randint(30, n_steps) if rng.random() < 0.4 and n_steps >= 30 else -1
    restart_from = rng.randint(10, restart_at - 5) if restart_at > 0 else -1
    hang_after = rng.random() < 0.3
    t0 = rng.randint(0, 50) * S

    def start(ts: int, incarnation: int) -> None:
        ev = RunStarted(
            run_id=run_id,
            ts_ns=ts,
            world_size=world,
            vocab_size=rng.choice([None, 1000]),
            incarnation=incarnation,
        )
        for role in ROLES:
            log.add(role, partition, ev)

    start(t0, 0)
    t = t0
    incarnation = 0
    schedule = list(range(1, n_steps + 1))
    if restart_at > 0:
        schedule = list(range(1, restart_at + 1)) + list(range(restart_from + 1, n_steps + 1))
    seen_restart = False
    for i, n in enumerate(schedule):
        resumed = restart_at > 0 and i > 0 and n <= schedule[i - 1]
        if resumed and not seen_restart:
            seen_restart = True
            ended = RunEnded(run_id=run_id, ts_ns=t, status="stopped")
            for role in ROLES:
                log.add(role, partition, ended)
            t += 20 * S
            incarnation += 1
            start(t, incarnation)
        dt = 0.5 + rng.random() * 0.05
        t += int(dt * S)
        loss = 2.0 + math.exp(-n / 50) + rng.gauss(0, 0.02)
        if n == spike_at:
            loss += 5.0
        if n == nan_at:
            loss = math.nan
        log.add(
            "steps",
            partition,
            StepCompleted(
                run_id=run_id,
                ts_ns=t,
                step=n,
                loss=loss,
                step_time_s=dt,
                grad_norm=1.0 + rng.gauss(0, 0.05),
                tokens=4096,
                restart_from_step=restart_from if resumed else None,
            ),
        )
        for r in range(world):
            if r == dead_rank and n >= dead_from and not seen_restart:
                continue
            factor = 2.5 if r == slow_rank else 1.0
            log.add(
                "heartbeats",
                partition,
                Heartbeat(run_id=run_id, ts_ns=t + r, rank=r, step=n, step_time_s=dt * factor),
            )
        if n % 10 == 0:
            log.add(
                "checkpoints",
                partition,
                CheckpointCommitted(run_id=run_id, ts_ns=t, step=n, path=f"/ck/{run_id}/{n}"),
            )
    if not hang_after:
        ended = RunEnded(run_id=run_id, ts_ns=t + S, status="completed", final_step=schedule[-1])
        for role in ROLES:
            log.add(role, partition, ended)


def make_log(seed: int, runs: int = 2, partitions: int = 2, max_steps: int = 80) -> Log:
    """A log of ``runs`` runs over ``partitions`` partitions, with ticks, from a seed."""
    rng = random.Random(seed)
    log = Log()
    horizon = 0
    for k in range(runs):
        _run(log, rng, f"run-{k}", k % partitions, rng.randint(10, max_steps))
    for events in log.streams.values():
        horizon = max(horizon, max(e.ts_ns for e in events))
    # Ticks every 30 s of log time into each heartbeats partition, merged by timestamp.
    for p in range(partitions):
        key = ("heartbeats", p)
        stream = log.streams.get(key, [])
        ticks: list[Event] = [
            Tick(run_id="*", ts_ns=ts, partition=p) for ts in range(0, horizon + 2000 * S, 30 * S)
        ]
        merged = sorted(stream + ticks, key=lambda e: (e.ts_ns, isinstance(e, Tick)))
        log.streams[key] = merged
    return log


def with_recorded_anomalies(
    records: list[Record], anomalies: list[AnomalyDetected]
) -> list[Record]:
    """The records plus an anomalies topic holding ``anomalies`` in order (partition 0)."""
    extra: list[Record] = [
        ("anomalies", Provenance(topic="runwatch.anomalies", partition=0, offset=i), a)
        for i, a in enumerate(anomalies)
    ]
    return records + extra


__all__ = ["InputEvent", "Log", "make_log", "with_recorded_anomalies"]
