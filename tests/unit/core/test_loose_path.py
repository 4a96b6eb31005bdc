"""The loose-record path (`Replayer._loose_heartbeat`, `Replayer._loose_step`) against
the general one (`Replayer._dispatch`).

A `Replayer` with ``loose_path=True`` folds a loose Heartbeat of the heartbeats role and a
loose StepCompleted of the steps role with `_dispatch` and `_apply`'s bookkeeping inline;
with ``loose_path=False`` every record goes through `_dispatch`. These tests hold the two
to the same states (`encode_state` bytes), verdicts (ids and order, and the Replayer's
sort keys), dead letters and their order, evictions and bookkeeping, after every batch,
on random logs of both roles fed in random batches: heartbeats, steps, Ticks, RunStarted
and RunEnded, RankExited, redeliveries, steps and heartbeats past their bounds, records
past a state's retention, and records at which a steps partition is swept.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from runwatch.processors.core.config import with_overrides
from runwatch.processors.core.replay import Record, Replayer
from runwatch.processors.core.retention import HOUR_NS, SWEEP_EVERY_RECORDS
from runwatch.processors.pipeline import fold_batch
from runwatch.schemas.codec import encode
from runwatch.schemas.events import Event, EventPack, Heartbeat, Provenance
from runwatch.schemas.records import Decoded
from runwatch.schemas.topics import TopicRole
from tests.unit.core import pack_logs
from tests.unit.core.factories import S, ended, hb, random_exit, same, started, step, tick
from tests.unit.core.replay_compare import batches, drift_clock, drift_step, fingerprint

CFG = with_overrides(
    pack_logs.CFG,  # the liveness thresholds of the pack path's tests, and short step windows
    {
        "loss_window": 8,
        "loss_min_periods": 4,
        "grad_window": 8,
        "grad_min_periods": 4,
        "loss_z_thresh": 4.0,
        "collapse_steps": 6,
        "restart_check_steps": 4,
        "history_steps": 16,
    },
)
RUNS = ("a", "b", "c")
ROLES = {"heartbeats": "runwatch.heartbeats", "steps": "runwatch.steps"}

MOST = 16
"""The most records of a random batch."""


class Log:
    """Where each run and partition stands, so random records are mostly plausible."""

    def __init__(self, rng: random.Random, runs: tuple[str, ...] = RUNS) -> None:
        self.rng = rng
        self.ts = S
        self.step = dict.fromkeys(runs, 1)
        self.world = {run: rng.randint(1, 5) for run in runs}
        self.offset = {(role, p): 0 for role in ROLES for p in (0, 1)}

    def clock(self) -> int:
        jumps_ns = (2 * HOUR_NS, 8 * 24 * HOUR_NS, 26 * HOUR_NS)
        self.ts = drift_clock(self.rng, self.ts, 0.09, jumps_ns)
        return max(self.ts, 0)

    def at(self, role: str, partition: int) -> Provenance:
        """The next position of ``role``'s partition (now and then a multiple of the sweep)."""
        offset = self.offset[role, partition]
        if self.rng.random() < 0.04:
            offset += SWEEP_EVERY_RECORDS - offset % SWEEP_EVERY_RECORDS
        self.offset[role, partition] = offset + 1
        return Provenance(topic=ROLES[role], partition=partition, offset=offset)

    def next_step(self, run: str) -> int:
        self.step[run], reported = drift_step(self.rng, self.step[run], 0.4, 0.08)
        return reported

    def heartbeat(self, run: str) -> Event:
        rank = self.rng.randrange(self.world[run] + 2)  # ranks past the table's width too
        dt = self.rng.choice((0.0, 0.25, 0.25, 0.26, 0.5, 1.0, float("nan")))
        return hb(rank, self.next_step(run), self.clock(), run=run, dt=dt)

    def step_completed(self, run: str) -> Event:
        rng = self.rng
        n = self.next_step(run)
        loss = rng.choice((2.0 + rng.gauss(0.0, 0.05), 2.0 + rng.gauss(0.0, 0.05), 9.0))
        if rng.random() < 0.03:
            loss = rng.choice((math.nan, math.inf))
        grad = rng.choice((None, 1.0 + rng.random() / 10, 40.0))
        restart = max(0, n - rng.randint(1, 5)) if rng.random() < 0.04 else None
        dt = rng.choice((0.25, 0.25, 0.26, 1.5))
        return step(
            n,
            loss,
            run=run,
            grad=grad,
            dt=dt,
            tokens=4096,
            restart_from=restart,
            ts_ns=self.clock(),
        )

    def other(self, run: str, role: str) -> Event:
        rng = self.rng
        r = rng.random()
        if r < 0.45:
            self.world[run] = rng.randint(1, 5)
            return started(run, self.clock(), world_size=self.world[run])
        if r < 0.7 or role == "steps":
            return ended(run, self.clock())
        return random_exit(rng, run, self.clock(), self.world[run])


def make_records(seed: int, length: int) -> list[Record]:
    """Random loose records of both roles, with Ticks, redeliveries and a few packs."""
    rng = random.Random(seed)
    log = Log(rng)
    records: list[Record] = []
    for _ in range(length):
        run = rng.choice(RUNS)
        role = rng.choice(tuple(ROLES))
        partition = RUNS.index(run) % 2  # one run, one partition
        r = rng.random()
        if r < 0.06 and records:  # a redelivery of an earlier record, at its offset
            records.append(rng.choice(records))
            continue
        if r < 0.7:
            event = log.heartbeat(run) if role == "heartbeats" else log.step_completed(run)
        elif r < 0.78 and role == "heartbeats":
            event = tick(log.clock(), partition)
            partition = rng.choice((partition, partition, 1 - partition))
        elif r < 0.82 and role == "heartbeats":
            beats = [log.heartbeat(run) for _ in range(rng.randint(1, 4))]
            event = EventPack(run_id=run, ts_ns=max(b.ts_ns for b in beats), events=tuple(beats))  # type: ignore[arg-type]
        else:
            event = log.other(run, role)
        records.append((role, log.at(role, partition), event))  # type: ignore[arg-type]
    return records


GANG = ("g0", "g1", "g2", "g3", "g4")
"""Runs of the interleaved logs: many in one partition, so that a batch queues several."""


def interleaved_records(seed: int, length: int) -> list[Record]:
    """Loose heartbeats of `GANG`'s runs in one partition, interleaved record by record.

    Each run starts announced; then mostly heartbeats (some past their bounds, some after
    a silence or a jump past a retention), now and then a Tick, a RunStarted, a RunEnded or
    a RankExited, and redeliveries: the loose path queues runs' heartbeats side by side and
    their verdicts and dead letters must come out in the records' order.
    """
    rng = random.Random(seed)
    log = Log(rng, GANG)
    records: list[Record] = []
    for run in GANG:
        event = started(run, log.clock(), world_size=log.world[run])
        records.append(("heartbeats", at_hb(len(records)), event))  # type: ignore[arg-type]
    for _ in range(length):
        run, r = rng.choice(GANG), rng.random()
        if r < 0.04:
            records.append(rng.choice(records))  # a redelivery, at its offset
            continue
        if r < 0.9:
            event = log.heartbeat(run)
        elif r < 0.95:
            event = tick(log.clock(), 0)
        else:
            event = log.other(run, "heartbeats")
        records.append(("heartbeats", at_hb(len(records)), event))  # type: ignore[arg-type]
    return records


def both_ways(
    feeds: list[list[Record]], evicted: set[str] | None = None
) -> tuple[Replayer, Replayer]:
    """Feed both ways, comparing after every batch (``evicted``: gets the kinds evicted)."""
    general, loose = Replayer(CFG, loose_path=False), Replayer(CFG, loose_path=True)
    for batch in feeds:
        general.feed(batch)
        loose.feed(batch)
        assert fingerprint(loose) == fingerprint(general)
        if evicted is not None:
            evicted |= {str(kind) for kind, runs in loose.evicted.items() if runs}
    return general, loose


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), length=st.integers(1, 160), split=st.integers(0, 1000))
def test_the_loose_path_folds_exactly_as_the_general_one(
    seed: int, length: int, split: int
) -> None:
    records = make_records(seed, length)
    general, loose = both_ways(batches(records, split, MOST))
    assert same(loose.result(), general.result())


def test_the_random_logs_reach_every_case_of_the_loose_path() -> None:
    """Verdicts of both reducers, fold dead letters of loose records of both roles,
    evictions of both kinds and sweeps: the comparison above is not vacuous."""
    kinds: set[str] = set()
    dead: set[str] = set()
    evicted: set[str] = set()
    for seed in range(40):
        _, loose = both_ways(batches(make_records(seed, 160), seed, MOST), evicted)
        kinds |= {v.kind for _, v in loose.recomputed}
        dead |= {d.source.topic for d in loose.dead_letters if d.source.index < 0}
    assert {"dead_rank", "hang", "straggler", "loss_spike"} <= kinds
    assert set(ROLES.values()) <= dead
    assert {"liveness", "steps"} <= evicted


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), length=st.integers(1, 300), split=st.integers(0, 1000))
def test_runs_queued_side_by_side_fold_exactly_as_the_general_path(
    seed: int, length: int, split: int
) -> None:
    general, loose = both_ways(batches(interleaved_records(seed, length), split, 4 * MOST))
    assert same(loose.result(), general.result())


def test_the_interleaved_logs_make_outputs_of_several_runs_in_one_batch() -> None:
    """Some batch's verdicts or dead letters come from runs whose records interleave
    (a run's, another's, the first's again): the order the queue must restore."""
    interleaved = 0
    for seed in range(20):
        replayer = Replayer(CFG)
        for batch in batches(interleaved_records(seed, 300), seed, 4 * MOST):
            marks = len(replayer.recomputed), len(replayer.dead_letters)
            replayer.feed(batch)
            made = [v.run_id for _, v in replayer.recomputed[marks[0] :]]
            made += [d.run_id for d in replayer.dead_letters[marks[1] :]]
            runs = [run for i, run in enumerate(made) if i == 0 or made[i - 1] != run]
            interleaved += len(runs) > len(set(runs))
    assert interleaved >= 3


def test_fold_batch_takes_the_switch_and_gives_the_same_batch() -> None:
    for role in ROLES:
        records = [r for r in make_records(11, 200) if r[0] == role]
        items = [Decoded(source, event) for _, source, event in records]  # type: ignore[arg-type]
        off, on = (
            fold_batch(role, items, lambda _: None, lambda _: (), CFG, loose_path=path)  # type: ignore[arg-type]
            for path in (False, True)
        )
        assert [encode(e) for e in on.outputs] == [encode(e) for e in off.outputs]
        assert [encode(d) for d in on.dead] == [encode(d) for d in off.dead]
        assert on.encoded == off.encoded and on.evicted == off.evicted
        assert on.encoded  # states were made


def test_a_healthy_gang_of_loose_heartbeats_folds_as_the_general_path() -> None:
    """8 ranks, a record each per step, one rank going silent: the general path's outcome
    (nearly every heartbeat takes the direct path: a known, live run, within retention)."""
    world, rng = 8, random.Random(3)
    records: list[Record] = [("heartbeats", at_hb(0), started(world_size=world))]
    for n in range(1, 60):
        for r in range(world):
            if n < 40 or r != 5:  # rank 5 goes silent: dead_rank
                dt = 0.25 + rng.random() / 100
                beat = hb(r, n, n * S + rng.randrange(S // 10), dt=dt)
                records.append(("heartbeats", at_hb(len(records)), beat))  # type: ignore[arg-type]
    _, loose = both_ways(batches(records, 1, MOST))
    assert [v.kind for _, v in loose.recomputed] == ["dead_rank"]
    assert loose.liveness["r"].heartbeats == len(records) - 1


def at_hb(offset: int) -> Provenance:
    return Provenance(topic=ROLES["heartbeats"], partition=0, offset=offset)


def heartbeat_batches(seed: int, length: int) -> list[list[Record]]:
    """Batches of `GANG`'s loose heartbeats, now and then another record among them or alone.

    What `Replayer.feed_columns` queues per run at once, and each case in which it must
    go record by record instead: a run's first heartbeat with no state yet, after its
    RunEnded, past a retention, or redelivered at or before the state's position; a later
    heartbeat of a run in the other partition (at a higher offset: the offsets of both
    partitions come from one counter) or redelivered in the same batch; and a Tick or
    another event among the heartbeats.
    """
    rng = random.Random(seed)
    log = Log(rng, GANG)
    offsets = itertools.count(1)
    seen: list[Record] = []

    def record(event: Event, partition: int) -> Record:
        source = Provenance(topic=ROLES["heartbeats"], partition=partition, offset=next(offsets))
        return ("heartbeats", source, event)  # type: ignore[return-value]

    out: list[list[Record]] = []
    for run in GANG[:-1]:  # the last run is new to the batch that first has it
        out.append([record(started(run, log.clock(), world_size=log.world[run]), 0)])
    while sum(map(len, out)) < length:
        if rng.random() < 0.08:  # a RunStarted, a RunEnded or a RankExited alone
            out.append([record(log.other(rng.choice(GANG), "heartbeats"), 0)])
            continue
        batch: list[Record] = []
        for _ in range(rng.randint(1, 24)):
            r, run = rng.random(), rng.choice(GANG)
            partition = GANG.index(run) % 2
            if r < 0.04 and (seen or batch):
                batch.append(rng.choice(seen + batch))  # a redelivery, at its position
            elif r < 0.05:
                batch.append(record(tick(log.clock(), partition), partition))
            elif r < 0.06:
                batch.append(record(log.other(run, "heartbeats"), partition))
            else:
                other = r > 0.97  # now and then in the other partition
                batch.append(record(log.heartbeat(run), 1 - partition if other else partition))
        seen += batch
        out.append(batch)
    return out


def three_ways(feeds: list[list[Record]]) -> tuple[Replayer, Counter[str]]:
    """Each batch fed to the general path, the loose path record by record, and the loose
    path as columns; all three compared after every batch. Returns the columns' replayer
    and how many batches of heartbeats only `_queue_batch` queued at once (``queued``) or
    left to go record by record (``each``)."""
    general, each, columns = (Replayer(CFG, loose_path=p) for p in (False, True, True))
    taken: Counter[str] = Counter()
    for batch in feeds:
        sources = [source for _, source, _ in batch]
        events = [event for _, _, event in batch]
        if all(type(e) is Heartbeat for e in events):
            queued = columns._queue_batch(sources, events)  # reads the states only
            taken["each" if queued is None else "queued"] += 1
        general.feed(batch)
        each.feed(batch)
        columns.feed_columns(TopicRole.HEARTBEATS, sources, events)
        assert fingerprint(columns) == fingerprint(each) == fingerprint(general)
    return columns, taken


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32), length=st.integers(1, 400))
def test_a_batch_of_loose_heartbeats_as_columns_folds_as_record_by_record(
    seed: int, length: int
) -> None:
    three_ways(heartbeat_batches(seed, length))  # compares after every batch


def test_the_heartbeat_batches_are_queued_at_once_and_record_by_record() -> None:
    """Both ways of `feed_columns` are taken, and the columns' folds made verdicts and
    dead letters: the comparison above is not vacuous."""
    taken: Counter[str] = Counter()
    kinds: set[str] = set()
    dead = 0
    for seed in range(30):
        columns, counts = three_ways(heartbeat_batches(seed, 400))
        taken += counts
        kinds |= {v.kind for _, v in columns.recomputed}
        dead += len(columns.dead_letters)
    assert taken["queued"] >= 100 and taken["each"] >= 100
    assert {"dead_rank", "straggler"} <= kinds
    assert dead > 0
