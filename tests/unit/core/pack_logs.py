"""Random heartbeats logs for the pack path's tests and `native_verdicts`.

Packs (pure and mixed, with duplicates inside), loose heartbeats, Ticks, run starts, ends
and exits, redeliveries at earlier offsets, clocks that go backwards or jump past
retention, steps past the bounds and ranks past the table's width: the cases
`processors.core.liveness_pack` either writes inline or hands to the shared fold.
"""

from __future__ import annotations

import random

from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.replay import Record
from runwatch.processors.core.retention import HOUR_NS
from runwatch.schemas.events import Event, EventPack, Heartbeat, Provenance
from tests.unit.core.factories import S, ended, hb, random_exit, started, tick
from tests.unit.core.replay_compare import drift_clock, drift_step

TOPIC = "runwatch.heartbeats"
CFG = with_overrides(
    DetectorConfig(),
    {
        "rank_heartbeat_threshold": 3,
        "dead_rank_timeout_s": 5.0,
        "hang_timeout_s": 8.0,
        "startup_timeout_s": 20.0,
        "straggler_ratio": 1.5,
        "straggler_steps": 2,
    },
)
RUNS = ("a", "b")

MOST = 12
"""The most records of a random batch."""


def at(offset: int, partition: int = 0) -> Provenance:
    return Provenance(topic=TOPIC, partition=partition, offset=offset)


def pack(events: list[Event]) -> EventPack:
    return EventPack(
        run_id=events[0].run_id,
        ts_ns=max(e.ts_ns for e in events),
        events=tuple(events),  # type: ignore[arg-type]
    )


class World:
    """Where each run stands, so random events are mostly plausible and sometimes not."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.ts = S
        self.step = {run: 1 for run in RUNS}
        self.world = {run: rng.randint(1, 6) for run in RUNS}

    def clock(self) -> int:
        self.ts = drift_clock(self.rng, self.ts, 0.08, (2 * HOUR_NS, 8 * 24 * HOUR_NS))
        return max(self.ts, 0)

    def heartbeat(self, run: str) -> Heartbeat:
        rng = self.rng
        self.step[run], step = drift_step(rng, self.step[run], 0.3, 0.1)
        rank = rng.randrange(self.world[run] + 3)  # ranks past the table's width too
        dt = rng.choice((0.0, 0.25, 0.25, 0.26, 0.5, 1.0, float("nan")))
        return hb(rank, step, self.clock(), run=run, dt=dt)

    def other(self, run: str) -> Event:
        rng = self.rng
        r = rng.random()
        if r < 0.4:
            thresholds = rng.choice(({}, {"rank_heartbeat_threshold": 2, "straggler_steps": 1}))
            self.world[run] = rng.randint(1, 6)
            return started(run, self.clock(), world_size=self.world[run], thresholds=thresholds)
        if r < 0.6:
            return ended(run, self.clock())
        return random_exit(rng, run, self.clock(), self.world[run])


def make_records(seed: int, length: int) -> list[Record]:
    """Random heartbeats records: packs (pure and mixed), loose events, ticks, redeliveries."""
    rng = random.Random(seed)
    world = World(rng)
    records: list[Record] = []
    offset = 0
    for _ in range(length):
        run = rng.choice(RUNS)
        r = rng.random()
        if r < 0.05 and records:  # a redelivery of an earlier record, at its offset
            records.append(rng.choice(records))
            continue
        if r < 0.55:
            events: list[Event] = [world.heartbeat(run) for _ in range(rng.randint(1, 12))]
            if rng.random() < 0.1:
                events.insert(rng.randrange(len(events) + 1), world.other(run))  # a mixed pack
            if rng.random() < 0.1:
                events.append(events[rng.randrange(len(events))])  # a duplicate inside
            event: Event = pack(events)
        elif r < 0.7:
            event = world.heartbeat(run)
        elif r < 0.85:
            event = tick(world.clock())
        else:
            event = world.other(run)
        records.append(("heartbeats", at(offset), event))  # type: ignore[arg-type]
        offset += 1
    return records
