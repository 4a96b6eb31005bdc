"""Per-run states are evicted after their retention, in log time, and a partition holds a
bounded number of runs (`processors.core.retention`)."""

from __future__ import annotations

import msgspec

from runwatch.controller.command_gate import OwnedGang, decide
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.replay import Record, Replayer
from runwatch.processors.core.retention import (
    ENDED_RETENTION_NS,
    HOUR_NS,
    MAX_RUNS_PER_PARTITION,
    POLICY_RETENTION_NS,
    SILENT_RETENTION_NS,
    STRAY_RETENTION_NS,
    SWEEP_EVERY_RECORDS,
    run_expired,
    sweep_due,
)
from runwatch.processors.core.state_codec import decode_state
from runwatch.processors.pipeline import fold_chunks
from runwatch.schemas.events import AnomalyDetected, CheckpointCommitted, Event, Provenance
from runwatch.schemas.records import Decoded
from runwatch.schemas.signing import CommandKey, sign
from runwatch.schemas.topics import StateKind, TopicRole
from tests.unit.core.factories import S, ended, hb, same, started, step, tick


def ckpt(run: str, n: int, ts_ns: int) -> CheckpointCommitted:
    return CheckpointCommitted(run_id=run, ts_ns=ts_ns, step=n, path=f"/c/{run}/{n}")


CFG = DetectorConfig()


def _records(events: list[Event], first: int = 0) -> list[Record]:
    return [
        (TopicRole.HEARTBEATS, Provenance(topic="t.hb", partition=0, offset=first + i), e)  # type: ignore[misc]
        for i, e in enumerate(events)
    ]


def test_an_ended_run_is_kept_a_day_then_evicted_and_a_late_record_starts_fresh() -> None:
    end_ns = 10 * S
    events: list[Event] = [
        started("done", world_size=2),
        hb(0, 1, 1 * S, run="done"),
        ended("done", ts_ns=end_ns),
        tick(end_ns + ENDED_RETENTION_NS),  # exactly a day: kept
    ]
    replayer = Replayer(CFG).feed(_records(events))
    assert "done" in replayer.liveness and replayer.evicted[StateKind.LIVENESS] == set()
    replayer.feed(_records([tick(end_ns + ENDED_RETENTION_NS + 1)], first=len(events)))
    assert "done" not in replayer.liveness
    assert replayer.evicted[StateKind.LIVENESS] == {"done"}
    assert "done" not in replayer.encoded[StateKind.LIVENESS]
    # a record of the run after its eviction starts a fresh state, as for a run never seen
    late = hb(0, 2, end_ns + ENDED_RETENTION_NS + 2 * S, run="done")
    replayer.feed(_records([late], first=len(events) + 1))
    state = replayer.liveness["done"]
    assert state.heartbeats == 1 and state.live
    assert replayer.evicted[StateKind.LIVENESS] == set()
    assert "done" in replayer.encoded[StateKind.LIVENESS]


def test_many_silent_runs_are_evicted_a_week_after_their_last_record() -> None:
    runs = [f"r{i}" for i in range(500)]
    events: list[Event] = [started(run, ts_ns=S, world_size=1) for run in runs]
    events += [hb(0, 1, 2 * S, run=run) for run in runs[:250]]
    events += [started("busy", ts_ns=S, world_size=1)]
    events += [hb(0, n, n * HOUR_NS, run="busy") for n in range(1, 24 * 7 + 2)]
    events.append(tick(2 * S + SILENT_RETENTION_NS + 1))
    replayer = Replayer(CFG).feed(_records(events))
    assert set(replayer.liveness) == {"busy"}  # the one run still reporting stays
    assert replayer.evicted[StateKind.LIVENESS] == set(runs)
    assert replayer.partition_runs[0] == {"busy"}


def test_live_and_chunked_folds_evict_alike() -> None:
    # The agents fold a round in chunks; a run evicted in one chunk is not loaded back
    # from the table in the next (it is deleted with the round's writes).
    end_ns = 5 * S
    earlier: list[Event] = [started("gone", world_size=1), ended("gone", ts_ns=end_ns)]
    stored = Replayer(CFG).feed(_records(earlier))
    table = {"gone": stored.liveness["gone"]}
    now: list[Event] = [
        tick(end_ns + ENDED_RETENTION_NS + 1),
        tick(end_ns + ENDED_RETENTION_NS + 2),
    ]
    items = [Decoded(source, event) for _, source, event in _records(now, first=10)]
    results = list(
        fold_chunks(
            TopicRole.HEARTBEATS, items, table.get, lambda _: list(table), CFG, chunk_events=1
        )
    )
    assert [sorted(r.evicted) for r in results] == [["gone"], ["gone"]]
    assert "gone" not in results[-1].states and "gone" not in results[-1].encoded


# --------------------------------------------------------------------------- every kind


def _on(
    role: TopicRole, events: list[Event], offsets: list[int], partition: int = 0
) -> list[Record]:
    topic = f"t.{role}"
    return [
        (role, Provenance(topic=topic, partition=partition, offset=o), e)  # type: ignore[misc]
        for o, e in zip(offsets, events, strict=True)
    ]


def test_the_retention_rules_in_order() -> None:
    day, hour, week = ENDED_RETENTION_NS, STRAY_RETENTION_NS, SILENT_RETENTION_NS
    # rule 1: an ended run goes a day after its end, announced or not
    assert not run_expired(ended=True, announced=True, last_ns=0, now_ns=day)
    assert run_expired(ended=True, announced=False, last_ns=0, now_ns=day + 1)
    # rule 2: a run never announced goes an hour after its last record
    assert not run_expired(ended=False, announced=False, last_ns=0, now_ns=hour)
    assert run_expired(ended=False, announced=False, last_ns=0, now_ns=hour + 1)
    # rules 3 and 4: an announced live run stays a week, then goes
    assert not run_expired(ended=False, announced=True, last_ns=5, now_ns=week + 5)
    assert run_expired(ended=False, announced=True, last_ns=5, now_ns=week + 6)


def test_sweeps_fall_on_fixed_offsets_of_the_log() -> None:
    at = SWEEP_EVERY_RECORDS
    assert sweep_due(Provenance(topic="t", partition=3, offset=0))
    assert sweep_due(Provenance(topic="t", partition=3, offset=2 * at))
    assert sweep_due(Provenance(topic="t", partition=3, offset=at, index=0))
    assert not sweep_due(Provenance(topic="t", partition=3, offset=at, index=1))
    assert not sweep_due(Provenance(topic="t", partition=3, offset=at + 1))


def test_ended_steps_and_checkpoints_states_go_a_day_after_the_end_at_a_sweep() -> None:
    end_ns = 100 * S
    late = end_ns + ENDED_RETENTION_NS + 1
    replayer = Replayer(CFG)
    replayer.feed(
        _on(TopicRole.STEPS, [started("done", ts_ns=S), step(1, 2.0, run="done", ts_ns=2 * S),
                              ended("done", ts_ns=end_ns)], [1, 2, 3])
        + _on(TopicRole.CHECKPOINTS, [started("done", ts_ns=S), ckpt("done", 1, 2 * S),
                                      ended("done", ts_ns=end_ns)], [1, 2, 3])
    )  # fmt: skip
    # a record at a day exactly (a sweep) keeps it; one past the day but not a sweep too
    replayer.feed(_on(TopicRole.STEPS, [step(1, 2.0, run="x", ts_ns=end_ns + ENDED_RETENTION_NS)],
                      [SWEEP_EVERY_RECORDS]))  # fmt: skip
    replayer.feed(_on(TopicRole.STEPS, [step(2, 2.0, run="x", ts_ns=late)], [1500]))
    assert "done" in replayer.steps and replayer.evicted[StateKind.STEPS] == set()
    # the next sweep record of each partition, past the day, evicts it
    replayer.feed(
        _on(TopicRole.STEPS, [step(3, 2.0, run="x", ts_ns=late)], [2 * SWEEP_EVERY_RECORDS])
        + _on(TopicRole.CHECKPOINTS, [ckpt("y", 1, late)], [SWEEP_EVERY_RECORDS])
    )
    assert "done" not in replayer.steps and "done" not in replayer.checkpoints
    assert replayer.evicted[StateKind.STEPS] == {"done"}
    assert replayer.evicted[StateKind.CHECKPOINTS] == {"done"}
    assert "done" not in replayer.encoded[StateKind.STEPS]
    assert replayer.members[StateKind.STEPS][0] == {"x"}


def test_a_stray_run_goes_an_hour_after_its_last_record_an_announced_one_stays() -> None:
    stray = [step(1, 2.0, run="stray", ts_ns=S)]
    real = [started("real", ts_ns=S), step(1, 2.0, run="real", ts_ns=S)]
    sweep = step(1, 2.0, run="z", ts_ns=S + STRAY_RETENTION_NS + 1)
    replayer = Replayer(CFG).feed(
        _on(TopicRole.STEPS, [*stray, *real, sweep], [1, 2, 3, SWEEP_EVERY_RECORDS])
    )
    assert set(replayer.steps) == {"real", "z"}
    assert replayer.evicted[StateKind.STEPS] == {"stray"}


def test_a_policy_state_goes_a_day_after_its_last_anomaly_a_replayed_verdict_stays_refused() -> (
    None
):
    verdict = AnomalyDetected(
        run_id="p", ts_ns=S, seq=0, verdict_id="v1", kind="dead_rank", step=5, incarnation=0
    )
    replayer = Replayer(CFG).feed(_on(TopicRole.ANOMALIES, [verdict], [1]))
    first = replayer.commands[0]
    other = msgspec.structs.replace(verdict, run_id="q", verdict_id="v2")
    at_a_day = msgspec.structs.replace(other, ts_ns=S + POLICY_RETENTION_NS)
    replayer.feed(_on(TopicRole.ANOMALIES, [at_a_day], [SWEEP_EVERY_RECORDS]))
    assert "p" in replayer.policy  # a day exactly: kept
    later = msgspec.structs.replace(verdict, ts_ns=S + POLICY_RETENTION_NS + 1)
    sweep = msgspec.structs.replace(other, ts_ns=later.ts_ns)
    replayer.feed(_on(TopicRole.ANOMALIES, [sweep], [2 * SWEEP_EVERY_RECORDS]))
    assert replayer.evicted[StateKind.POLICY] == {"p"} and "p" not in replayer.policy
    replayer.feed(_on(TopicRole.ANOMALIES, [later], [2 * SWEEP_EVERY_RECORDS + 1]))
    assert replayer.evicted[StateKind.POLICY] == set()  # "p" is back, fresh
    assert replayer.policy["p"].last_offset == 2 * SWEEP_EVERY_RECORDS + 1
    # The verdict replayed into a fresh state makes the same command again: the controller
    # refuses it, by its id (command_gate rule 7) or its incarnation (rule 8).
    again = replayer.commands[-1]
    assert (again.run_id, again.command_id) == ("p", first.command_id)
    key = CommandKey.from_secret(b"k" * 32)
    gang = OwnedGang(run_id="p", incarnation=1, launch_offsets={})
    decision = decide(
        sign(again, key),
        Provenance(topic="c", partition=0, offset=9),
        gangs={"p": gang},
        keys={key.key_id: key},
        processed={first.command_id},
    )
    assert decision.verdict == "reject" and "replayed" in decision.reason


def test_a_full_partition_refuses_new_runs_and_never_evicts_held_ones() -> None:
    runs = [f"f{i:05d}" for i in range(MAX_RUNS_PER_PARTITION)]
    events: list[Event] = [started("real", ts_ns=S)]
    events += [step(1, 2.0, run=run, ts_ns=S) for run in runs[1:]]
    replayer = Replayer(CFG).feed(_on(TopicRole.STEPS, events, list(range(1, len(events) + 1))))
    assert len(replayer.steps) == MAX_RUNS_PER_PARTITION
    n = len(events) + 1
    # a new run id is refused with a dead letter; the held runs fold on
    replayer.feed(
        _on(TopicRole.STEPS, [step(1, 2.0, run="new", ts_ns=2 * S),
                              step(1, 2.0, run="real", ts_ns=2 * S)], [n, n + 1])
    )  # fmt: skip
    assert "new" not in replayer.steps and replayer.steps["real"].last_step == 1
    (dead,) = replayer.dead_letters
    assert dead.run_id == "new" and dead.stage == "fold" and "PartitionFull" in dead.reason
    assert "MAX_RUNS_PER_PARTITION" in dead.reason
    # another partition is not full
    replayer.feed(_on(TopicRole.STEPS, [step(1, 2.0, run="new", ts_ns=2 * S)], [1], partition=1))
    assert "new" in replayer.steps
    # once the strays expire (a sweep an hour on), new runs are admitted again
    sweep = step(2, 2.0, run="real", ts_ns=2 * S + STRAY_RETENTION_NS + 1)
    replayer.feed(_on(TopicRole.STEPS, [sweep], [2 * SWEEP_EVERY_RECORDS], partition=0))
    assert replayer.members[StateKind.STEPS][0] == {"real"}
    replayer.feed(
        _on(TopicRole.STEPS, [step(1, 2.0, run="new2", ts_ns=3 * S + STRAY_RETENTION_NS)],
            [2 * SWEEP_EVERY_RECORDS + 1])
    )  # fmt: skip
    assert "new2" in replayer.steps


def test_the_agents_chunked_fold_keeps_and_refuses_what_one_fold_does() -> None:
    # The worker folds a round in chunks, with states loaded from its table and written
    # back after the round: its sweeps and its cap must agree with the audit's one fold.
    runs = [f"f{i:05d}" for i in range(MAX_RUNS_PER_PARTITION + 10)]
    events: list[Event] = [step(1, 2.0, run=run, ts_ns=S) for run in runs]
    events.append(step(2, 2.0, run=runs[0], ts_ns=2 * S + STRAY_RETENTION_NS))
    events += [step(1, 2.0, run=f"g{i}", ts_ns=3 * S + STRAY_RETENTION_NS) for i in range(20)]
    offsets = list(range(1, len(events) + 1))
    offsets[len(runs)] = SWEEP_EVERY_RECORDS * 4  # the sweep after an hour
    for i in range(len(runs) + 1, len(events)):
        offsets[i] = SWEEP_EVERY_RECORDS * 4 + i
    records = _on(TopicRole.STEPS, events, offsets)
    whole = Replayer(CFG).feed(records)

    table: dict[str, bytes] = {}
    dead = []
    items = [Decoded(source, event) for _, source, event in records]
    for start in range(0, len(items), 700):  # rounds, each folded in chunks
        results = list(
            fold_chunks(
                TopicRole.STEPS, items[start : start + 700],
                lambda r: decode_state(StateKind.STEPS, table[r]) if r in table else None,
                lambda _: list(table), CFG, chunk_events=97,
            )
        )  # fmt: skip
        for result in results:
            dead += result.dead
        for run_id in results[-1].evicted:
            table.pop(run_id, None)
        table.update(results[-1].encoded)
    assert set(table) == set(whole.steps) == {runs[0], *(f"g{i}" for i in range(20))}
    assert [d.run_id for d in dead] == [d.run_id for d in whole.dead_letters] == runs[-10:]


def test_a_run_audited_alone_is_evicted_where_the_partitions_sweep_evicted_it() -> None:
    # `runwatch audit --run` reads one run's records and the Ticks, never the other runs'
    # records that sweep a steps partition: an expired state is also dropped at the run's
    # own next record, so both folds start the late record from a fresh state.
    end_ns = 10 * S
    late_ns = end_ns + ENDED_RETENTION_NS + 5 * S
    own = [started("r", ts_ns=S), step(1, 2.0, run="r", ts_ns=2 * S), ended("r", ts_ns=end_ns)]
    late = step(7, 3.0, run="r", ts_ns=late_ns)
    other = step(1, 2.0, run="o", ts_ns=late_ns - S)
    whole = Replayer(CFG).feed(
        _on(TopicRole.STEPS, [*own, other, late], [1, 2, 3, SWEEP_EVERY_RECORDS, 1100])
    )
    alone = Replayer(CFG).feed(_on(TopicRole.STEPS, [*own, late], [1, 2, 3, 1100]))
    assert same(whole.steps["r"], alone.steps["r"])
    assert alone.steps["r"].steps_observed == 1 and alone.steps["r"].info.world_size == 0
    assert whole.canonical_anomalies() == alone.canonical_anomalies()
