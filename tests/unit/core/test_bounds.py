"""Absurd steps and incarnations are dead letters (`processors.core.bounds`).

Each record here is one a forger with a trainer's credential (or a processors' one, for the
anomalies) could write; the shared fold refuses it, the run's state stays as it was, and
the records after it are judged.
"""

from __future__ import annotations

from runwatch.processors.core.bounds import MAX_INCARNATION_JUMP, MAX_STEP, MAX_STEP_JUMP
from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.replay import Record, Replayer
from runwatch.schemas.codec import decode, encode
from runwatch.schemas.events import (
    AnomalyDetected,
    CheckpointCommitted,
    Event,
    Provenance,
    RestartRequested,
)
from runwatch.schemas.topics import TopicRole
from tests.unit.core.factories import S, hb, started, step

CFG = with_overrides(DetectorConfig(), {"rank_heartbeat_threshold": 10})


def _records(role: TopicRole, events: list[Event]) -> list[Record]:
    return [
        (role, Provenance(topic=f"t.{role}", partition=0, offset=i), e)  # type: ignore[misc]
        for i, e in enumerate(events)
    ]


def _reasons(replayer: Replayer) -> list[tuple[int, str]]:
    return [(d.source.offset, d.reason.split(":")[2].strip()) for d in replayer.dead_letters]


def test_a_heartbeat_far_ahead_of_the_run_is_a_dead_letter_and_kills_nobody() -> None:
    events: list[Event] = [started(world_size=2)]
    events += [hb(r, s, s * S) for s in range(1, 4) for r in (0, 1)]
    forged = hb(0, 3 + MAX_STEP_JUMP + 1, 4 * S)
    out = Replayer(CFG).feed(_records(TopicRole.HEARTBEATS, [*events, forged, hb(1, 4, 5 * S)]))
    assert _reasons(out) == [(7, "step_jump")]
    assert out.liveness["r"].run_step == 4  # the forged step never became the run's
    assert out.canonical_anomalies() == []
    # a jump within the bound is a step like any other
    near = Replayer(CFG).feed(_records(TopicRole.HEARTBEATS, [*events, hb(0, 3 + 20, 4 * S)]))
    assert near.dead_letters == [] and near.liveness["r"].run_step == 23


def test_a_step_past_2_to_the_53_is_a_dead_letter_even_as_a_run_s_first() -> None:
    beat = hb(0, MAX_STEP, 1 * S)
    out = Replayer(CFG).feed(_records(TopicRole.HEARTBEATS, [started(world_size=1), beat]))
    assert _reasons(out) == [(1, "step_range")]
    steps = Replayer(CFG).feed(_records(TopicRole.STEPS, [step(MAX_STEP, 1.0)]))
    assert _reasons(steps) == [(0, "step_range")]
    # a run's first step may be anywhere below the bound (processors started mid-run)
    late = Replayer(CFG).feed(_records(TopicRole.STEPS, [step(5 * MAX_STEP_JUMP, 1.0)]))
    assert late.dead_letters == []
    commit = CheckpointCommitted(run_id="r", ts_ns=1, step=MAX_STEP, path="/c")
    ckpt = Replayer(CFG).feed(_records(TopicRole.CHECKPOINTS, [commit]))
    assert _reasons(ckpt) == [(0, "step_range")]


def test_a_step_record_far_ahead_of_the_last_is_a_dead_letter() -> None:
    events: list[Event] = [started(), *(step(s, 2.0) for s in range(1, 6))]
    out = Replayer(CFG).feed(
        _records(TopicRole.STEPS, [*events, step(5 + MAX_STEP_JUMP + 1, 2.0), step(6, 2.0)])
    )
    assert _reasons(out) == [(6, "step_jump")]
    assert out.steps["r"].last_step == 6


def test_an_incarnation_jump_is_a_dead_letter_on_every_topic() -> None:
    jump = started(ts_ns=2 * S, incarnation=MAX_INCARNATION_JUMP + 1)
    for role in (TopicRole.HEARTBEATS, TopicRole.STEPS):
        out = Replayer(CFG).feed(_records(role, [started(), jump]))
        assert _reasons(out) == [(1, "incarnation_jump")], role
    ok = started(ts_ns=2 * S, incarnation=MAX_INCARNATION_JUMP)
    fine = Replayer(CFG).feed(_records(TopicRole.HEARTBEATS, [started(), ok]))
    assert fine.dead_letters == [] and fine.liveness["r"].incarnation == MAX_INCARNATION_JUMP


def _verdict(kind: str, step_: int, incarnation: int, vid: str) -> AnomalyDetected:
    return AnomalyDetected(
        run_id="victim",
        ts_ns=1,
        verdict_id=vid,
        kind=kind,  # type: ignore[arg-type]
        step=step_,
        incarnation=incarnation,
    )


def test_a_forged_far_incarnation_makes_no_later_verdict_stale() -> None:
    # Issue 19, finding 7: an alert-only verdict at incarnation 2**31-1 made every later
    # real dead_rank stale (0 commands).
    forged = _verdict("straggler", 1, 2**31 - 1, "forged")
    real = _verdict("dead_rank", 5, 0, "real")
    out = Replayer(CFG).feed(_records(TopicRole.ANOMALIES, [forged, real]))
    assert _reasons(out) == [(0, "incarnation_jump")]
    assert [(c.cause_verdict_id, c.incarnation) for c in out.commands] == [("real", 0)]


def test_a_forged_negative_step_yields_no_undecodable_command() -> None:
    # Issue 19, finding 7: a rollback verdict at step -2**63 made a command whose
    # max_checkpoint_step (-2**63 - 1) no controller could decode, using up the
    # incarnation's one command.
    forged = _verdict("nonfinite_loss", -(2**63), 0, "forged")
    real = _verdict("nonfinite_loss", 40, 0, "real")
    out = Replayer(CFG).feed(_records(TopicRole.ANOMALIES, [forged, real]))
    assert _reasons(out) == [(0, "step_range")]
    assert [c.cause_verdict_id for c in out.commands] == ["real"]
    command = out.commands[0]
    assert decode(encode(command)) == command and isinstance(command, RestartRequested)
    assert command.max_checkpoint_step == 39
