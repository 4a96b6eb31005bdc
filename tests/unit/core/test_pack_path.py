"""The heartbeat pack path (`processors.core.liveness_pack`) against the per-event path.

A `Replayer` with ``pack_path=True`` folds a heartbeats record that is a pack per record;
with ``pack_path=False`` every inner event goes through the per-event fold. These tests
hold the two to the same states (`encode_state` bytes), verdicts (ids and order, and the
Replayer's sort keys), dead letters and their order, evictions and bookkeeping, on random
logs of packs and loose events, fed in random batches.
"""

from __future__ import annotations

import importlib
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwatch.processors.core import config as config_module
from runwatch.processors.core import liveness
from runwatch.processors.core.bounds import MAX_STEP
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.liveness_pack import PLAIN_FOLDS, fold_heartbeat_pack
from runwatch.processors.core.replay import Record, Replayer
from runwatch.processors.core.state_codec import encode_state
from runwatch.processors.pipeline import fold_batch
from runwatch.schemas.codec import encode
from runwatch.schemas.events import Event, EventPack
from runwatch.schemas.records import Decoded
from tests.unit.core.factories import S, ended, hb, started
from tests.unit.core.pack_logs import CFG, MOST, at, make_records, pack
from tests.unit.core.replay_compare import batches, fingerprint


def both_ways(feeds: list[list[Record]], cfg: DetectorConfig = CFG) -> tuple[Replayer, Replayer]:
    off, on = Replayer(cfg, pack_path=False), Replayer(cfg, pack_path=True)
    for batch in feeds:
        off.feed(batch)
        on.feed(batch)
        assert fingerprint(on) == fingerprint(off)
    return off, on


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32), length=st.integers(1, 120), split=st.integers(0, 1000))
def test_the_pack_path_folds_exactly_as_event_by_event(seed: int, length: int, split: int) -> None:
    records = make_records(seed, length)
    off, on = both_ways(batches(records, split, MOST))
    assert on.result() == off.result()


def test_the_random_logs_reach_every_case_of_the_pack_path() -> None:
    """The generator makes verdicts, dead letters, evictions and mixed packs (not vacuous)."""
    kinds: set[str] = set()
    stages: set[str] = set()
    evicted = 0
    for seed in range(40):
        _, on = both_ways(batches(make_records(seed, 120), seed, MOST))
        kinds |= {v.kind for _, v in on.recomputed}
        stages |= {d.stage for d in on.dead_letters if d.source.index >= 0}
        evicted += sum(len(v) for v in on.evicted.values())
    assert {"dead_rank", "hang", "straggler"} <= kinds
    assert "fold" in stages
    assert evicted > 0


def test_a_healthy_gang_in_packs_goes_through_the_inline_case() -> None:
    """32 ranks a pack, every step, one rank going silent: the per-event outcome."""
    world = 32
    rng = random.Random(1)
    records: list[Record] = [("heartbeats", at(0), started(world_size=world))]  # type: ignore[list-item]
    for n in range(1, 40):
        beats = [hb(r, n, n * S + rng.randrange(S // 10), dt=0.25 + rng.random() / 100) for r in range(world)]  # fmt: skip
        if n >= 30:
            beats = [b for b in beats if b.rank != 7]  # rank 7 goes silent: dead_rank
        records.append(("heartbeats", at(n), pack(beats)))  # type: ignore[arg-type]
    _, on = both_ways([records[:10], records[10:]])
    assert [v.kind for _, v in on.recomputed] == ["dead_rank"]
    assert on.liveness["r"].heartbeats == 29 * world + 10 * (world - 1)


def test_a_failing_event_inside_a_pack_is_its_dead_letter_and_the_rest_goes_on() -> None:
    beats: list[Event] = [hb(r, 1, S + r) for r in range(4)]
    beats[2] = hb(2, MAX_STEP, S + 2)  # refused by the bounds
    records: list[Record] = [
        ("heartbeats", at(0), started(world_size=4)),  # type: ignore[list-item]
        ("heartbeats", at(1), pack(beats)),  # type: ignore[list-item]
    ]
    _, on = both_ways([records])
    (dead,) = on.dead_letters
    assert (dead.stage, dead.source.offset, dead.source.index) == ("fold", 1, 2)
    assert dead.payload == encode(beats[2])
    assert (on.liveness["r"].heartbeats, on.liveness["r"].last_index) == (3, 3)


def test_fold_batch_takes_the_switch_and_gives_the_same_batch() -> None:
    records = make_records(7, 80)
    items = [Decoded(source, event) for _, source, event in records]  # type: ignore[arg-type]
    results = [
        fold_batch("heartbeats", items, lambda _: None, lambda _: (), CFG, pack_path=path)
        for path in (False, True)
    ]
    off, on = results
    assert [encode(e) for e in on.outputs] == [encode(e) for e in off.outputs]
    assert [encode(d) for d in on.dead] == [encode(d) for d in off.dead]
    assert on.encoded == off.encoded and on.evicted == off.evicted


def test_the_registered_heartbeat_folds_are_the_ones_the_pack_path_knows() -> None:
    """A new heartbeat fold would send every heartbeat of a pack the slow way (still exact):
    teach `liveness_pack` its quiet case, then add it to `PLAIN_FOLDS`."""
    assert liveness.HEARTBEAT_FOLDS == PLAIN_FOLDS


def test_a_suspended_run_is_left_to_the_caller() -> None:
    state, _ = liveness.fold_liveness(None, started(world_size=2), at(0), CFG)
    state, _ = liveness.fold_liveness(state, ended(ts_ns=S), at(1), CFG)
    fold = fold_heartbeat_pack(state, pack([hb(0, 1, 2 * S)]), at(2), CFG)
    assert (fold.state, fold.stop) == (state, 0)


@pytest.mark.parametrize("cut", [0, 1, 3, 5])
def test_a_pack_redelivered_onto_a_state_inside_it_applies_only_the_rest(cut: int) -> None:
    beats: list[Event] = [hb(r % 3, 1 + r // 3, S + r) for r in range(6)]
    whole: list[Record] = [("heartbeats", at(0), started(world_size=3)), ("heartbeats", at(1), pack(beats))]  # type: ignore[list-item]  # fmt: skip
    prefix: list[Record] = [whole[0], ("heartbeats", at(1), pack(beats[: cut + 1]))]  # type: ignore[list-item]
    # the state holds events 0..cut of the pack; then the whole pack is redelivered
    _, on = both_ways([prefix, whole[1:]])
    assert on.liveness["r"].heartbeats == 6


def test_a_pack_whose_state_cannot_be_stored_is_refolded_event_by_event_both_ways(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`_flush` refolds a `PackSpan` event by event: the same encode dead letters."""
    monkeypatch.setattr(config_module, "RUN_THRESHOLD_BOUNDS", {})
    overflow = started(world_size=2, thresholds={"rank_heartbeat_threshold": 1e300})
    records: list[Record] = [
        ("heartbeats", at(0), overflow),  # type: ignore[list-item]
        ("heartbeats", at(1), pack([hb(r, 1, S + r) for r in range(2)])),  # type: ignore[list-item]
        ("heartbeats", at(2), pack([hb(r, 2, 2 * S + r) for r in range(2)])),  # type: ignore[list-item]
    ]
    _, on = both_ways([records[:1], records[1:]])
    assert [(d.stage, d.source.offset, d.source.index) for d in on.dead_letters] == [
        ("encode", 1, 0), ("encode", 1, 1), ("encode", 2, 0), ("encode", 2, 1)
    ]  # fmt: skip


def test_with_other_heartbeat_folds_every_heartbeat_of_a_pack_takes_the_shared_fold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A registry the pack path does not know (here: the same folds, wrapped) is still
    folded exactly: every heartbeat goes through `fold_heartbeat` (rule 6)."""
    calls = [0]

    def counted(fold: Any) -> Any:
        def wrapped(facts: Any) -> None:
            calls[0] += 1
            fold(facts)

        return wrapped

    monkeypatch.setattr(liveness, "HEARTBEAT_FOLDS", tuple(counted(f) for f in PLAIN_FOLDS))
    for seed in range(5):
        both_ways(batches(make_records(seed, 80), seed, MOST))
    assert calls[0] > 0


def test_a_pack_fold_leaves_its_input_state_reading_and_folding_as_before() -> None:
    """One `begin` and rollbacks inside a pack keep the rank table's ownership rule."""
    state, _ = liveness.fold_liveness(None, started(world_size=4), at(0), CFG)
    beats: list[Event] = [hb(r, 1, S + r, dt=0.25) for r in range(4)]
    state = fold_heartbeat_pack(state, pack(beats), at(1), CFG).state
    before = encode_state(state)
    later: list[Event] = [hb(r % 5, 2 + r // 5, 2 * S + r, dt=0.25) for r in range(12)]
    later[3] = hb(1, MAX_STEP, 2 * S + 3)  # a failure: its writes rolled back
    first = fold_heartbeat_pack(state, pack(later), at(2), CFG)
    assert encode_state(state) == before
    again = fold_heartbeat_pack(state, pack(later), at(2), CFG)
    assert encode_state(again.state) == encode_state(first.state)
    assert [i for i, _ in again.failures] == [3]


def test_a_pack_fold_that_raises_unforeseen_leaves_the_pack_to_the_per_event_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rule 4 of `Replayer._heartbeat_pack`: a pack fold that raises after writing to the
    rank table (a bug it did not foresee, not a bad event) costs the pack its fast path,
    never the partition: the events go one by one from the state as it was."""
    # The module (the package's `replay` attribute is the function of that name).
    replay = importlib.import_module("runwatch.processors.core.replay")

    def fails_after_writing(*args: Any) -> Any:
        replay_fold(*args)  # its writes go into the table's new version, then it fails
        raise RuntimeError("unforeseen")

    replay_fold = replay.fold_heartbeat_pack
    monkeypatch.setattr(replay, "fold_heartbeat_pack", fails_after_writing)
    records = make_records(11, 100)
    assert any(type(event) is EventPack for _, _, event in records)
    both_ways(batches(records, 3, MOST))
