"""Liveness: dead ranks (steps and log time), hangs, stragglers, suspension."""

from __future__ import annotations

import pytest

from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.liveness import LivenessState, advance_step, fold_liveness
from runwatch.schemas.events import Heartbeat, RunEnded, RunStarted, Tick
from tests.unit.core.factories import (
    S,
    ended,
    fold_heartbeats,
    hb,
    kinds,
    lockstep,
    src,
    started,
    tick,
)

CFG = with_overrides(
    DetectorConfig(),
    {"dead_rank_timeout_s": 30, "hang_timeout_s": 60, "startup_timeout_s": 300},
)
Event = RunStarted | Heartbeat | Tick | RunEnded


def summary(verdicts: list) -> list[tuple[str, int, int | None]]:  # type: ignore[type-arg]
    return [(v.kind, v.step, v.rank) for v in verdicts]


def test_seed_000_dead_rank_once_per_outage_and_cleared_on_report() -> None:
    events: list[Event] = [started(world_size=4)]
    events += lockstep(4, range(1, 21))
    events += lockstep(4, range(21, 101), skip={3})  # rank 3 silent from step 21
    events += lockstep(4, range(101, 111))  # back
    events += lockstep(4, range(111, 200), skip={3})  # silent again
    state, verdicts = fold_heartbeats(events, CFG)
    assert summary(verdicts) == [("dead_rank", 71, 3), ("dead_rank", 161, 3)]
    assert verdicts[0].value == 51 and verdicts[0].threshold == 50
    assert state is not None and state.dead_ranks == (3,)
    assert verdicts[0].verdict_id != verdicts[1].verdict_id


def test_rank_silent_in_log_time_while_peers_report() -> None:
    events: list[Event] = [started(world_size=4)]
    events += lockstep(4, range(1, 11), dt_s=5.0)
    events += lockstep(4, range(11, 20), dt_s=5.0, skip={2})  # 5 s steps: 30 s = 6 steps
    _, verdicts = fold_heartbeats(events, CFG)
    # Rank 2 last reported at 50 s; rank 3's heartbeat at 80 s + 3 ns is the first event
    # more than 30 s later.
    assert summary(verdicts) == [("dead_rank", 16, 2)]
    assert verdicts[0].value == pytest.approx(30.0, abs=1e-6)
    assert "peers reporting" in verdicts[0].detail


def test_ddp_kill_whole_gang_silent_gives_dead_ranks_then_hang_once() -> None:
    events: list[Event] = [started(world_size=2)]
    events += lockstep(2, range(1, 41))  # last heartbeat at 10 s
    events += [tick(t * S) for t in range(11, 200)]
    state, verdicts = fold_heartbeats(events, CFG)
    assert summary(verdicts) == [("dead_rank", 40, 0), ("hang", 40, None)]
    assert (verdicts[0].ranks, verdicts[0].rank_count) == ((0, 1), 2)  # one verdict, both
    assert verdicts[0].ts_ns == 41 * S and verdicts[1].ts_ns == 71 * S
    assert "2 ranks silent (0-1)" in verdicts[0].detail
    assert "whole gang silent" in verdicts[0].detail
    assert state is not None and state.hung


def test_hang_cleared_by_a_heartbeat_and_raised_again() -> None:
    events: list[Event] = [started(world_size=1)]
    events += [hb(0, 1, 1 * S)] + [tick(t * S) for t in range(2, 80)]
    events += [hb(0, 2, 80 * S)] + [tick(t * S) for t in range(81, 200)]
    _, verdicts = fold_heartbeats(events, CFG)
    assert [(v.kind, v.ts_ns) for v in verdicts if v.kind == "hang"] == [
        ("hang", 62 * S),
        ("hang", 141 * S),
    ]


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        pytest.param(
            [started(world_size=2), hb(0, 1, S), hb(1, 1, S), ended(ts_ns=2 * S)]
            + [tick(t * S) for t in range(3, 1000, 10)],
            [],
            id="run-ended-suspends-checks",
        ),
        pytest.param(
            [
                started(world_size=2),
                hb(0, 1, S),
                ended(ts_ns=2 * S),
                started(ts_ns=3 * S, world_size=2, incarnation=1),
            ]
            + [tick(t * S) for t in range(4, 300, 10)],
            [],
            id="new-incarnation-waits-for-startup-timeout",
        ),
        pytest.param(
            [started(world_size=2)] + [tick(t * S) for t in range(1, 400, 10)],
            [("hang", 0, None)],
            id="startup-hang-after-startup-timeout",
        ),
    ],
)
def test_suspension_and_startup_table(events: list[Event], expected: list[tuple]) -> None:  # type: ignore[type-arg]
    _, verdicts = fold_heartbeats(events, CFG)
    assert summary(verdicts) == expected


def test_log_time_is_monotonic_and_read_from_events_only() -> None:
    events: list[Event] = [started(world_size=2), hb(0, 5, 10 * S), hb(1, 5, 10 * S)]
    state, _ = fold_heartbeats([*events, tick(3 * S)], CFG)
    assert state is not None and state.log_time_ns == 10 * S
    state, verdicts = fold_heartbeats([*events, tick(3 * S), tick(39 * S)], CFG)
    assert state is not None and state.log_time_ns == 39 * S and verdicts == []


def test_startup_hang_fires_at_startup_timeout() -> None:
    events: list[Event] = [started(world_size=2)] + [tick(t * S) for t in range(1, 400)]
    _, verdicts = fold_heartbeats(events, CFG)
    assert [(v.kind, v.ts_ns) for v in verdicts] == [("hang", 301 * S)]


def test_expected_rank_that_never_reports_is_dead() -> None:
    events: list[Event] = [started(world_size=4), *lockstep(4, range(10, 70), skip={3})]
    _, verdicts = fold_heartbeats(events, CFG)
    assert summary(verdicts) == [("dead_rank", 60, 3)]


def test_ranks_are_learned_without_a_run_started() -> None:
    events: list[Event] = list(lockstep(3, range(1, 10)))
    events += lockstep(3, range(10, 70), skip={1})
    state, verdicts = fold_heartbeats(events, CFG)
    assert summary(verdicts) == [("dead_rank", 60, 1)]
    assert state is not None and state.live_ranks == (0, 2)


def slow_rank(world: int, steps: range, rank: int, factor: float) -> list[Heartbeat]:
    return [
        hb(r, n, n * S + r, dt=(factor if r == rank else 1.0) * (1.0 + 0.01 * ((n + r) % 3)))
        for n in steps
        for r in range(world)
    ]


@pytest.mark.parametrize(
    ("factor", "slow_steps", "expected"),
    [
        pytest.param(2.0, range(20, 40), [("straggler", 29, 2)], id="2x-for-20-steps"),
        pytest.param(2.0, range(20, 29), [], id="2x-for-9-steps"),
        pytest.param(1.3, range(20, 60), [], id="1.3x-below-ratio"),
    ],
)
def test_straggler_table(factor: float, slow_steps: range, expected: list[tuple]) -> None:  # type: ignore[type-arg]
    events: list[Event] = [started(world_size=4)]
    events += slow_rank(4, range(1, 20), 2, 1.0)
    events += slow_rank(4, slow_steps, 2, factor)
    events += slow_rank(4, range(slow_steps.stop, slow_steps.stop + 10), 2, 1.0)
    state, verdicts = fold_heartbeats(events, CFG)
    assert summary(verdicts) == expected
    assert state is not None and state.straggler_ranks == ()


def test_straggler_flag_stays_until_recovery_then_fires_again() -> None:
    events: list[Event] = [started(world_size=4)]
    events += slow_rank(4, range(1, 40), 1, 2.0)
    mid_state, first = fold_heartbeats(events, CFG)
    assert mid_state is not None and mid_state.straggler_ranks == (1,)
    events += slow_rank(4, range(40, 45), 1, 1.0) + slow_rank(4, range(45, 60), 1, 2.0)
    _, verdicts = fold_heartbeats(events, CFG)
    assert summary(first) == [("straggler", 10, 1)]
    assert summary(verdicts) == [("straggler", 10, 1), ("straggler", 54, 1)]


def test_straggler_with_interleaved_late_heartbeats() -> None:
    # Rank 3 reports each step one step late (after the others' next step).
    events: list[Event] = [started(world_size=4)]
    for n in range(1, 40):
        events += [hb(r, n, n * S + r, dt=1.0) for r in range(3)]
        if n > 1:
            events.append(hb(3, n - 1, n * S + 9, dt=3.0))
    _, verdicts = fold_heartbeats(events, CFG)
    assert summary(verdicts) == [("straggler", 10, 3)]


def test_tick_needs_a_state() -> None:
    with pytest.raises(ValueError):
        fold_liveness(None, tick(S), src(0), CFG)


def test_offsets_at_or_below_last_are_skipped() -> None:
    state, _ = fold_heartbeats([started(world_size=1), hb(0, 1, S)], CFG)
    assert state is not None
    again, verdicts = fold_liveness(state, tick(10_000 * S), src(1), CFG)
    assert again is state and verdicts == []


def test_advance_step_is_seed_check_rank_liveness() -> None:
    state, _ = fold_heartbeats([started(world_size=2), hb(0, 1, S), hb(1, 1, S)], CFG)
    assert state is not None
    state, verdicts = advance_step(state, 51, src(10), CFG)
    assert verdicts == []
    state, verdicts = advance_step(state, 52, src(11), CFG)
    assert summary(verdicts) == [("dead_rank", 52, 0)]
    assert verdicts[0].ranks == (0, 1) and verdicts[0].rank_count == 2
    state, verdicts = advance_step(state, 90, src(12), CFG)
    assert verdicts == [], "once per outage"


def test_verdicts_carry_incarnation() -> None:
    events: list[Event] = [started(world_size=2, incarnation=3), *lockstep(2, range(1, 5))]
    events += [tick(t * S) for t in range(2, 100)]
    _, verdicts = fold_heartbeats(events, CFG)
    assert verdicts and {v.incarnation for v in verdicts} == {3}
    assert kinds(verdicts).count("hang") == 1


def test_hot_path_field_order_is_pinned() -> None:
    assert LivenessState.__struct_fields__ == (
        "run_id",
        "last_offset",
        "incarnation",
        "live",
        "status",
        "thresholds",
        "log_time_ns",
        "started_ns",
        "expected_ranks",
        "known_ranks",
        "first_step",
        "first_heartbeat_ns",
        "run_step",
        "step_hint",
        "last_heartbeat_ns",
        "table",
        "dead_count",
        "hung",
        "time_scan_after_ns",
        "step_scan_at",
        "stragglers",
        "heartbeats",
        "raised",
        "anomaly_counts",
        "exit_rank",
        "last_index",
        "launch_id",
    )


def test_a_time_pushed_ahead_does_not_carry_into_the_next_incarnation() -> None:
    # A record dated far ahead moved incarnation 0's log time; the next gang's start uses
    # its own clock, so its first ticks raise no startup hang (issue 19, finding 2).
    ahead = 10_000 * S
    events: list[Event] = [
        started(world_size=2),
        hb(0, 1, 1 * S),
        hb(1, 1, 1 * S),
        hb(0, 2, ahead),
        started(world_size=2, ts_ns=20 * S, incarnation=1),
        tick(30 * S),
        tick(40 * S),
    ]
    state, verdicts = fold_heartbeats(events, CFG)
    assert state is not None and state.incarnation == 1
    assert state.log_time_ns == 40 * S
    assert [v for v in verdicts if v.incarnation == 1] == []


def test_a_huge_run_hang_timeout_does_not_disable_hang_detection() -> None:
    # A forged RunStarted announcing hang_timeout_s: 1e12 (issue 19, finding 1): the run's
    # threshold is clamped to a day, so a gang silent for two days is still a hang.
    day = 86_400 * S
    events: list[Event] = [
        started(world_size=1, thresholds={"hang_timeout_s": 1e12, "dead_rank_timeout_s": 1e12}),
        hb(0, 1, 1 * S),
        tick(1 * S + day // 2),
        tick(1 * S + 2 * day),
    ]
    _, verdicts = fold_heartbeats(events, CFG)
    kinds_seen = [(v.kind, v.threshold) for v in verdicts]
    assert ("hang", 86_400.0) in kinds_seen
    assert ("dead_rank", 86_400.0) in kinds_seen


def test_a_huge_gang_gone_silent_is_one_verdict_and_one_command() -> None:
    # Issue 19, finding 8: one tick past the timeout gave 131,072 dead_rank verdicts.
    from runwatch.processors.core.replay import replay
    from runwatch.schemas.codec import encode
    from runwatch.schemas.events import MAX_LISTED_RANKS, MAX_RANKS, Provenance

    world = MAX_RANKS
    events: list[Event] = [started(world_size=world), hb(0, 1, 1 * S), tick(100 * S)]
    records = [
        ("heartbeats", Provenance(topic="t.hb", partition=0, offset=i), e)
        for i, e in enumerate(events)
    ]
    first = replay(records, CFG)  # type: ignore[arg-type]
    dead = [v for v in first.anomalies if v.kind == "dead_rank"]
    assert len(dead) == 1
    (verdict,) = dead
    assert verdict.rank == 0 and verdict.rank_count == world
    assert verdict.ranks == tuple(range(MAX_LISTED_RANKS))
    assert f"{world} ranks silent (0-{world - 1})" in verdict.detail
    assert len(encode(verdict)) < 16 * 1024
    assert len(first.commands) == 1  # one command (for the hang, the same tick's first)
    assert first.liveness["r"].dead_count == world
    again = replay(records, CFG)  # type: ignore[arg-type]
    assert [v.verdict_id for v in again.anomalies] == [v.verdict_id for v in first.anomalies]
