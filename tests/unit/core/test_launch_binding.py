"""Verdicts carry the launch of the run's latest RunStarted; the policy's command copies it."""

from __future__ import annotations

import math

from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.liveness import LivenessState
from runwatch.processors.core.policy import fold_policy
from runwatch.processors.core.state_codec import decode_state, encode_state
from runwatch.processors.core.verdicts import make_anomaly
from runwatch.schemas.events import AnomalyDetected
from tests.unit.core.factories import (
    S,
    fold_heartbeats,
    fold_steps,
    healthy_losses,
    lockstep,
    src,
    started,
    step,
    tick,
)

CFG = with_overrides(
    DetectorConfig(),
    {"dead_rank_timeout_s": 30, "hang_timeout_s": 60, "startup_timeout_s": 300},
)


def test_liveness_verdicts_carry_the_latest_launch_and_keep_it_through_heartbeats() -> None:
    events = [started(world_size=2, launch_id="L1"), *lockstep(2, range(1, 5))]
    events += [tick(t * S) for t in range(2, 100)]
    state, verdicts = fold_heartbeats(events, CFG)
    assert verdicts and {v.launch_id for v in verdicts} == {"L1"}
    assert state is not None and state.launch_id == "L1"
    again = [started(world_size=2, incarnation=1, ts_ns=200 * S, launch_id="L2")]
    again += [*lockstep(2, range(201, 205))]
    state, _ = fold_heartbeats(again, CFG, state, first_offset=1000)
    assert state is not None and state.launch_id == "L2"


def test_step_verdicts_and_the_command_made_of_them_carry_the_launch() -> None:
    losses = healthy_losses(40)
    events = [started(launch_id="L7"), *(step(i, v) for i, v in enumerate(losses, 1))]
    events.append(step(41, math.nan))
    _, verdicts = fold_steps(events, CFG)
    (nan,) = [v for v in verdicts if v.kind == "nonfinite_loss"]
    assert nan.launch_id == "L7"
    _, (command,) = fold_policy(None, nan, src(0, topic="anomalies"), CFG)
    assert command.launch_id == "L7" and command.max_checkpoint_step == 40


def test_a_run_announced_without_a_launch_gives_unbound_verdicts() -> None:
    losses = healthy_losses(20)
    events = [started(), *(step(i, v) for i, v in enumerate(losses, 1)), step(21, math.inf)]
    _, verdicts = fold_steps(events, CFG)
    assert verdicts and {v.launch_id for v in verdicts} == {""}


def test_the_launch_survives_the_state_store() -> None:
    state, _ = fold_heartbeats(
        [started(world_size=2, launch_id="L3"), *lockstep(2, range(1, 3))], CFG
    )
    assert state is not None
    assert decode_state(LivenessState, encode_state(state)).launch_id == "L3"  # type: ignore[union-attr]


def dead(offset: int, launch_id: str, rank: int = 1) -> AnomalyDetected:
    """A dead_rank verdict of incarnation 0 at ``offset`` (its step and second too)."""
    return make_anomaly(
        run_id="r",
        kind="dead_rank",
        step=offset,
        ts_ns=offset * S,
        source=src(offset),
        config_hash="h",
        incarnation=0,
        rank=rank,
        launch_id=launch_id,
    )


def test_a_new_launch_of_the_run_gets_its_own_commands() -> None:
    state, first = fold_policy(None, dead(1, "A"), src(1, topic="anomalies"), CFG)
    state, again = fold_policy(state, dead(2, "A"), src(2, topic="anomalies"), CFG)
    assert [c.launch_id for c in first] == ["A"] and again == []  # one per incarnation
    state, fresh = fold_policy(state, dead(3, "B"), src(3, topic="anomalies"), CFG)
    assert [(c.launch_id, c.incarnation) for c in fresh] == [("B", 0)]
    assert state.launch_id == "B" and state.commands == 2


def test_a_verdict_without_a_launch_never_reopens_the_launchs_incarnation() -> None:
    """A processor that had not read the RunStarted yet makes verdicts with no launch id;
    mixed with the launch's own, they must not reset the count: one command per incarnation."""
    state = None
    commands = []
    for offset, launch in enumerate(["L1", "", "L1", ""]):
        verdict = dead(offset, launch, rank=offset)
        state, out = fold_policy(state, verdict, src(offset, "anomalies"), CFG)
        commands += out
    assert [(c.launch_id, c.incarnation) for c in commands] == [("L1", 0)]
    assert state is not None and state.launch_id == "L1"
