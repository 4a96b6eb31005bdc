"""The rank table: same verdicts as the frozen-tuple reducer, values that stay values, flat cost."""

from __future__ import annotations

import json
import random
import struct
import zlib
from typing import Any

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from runwatch.processors.core import straggler_buckets
from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.detectors import rank_scans
from runwatch.processors.core.ledger import ROW, pack_rows, unpack_rows
from runwatch.processors.core.liveness import LivenessEvent, LivenessState, fold_liveness
from runwatch.processors.core.rank_table import (
    SMALL,
    RankTable,
    TableData,
    _packed_wire,
    _plain_wire,
    pack_ints,
    unpack_ints,
)
from runwatch.processors.core.state_codec import decode_state, encode_state
from runwatch.schemas.codec import encode
from runwatch.schemas.events import Heartbeat, RunEnded, RunStarted, Tick
from tests.unit.core.factories import S, src
from tests.unit.core.interpreter import run_python
from tests.unit.core.reference import liveness as reference

CFG = with_overrides(
    DetectorConfig(),
    {
        "dead_rank_timeout_s": 20,
        "hang_timeout_s": 60,
        "startup_timeout_s": 100,
        "rank_heartbeat_threshold": 6,
        "straggler_steps": 3,
    },
)


def gang_log(seed: int, world: int, steps: int) -> list[LivenessEvent]:
    """A gang's heartbeats with what goes wrong in practice, mixed at random.

    Silent ranks (dead by steps and by time), slow ranks (stragglers), reordering across
    a step boundary, unmeasured step times, duplicates, ranks beyond the announced world,
    steps that go back, ticks with time jumps, RunEnded and new incarnations.
    """
    rng = random.Random(seed)
    events: list[LivenessEvent] = []
    if rng.random() < 0.9:
        events.append(RunStarted(run_id="r", ts_ns=0, world_size=rng.choice([world, 0])))
    silent = {r: (rng.randrange(steps), rng.randrange(steps)) for r in range(world)}
    slow = {r for r in range(world) if rng.random() < 0.2}
    t = S
    pending: list[Heartbeat] = []
    for n in range(1, steps + 1):
        t += int(rng.uniform(0.2, 2.5) * S)
        for r in range(world + (1 if rng.random() < 0.05 else 0)):
            lo, hi = silent.get(r, (0, 0))
            if lo <= n < lo + hi // 3 and rng.random() < 0.95:
                continue
            dt = rng.choice([0.0, 1.0]) if rng.random() < 0.1 else 1.0
            if r in slow and rng.random() < 0.9:
                dt *= 2.5
            step = n - 3 if rng.random() < 0.02 else n
            pending.append(
                Heartbeat(
                    run_id="r",
                    ts_ns=t + rng.randrange(S // 10),
                    rank=r,
                    step=step,
                    step_time_s=dt * (1 + rng.gauss(0, 0.02)),
                )
            )
        rng.shuffle(pending)
        keep = rng.randrange(len(pending) + 1) if rng.random() < 0.3 else 0
        events += pending[keep:]
        if rng.random() < 0.05 and events:
            events.append(rng.choice(events))  # a duplicate (new offset)
        pending = pending[:keep]
        if rng.random() < 0.08 and events:  # a Tick reaches only runs already known
            t += int(rng.uniform(10, 90) * S)
            events.append(Tick(run_id="*", ts_ns=t, partition=0))
        if rng.random() < 0.02:
            events.append(RunEnded(run_id="r", ts_ns=t, status="stopped"))
        if rng.random() < 0.03:
            events.append(RunStarted(run_id="r", ts_ns=t, world_size=world, incarnation=n % 4))
    events += pending
    return events


def views(state: Any) -> tuple[Any, ...]:
    """What a caller can read of a liveness state, for either implementation."""
    return (
        state.run_id,
        state.last_offset,
        state.incarnation,
        state.live,
        state.run_step,
        state.known_ranks,
        state.time_scan_after_ns,
        state.step_scan_at,
        state.raised,
        state.anomaly_counts,
        state.dead_ranks,
        state.straggler_ranks,
        state.live_ranks,
        tuple(state.rank_last_step(r) for r in range(20)),
    )


def fold_both(events: list[LivenessEvent], cut: int | None = None) -> list[Any]:
    new: LivenessState | None = None
    ref: Any = None
    out = []
    for i, event in enumerate(events):
        if i == cut and new is not None:
            new = decode_state("liveness", encode_state(new))  # type: ignore[assignment]
        new, got = fold_liveness(new, event, src(i), CFG)
        ref, want = reference.fold_liveness(ref, event, src(i), CFG)
        assert [encode(v) for v in got] == [encode(v) for v in want], f"event {i}: {event}"
        assert views(new) == views(ref), f"event {i}: {event}"
        out += got
    return out


@settings(max_examples=150, deadline=None)
@given(
    st.integers(0, 10**6),
    st.integers(1, 10),
    st.integers(1, 60),
    st.one_of(st.none(), st.integers(0, 400)),
)
def test_same_verdicts_and_views_as_the_frozen_tuple_reducer(
    seed: int, world: int, steps: int, cut: int | None
) -> None:
    fold_both(gang_log(seed, world, steps), cut)


def test_the_generated_logs_raise_every_liveness_verdict() -> None:
    kinds: set[str] = set()
    for seed in range(30):
        kinds |= {v.kind for v in fold_both(gang_log(seed, 6, 50))}
    assert kinds == {"dead_rank", "straggler", "hang"}


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 8), st.integers(2, 40), st.data())
def test_old_states_read_and_fold_as_they_were(
    seed: int, world: int, steps: int, data: st.DataObject
) -> None:
    """Folding on from any kept state, in any order, is folding a fresh copy of it."""
    events = gang_log(seed, world, steps)
    kept: list[tuple[LivenessState, bytes]] = []
    state: LivenessState | None = None
    for i, event in enumerate(events):
        state, _ = fold_liveness(state, event, src(i), CFG)
        kept.append((state, encode_state(state)))
    for _ in range(3):
        k = data.draw(st.integers(0, len(kept) - 1))
        old, raw = kept[k]
        assert encode_state(old) == raw, "a later fold changed what an old state reads"
        fresh = decode_state("liveness", raw)
        assert fresh == old
        branch, verdicts = old, []
        twin: Any = fresh
        twin_verdicts = []
        for i in range(k + 1, min(len(events), k + 30)):
            branch, v = fold_liveness(branch, events[i], src(i), CFG)
            twin, w = fold_liveness(twin, events[i], src(i), CFG)
            verdicts += v
            twin_verdicts += w
        assert [encode(v) for v in verdicts] == [encode(v) for v in twin_verdicts]
        assert encode_state(branch) == encode_state(twin)
    for state_k, raw in kept:
        assert encode_state(state_k) == raw


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-5, 300)),
        max_size=300,
    )
)
def test_packed_integers_round_trip_exactly(values: list[int]) -> None:
    packed = pack_ints(values)
    assert unpack_ints(packed) == values


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(-5, 300)),
        min_size=SMALL + 1,
        max_size=600,
    )
)
def test_packed_integers_read_both_ways_across_the_deflate_change(values: list[int]) -> None:
    """States stored before the run-length deflate (``zlib.compress(planes, 1)``) still
    unpack, and what is packed now inflates with plain ``zlib.decompress``, all an
    earlier reader does: a rolling upgrade or a downgrade reads every stored table."""
    base, dtype, packed = pack_ints(values)
    planes = zlib.decompress(packed)
    assert unpack_ints([base, dtype, zlib.compress(planes, 1)]) == values
    assert unpack_ints([base, dtype, packed]) == values


def _tables(max_ranks: int) -> st.SearchStrategy[TableData]:
    """Tables of up to ``max_ranks`` ranks, each container filled at random (some past
    `SMALL`, some empty), integers anywhere in int64 and beyond it."""
    ints = st.one_of(st.integers(-5, 300), st.integers(-(2**63), 2**64 - 1))
    ranks = st.integers(0, 2 * SMALL)
    floats = st.floats(allow_nan=True, allow_infinity=True)
    any_table = st.builds(
        TableData,
        st.lists(ints, max_size=max_ranks),
        st.lists(ints, max_size=max_ranks),
        st.dictionaries(ranks, st.none(), max_size=SMALL + 2),
        st.lists(st.dictionaries(ranks, floats, max_size=SMALL + 2), min_size=2, max_size=2),
        st.dictionaries(ranks, ints, max_size=SMALL + 2),
        st.dictionaries(ranks, st.none(), max_size=SMALL + 2),
    )
    healthy = st.builds(  # no dead rank, no straggler, no open bucket: most tables
        lambda steps, ts: TableData(steps, ts, {}, [{}, {}], {}, {}),
        st.lists(ints, max_size=max_ranks),
        st.lists(ints, max_size=max_ranks),
    )
    return st.one_of(any_table, healthy)


@settings(max_examples=300, deadline=None)
@given(_tables(SMALL + 3))
@example(TableData([1] * SMALL, [2] * (SMALL + 1), {}, [{}, {}], {}, {}))  # one array past
@example(TableData([1] * SMALL, [2] * SMALL, {}, [{}, {3: 0.5}], {}, dict.fromkeys(range(65))))
def test_a_small_tables_wire_form_is_the_packed_paths(data: TableData) -> None:
    """`to_wire`'s plain path (`_plain_wire`) gives exactly the values, and the bytes, of
    the general one (`_packed_wire`) whenever it answers; it declines any longer array."""
    plain = _plain_wire(data)
    packed = _packed_wire(data)
    lengths = [len(data.ts), len(data.dead), len(data.streaks), len(data.flagged)]
    if plain is None:
        assert max(*lengths, *map(len, data.buckets)) > SMALL
    else:
        assert plain == packed
        assert repr(plain) == repr(packed)  # NaN: the same float objects' order and values
        assert msgspec.msgpack.encode(plain) == msgspec.msgpack.encode(packed)
    assert repr(RankTable(data).to_wire()) == repr(packed)  # a root version holding it


def test_malformed_wire_tables_are_value_errors() -> None:
    with pytest.raises(ValueError):
        RankTable.from_wire([1, 2])
    with pytest.raises(ValueError):
        unpack_ints([0, "<f8", b""])


class Touches:
    """Per-rank touches: journal writes, ranks read by scans and bucket judgements.

    The scans and the judge are counted by patching their modules' functions, which a
    compiled group (`processors.core.native`) calls directly: `straggler_buckets` is in it,
    so the count is taken in an interpreter that runs the group pure (the same source).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        step_scan, time_scan = rank_scans.step_scan, rank_scans.time_scan
        judge = straggler_buckets._judge

        def counted_step(gang: Any, data: Any, *rest: Any) -> Any:
            self.count += len(data.steps)
            return step_scan(gang, data, *rest)

        def counted_time(gang: Any, data: Any, *rest: Any) -> Any:
            self.count += len(data.steps)
            return time_scan(gang, data, *rest)

        def counted_judge(data: Any, journal: Any, bucket: Any, *rest: Any) -> Any:
            self.count += len(bucket)
            return judge(data, journal, bucket, *rest)

        monkeypatch.setattr(rank_scans, "step_scan", counted_step)  # the scans' detector
        monkeypatch.setattr(rank_scans, "time_scan", counted_time)
        monkeypatch.setattr(straggler_buckets, "_judge", counted_judge)


def touches_per_heartbeat(world: int, monkeypatch: pytest.MonkeyPatch) -> float:
    """A gang with one straggler and one rank that dies, 12 steps; ticks in between."""
    rng = random.Random(world)
    touches = Touches(monkeypatch)
    state, _ = fold_liveness(None, RunStarted(run_id="r", ts_ns=0, world_size=world), src(0), CFG)
    offset, beats = 1, 0
    for n in range(1, 13):
        t = n * S
        for r in range(world):
            if r == 1 and n > 3:
                continue
            dt = 3.0 if r == 0 else 1.0 + rng.gauss(0, 0.01)
            event = Heartbeat(run_id="r", ts_ns=t + r, rank=r, step=n, step_time_s=dt)
            before = state.table
            state, _ = fold_liveness(state, event, src(offset), CFG)
            touches.count += before.undo_entries()  # the fold's journal entries
            offset, beats = offset + 1, beats + 1
        if n % 4 == 0:
            before = state.table
            state, _ = fold_liveness(
                state, Tick(run_id="*", ts_ns=t + 30 * S, partition=0), src(offset), CFG
            )
            touches.count += before.undo_entries()
            offset += 1
    assert state.dead_ranks == (1,) and state.straggler_ranks == (0,)
    return touches.count / beats


WORLDS = (8, 1024, 4096)


def touches_by_world() -> None:
    """Print `touches_per_heartbeat` of each of `WORLDS` as JSON (the pure interpreter's)."""
    from runwatch.processors.core import native

    assert all(state.startswith("pure") for state in native.ACTIVE.values()), native.ACTIVE
    with pytest.MonkeyPatch.context() as monkeypatch:
        print(json.dumps([touches_per_heartbeat(world, monkeypatch) for world in WORLDS]))


def test_per_heartbeat_work_does_not_grow_with_world_size() -> None:
    script = "from tests.unit.core.test_rank_table import touches_by_world; touches_by_world()"
    out = run_python(["-c", script], {"RUNWATCH_PURE_PYTHON": "1"})
    small, *larger = json.loads(out.splitlines()[-1])
    assert small > 1  # the counting reached the fold (a journal write a heartbeat at least)
    for world, large in zip(WORLDS[1:], larger, strict=True):
        assert large <= 1.5 * small, (world, large, small)
        assert large < 10


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=6, max_size=6
    ).flatmap(lambda row: st.lists(st.just(row), min_size=1, max_size=40)),
    st.lists(st.floats(allow_nan=True, width=64), min_size=0, max_size=240),
)
def test_packed_ledger_rows_are_bit_exact(repeated: list[list[float]], noise: list[float]) -> None:
    flat = [v for row in repeated for v in row] + noise[: len(noise) // ROW * ROW]
    got = unpack_rows(pack_rows(tuple(flat)))
    assert [struct_bits(v) for v in got] == [struct_bits(v) for v in flat]


def struct_bits(value: float) -> bytes:
    return struct.pack("<d", value)


def test_same_verdicts_as_the_frozen_tuple_reducer_at_a_large_world() -> None:
    kinds = {v.kind for seed in (1, 2) for v in fold_both(gang_log(seed, 300, 25))}
    assert kinds == {"dead_rank", "hang", "straggler"}
