"""Packed records in the shared fold: provenance per inner event, idempotence per position.

A pack's events are applied one by one at ``(offset, index)``; these tests hold the fold
(the one live agents, the audit and replay share) to: the same states and verdicts as the
events sent one per record, verdicts and dead letters that name the inner event, and no
double apply on any redelivery, whole or from a position inside a pack.
"""

from __future__ import annotations

import importlib
import math
import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwatch.processors.core import config as config_module
from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.liveness import fold_liveness
from runwatch.processors.core.replay import Record, Replayer, ReplayResult, replay, unpack
from runwatch.processors.core.state_codec import decode_state, encode_state
from runwatch.processors.pipeline import fold_batch
from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import (
    MAX_PACK_EVENTS,
    AnomalyDetected,
    Event,
    EventPack,
    Heartbeat,
    Provenance,
    StepCompleted,
)
from runwatch.schemas.records import Decoded, RawRecord, check, split
from tests.unit.core.factories import S, hb, lockstep, same, started, step, tick
from tests.unit.core.scenario import Log, make_log
from tests.unit.core.test_properties import CFG, fingerprint

replay_module = importlib.import_module("runwatch.processors.core.replay")
HB_TOPIC = "runwatch.heartbeats"
STEPS_TOPIC = "runwatch.steps"
LIVE_CFG = with_overrides(DetectorConfig(), {"rank_heartbeat_threshold": 3})


def at(offset: int, topic: str = HB_TOPIC, partition: int = 0) -> Provenance:
    return Provenance(topic=topic, partition=partition, offset=offset)


def pack(events: list[Heartbeat] | list[StepCompleted] | list[Event]) -> EventPack:
    return EventPack(
        run_id=events[0].run_id,
        ts_ns=max(e.ts_ns for e in events),
        events=tuple(events),  # type: ignore[arg-type]
    )


def one_per_record(events: list[Event], role: str, topic: str = HB_TOPIC) -> list[Record]:
    return [(role, at(i, topic), e) for i, e in enumerate(events)]  # type: ignore[misc]


def packed_records(
    events: list[Event], role: str, sizes: list[int], topic: str = HB_TOPIC
) -> list[Record]:
    """``events`` as records: the first alone (the RunStarted), then packs of ``sizes``."""
    out: list[Record] = [(role, at(0, topic), events[0])]  # type: ignore[list-item]
    rest, offset = events[1:], 1
    for size in sizes:
        chunk, rest = rest[:size], rest[size:]
        if chunk:
            out.append((role, at(offset, topic), pack(chunk)))
            offset += 1
    assert not rest
    return out


def about(verdicts: list[AnomalyDetected]) -> list[tuple[object, ...]]:
    """What a verdict says, without where it came from (provenance differs when packed)."""
    return [
        (v.run_id, v.kind, v.step, v.rank, v.verdict_id, v.ts_ns, v.value, v.detail)
        for v in verdicts
    ]


def without_position(state: object) -> bytes:
    return encode_state(msgspec.structs.replace(state, last_offset=0, last_index=-1))  # type: ignore[type-var]


# ----------------------------------------------------------------- unpack


def test_unpack_gives_each_inner_event_the_record_position_and_its_index() -> None:
    events = [hb(r, 1, r) for r in range(3)]
    assert list(unpack(at(9), events[0])) == [(at(9), events[0])]
    positions = [(s.offset, s.index, e) for s, e in unpack(at(9, partition=2), pack(events))]
    assert positions == [(9, 0, events[0]), (9, 1, events[1]), (9, 2, events[2])]


def test_intake_passes_a_pack_on_its_topic_whole_and_the_fold_unpacks_it() -> None:
    events = [hb(r, 1, S + r) for r in range(4)]
    value = encode(pack(events))
    record = RawRecord(HB_TOPIC, 2, 40, encode_key("r"), value, 1)
    decoded = check(record, "heartbeats")
    assert decoded == Decoded(Provenance(topic=HB_TOPIC, partition=2, offset=40), pack(events))
    assert check(record._replace(topic=STEPS_TOPIC), "steps").stage == "decode"  # type: ignore[union-attr]
    good, dead = split([record], "heartbeats")
    result = fold_batch("heartbeats", good, lambda _: None, lambda _: (), LIVE_CFG)
    assert not dead and result.states["r"].heartbeats == 4
    assert (result.states["r"].last_offset, result.states["r"].last_index) == (40, 3)


# ----------------------------------------------------------------- liveness


def gang_log(world: int = 4, steps: int = 12, dead: int = 2, dead_from: int = 5) -> list[Event]:
    """A gang whose rank ``dead`` stops reporting at step ``dead_from``."""
    events: list[Event] = [started(world_size=world)]
    for n in range(1, steps + 1):
        events += [hb(r, n, n * S + r) for r in range(world) if not (r == dead and n >= dead_from)]
    return events


def test_a_packed_gang_folds_to_the_states_and_verdicts_of_the_unpacked_one() -> None:
    events = gang_log()
    plain = replay(one_per_record(events, "heartbeats"), LIVE_CFG)
    packed = replay(packed_records(events, "heartbeats", [4, 4, 7, 1, 30]), LIVE_CFG)
    assert [v.kind for v in plain.anomalies] == ["dead_rank"]
    assert same(about(packed.anomalies), about(plain.anomalies))
    assert without_position(packed.liveness["r"]) == without_position(plain.liveness["r"])
    assert packed.liveness["r"].heartbeats == len(events) - 1


def test_a_dead_rank_verdict_from_a_pack_names_the_rank_and_the_inner_event() -> None:
    events = gang_log(dead=2, dead_from=5)
    records = packed_records(events, "heartbeats", [len(events) - 1])  # one pack of all
    (verdict,) = replay(records, LIVE_CFG).anomalies
    assert verdict.kind == "dead_rank" and verdict.rank == 2
    source = verdict.source
    assert source is not None and (source.offset, verdict.seq) == (1, 1)
    trigger = records[1][2].events[source.index]  # type: ignore[union-attr]
    # rank 2 last reported step 4; the first heartbeat of step 4 + 3 + 1 = 8 exposes it
    assert isinstance(trigger, Heartbeat) and (trigger.step, trigger.rank) == (8, 0)
    assert verdict.ts_ns == trigger.ts_ns


def test_redelivering_a_pack_applies_nothing_twice() -> None:
    events = gang_log()
    records = packed_records(events, "heartbeats", [9, 9, 9, 100])
    replayer = Replayer(LIVE_CFG).feed(records)
    before = fingerprint(replayer.result())
    for record in records[1:]:
        replayer.feed([record])  # every pack again, in any order
    replayer.feed(reversed(records))
    assert fingerprint(replayer.result()) == before


def test_a_pack_redelivered_onto_a_state_inside_it_applies_only_the_rest() -> None:
    # The app writes a pack's run state once per batch, so a state never stops inside a
    # pack; the fold is idempotent per (offset, index) all the same.
    events = gang_log()
    records = packed_records(events, "heartbeats", [len(events) - 1])
    whole = Replayer(LIVE_CFG).feed(records)
    inner = list(unpack(records[1][1], records[1][2]))
    for cut in (0, 1, 17, len(inner) - 1):
        state, _ = fold_liveness(None, events[0], at(0), LIVE_CFG)  # type: ignore[arg-type]
        early = []
        for source, event in inner[: cut + 1]:
            state, verdicts = fold_liveness(state, event, source, LIVE_CFG)  # type: ignore[arg-type]
            early += verdicts
        assert (state.last_offset, state.last_index) == (1, cut)
        rest = Replayer(LIVE_CFG)
        rest.liveness["r"] = state
        rest.feed(records)
        assert rest.liveness["r"] == whole.liveness["r"]
        assert early + rest.canonical_anomalies() == whole.canonical_anomalies()


def test_fold_batch_applies_a_pack_whole_and_a_retried_batch_changes_nothing() -> None:
    events = gang_log()
    records = packed_records(events, "heartbeats", [6, 6, 100])
    items = [Decoded(source, event) for _, source, event in records]
    table: dict[str, bytes] = {}

    def load(run: str) -> object:
        return decode_state("liveness", table[run]) if run in table else None

    first = fold_batch("heartbeats", items, load, lambda _: ["r"], LIVE_CFG)
    # one value per run: the state after the last event of the last pack, never a middle
    assert list(first.encoded) == ["r"]
    state = decode_state("liveness", first.encoded["r"])
    assert (state.last_offset, state.last_index) == (3, len(events) - 1 - 12 - 1)  # type: ignore[union-attr]
    # crash before the write: the batch comes again onto the old state, same result
    again = fold_batch("heartbeats", items, load, lambda _: ["r"], LIVE_CFG)
    assert again.encoded == first.encoded and again.outputs == first.outputs
    # crash after the write: the redelivered batch applies nothing, so writes nothing
    table.update(first.encoded)
    redelivered = fold_batch("heartbeats", items, load, lambda _: ["r"], LIVE_CFG)
    assert redelivered.outputs == [] and redelivered.encoded == {}
    assert redelivered.states["r"] is not None


def test_ticks_between_packs_age_a_run_seen_only_in_packs() -> None:
    events: list[Event] = [started(world_size=2), *lockstep(2, range(1, 4), dt_s=1.0)]
    records = packed_records(events, "heartbeats", [6])
    records += [("heartbeats", at(1 + i), tick(600 * i * S)) for i in range(1, 4)]
    (verdict,) = [v for v in replay(records, LIVE_CFG).anomalies if v.kind == "hang"]
    assert verdict.source is not None and verdict.source.index == -1  # a Tick's own record


# ----------------------------------------------------------------- steps


def test_step_verdicts_from_a_pack_carry_their_index_and_stay_distinct() -> None:
    losses = [2.0 + 0.01 * (i % 5) for i in range(1, 40)]
    losses[29], losses[34] = math.nan, 50.0
    events: list[Event] = [started()] + [step(i, loss) for i, loss in enumerate(losses, 1)]
    plain = replay(one_per_record(events, "steps", STEPS_TOPIC), CFG)
    packed = replay(packed_records(events, "steps", [13, 13, 13], STEPS_TOPIC), CFG)
    assert same(about(packed.anomalies), about(plain.anomalies))
    kinds = {(v.kind, v.step) for v in packed.anomalies}
    assert {("nonfinite_loss", 30), ("loss_spike", 35)} <= kinds
    for verdict in packed.anomalies:
        source = verdict.source
        assert source is not None and source.index >= 0
        assert 1 + 13 * (source.offset - 1) + source.index == verdict.step
    ids = [v.verdict_id for v in packed.anomalies]
    assert len(ids) == len(set(ids))


def test_a_failing_inner_event_is_its_own_dead_letter_naming_its_index(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = replay_module.fold_step

    def fragile(state, event, source, cfg):  # type: ignore[no-untyped-def]
        if isinstance(event, StepCompleted) and event.step == 7:
            raise ZeroDivisionError("boom")
        return real(state, event, source, cfg)

    monkeypatch.setattr(replay_module, "fold_step", fragile)
    events: list[Event] = [started()] + [step(i, 2.0) for i in range(1, 11)]
    result = replay(packed_records(events, "steps", [10], STEPS_TOPIC), CFG)
    (dead,) = result.dead_letters
    assert (dead.stage, dead.source.offset, dead.source.index) == ("fold", 1, 6)
    assert dead.payload == encode(events[7])  # the inner event, not the whole pack
    assert result.steps["r"].steps_observed == 9
    assert (result.steps["r"].last_offset, result.steps["r"].last_index) == (1, 9)


def test_a_pack_at_the_cap_folds() -> None:
    events: list[Event] = [started(world_size=MAX_PACK_EVENTS)]
    events += [hb(r, 1, S + r) for r in range(MAX_PACK_EVENTS)]
    result = replay(packed_records(events, "heartbeats", [MAX_PACK_EVENTS]), LIVE_CFG)
    assert result.liveness["r"].heartbeats == MAX_PACK_EVENTS
    assert result.liveness["r"].last_index == MAX_PACK_EVENTS - 1


# ----------------------------------------------------------------- property


PACKABLE = {"heartbeats": Heartbeat, "steps": StepCompleted}


def packed_log(log: Log, seed: int, max_pack: int) -> Log:
    """``log`` with each stream's consecutive packable events of one run cut into packs."""
    rng = random.Random(seed)
    out = Log()
    for (role, partition), events in log.streams.items():
        packable = PACKABLE.get(role)
        i = 0
        while i < len(events):
            event = events[i]
            if packable is None or type(event) is not packable:
                out.add(role, partition, event)
                i += 1
                continue
            size, j = rng.randint(1, max_pack), i
            while j < len(events) and j - i < size:
                if type(events[j]) is not packable or events[j].run_id != event.run_id:
                    break
                j += 1
            out.add(role, partition, pack(events[i:j]))
            i = j
    return out


def same_outcome(packed: ReplayResult, plain: ReplayResult) -> None:
    assert same(about(packed.anomalies), about(plain.anomalies))
    assert [c.command_id for c in packed.commands] == [c.command_id for c in plain.commands]
    assert len(packed.dead_letters) == len(plain.dead_letters)
    for table in ("steps", "liveness"):
        mine, theirs = getattr(packed, table), getattr(plain, table)
        assert mine.keys() == theirs.keys()
        for run in mine:
            assert without_position(mine[run]) == without_position(theirs[run]), (table, run)
    assert packed.checkpoints == plain.checkpoints


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    pack_seed=st.integers(0, 10_000),
    max_pack=st.integers(1, 40),
    interleave=st.integers(0, 3),
    cut=st.floats(0.0, 1.0),
)
def test_folding_packs_equals_folding_their_events_and_redelivery_changes_nothing(
    seed: int, pack_seed: int, max_pack: int, interleave: int, cut: float
) -> None:
    log = make_log(seed)
    packed = packed_log(log, pack_seed, max_pack)
    plain_records, packed_records_ = log.records(interleave), packed.records(interleave)
    assert len(packed_records_) < len(plain_records) or max_pack == 1
    plain, result = replay(plain_records, CFG), replay(packed_records_, CFG)
    same_outcome(result, plain)
    # a redelivered prefix (a crash at any point, any batch) changes nothing
    replayer = Replayer(CFG).feed(packed_records_)
    before = fingerprint(replayer.result())
    replayer.feed(packed_records_[: int(cut * len(packed_records_))])
    assert fingerprint(replayer.result()) == before


def test_a_pack_whose_state_cannot_be_stored_is_refolded_event_by_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The run's own threshold overflows the int64 of its liveness state at its first
    # heartbeat: every heartbeat is an "encode" dead letter. (`config.RUN_THRESHOLD_BOUNDS`
    # keeps every run from this; lifted here to make a real unstorable state.)
    monkeypatch.setattr(config_module, "RUN_THRESHOLD_BOUNDS", {})
    overflow = started(world_size=2, thresholds={"rank_heartbeat_threshold": 1e300})
    events: list[Event] = [overflow, *lockstep(2, range(1, 3))]
    plain = replay(one_per_record(events, "heartbeats"), LIVE_CFG)
    packed = replay(packed_records(events, "heartbeats", [4]), LIVE_CFG)
    assert [(d.stage, d.source.offset) for d in plain.dead_letters] == [
        ("encode", i) for i in range(1, 5)
    ]
    assert [(d.stage, d.source.offset, d.source.index) for d in packed.dead_letters] == [
        ("encode", 1, i) for i in range(4)
    ]
    assert [d.payload for d in packed.dead_letters] == [encode(e) for e in events[1:]]
    assert packed.liveness["r"] == plain.liveness["r"]  # the state from before the pack
    assert packed.anomalies == plain.anomalies == []
