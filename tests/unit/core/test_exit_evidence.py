"""Exit evidence: a RankExited names the culprit at once; its blocked peers are not reported."""

from __future__ import annotations

import msgspec
import pytest

from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.policy import fold_policy
from runwatch.processors.core.replay import Record, replay
from runwatch.processors.core.state_codec import decode_state, encode_state
from runwatch.schemas.events import Heartbeat, Provenance, RankExited, RunEnded, RunStarted, Tick
from tests.unit.core.factories import S, ended, fold_heartbeats, lockstep, src, started, tick

CFG = with_overrides(
    DetectorConfig(),
    {"dead_rank_timeout_s": 3, "hang_timeout_s": 6, "startup_timeout_s": 300},
)
Event = RunStarted | Heartbeat | Tick | RunEnded | RankExited


def exited(
    rank: int,
    ts_ns: int,
    *,
    code: int | None = None,
    sig: int | None = None,
    incarnation: int = 0,
    host: str = "node-b",
    finished: bool = False,
) -> RankExited:
    return RankExited(
        run_id="r",
        ts_ns=ts_ns,
        rank=rank,
        incarnation=incarnation,
        host=host,
        pid=4242,
        exit_code=code,
        signal=sig,
        finished=finished,
    )


def killed_gang(incarnation: int = 0) -> list[Event]:
    """Rank 1 of 2 SIGKILLed after step 20 (5 s); rank 0 blocks, then exits on the error."""
    events: list[Event] = [started(world_size=2, incarnation=incarnation)]
    events += lockstep(2, range(1, 21))  # last heartbeats at 5 s
    events += [exited(1, 5 * S + S // 10, sig=9, incarnation=incarnation)]
    events += [tick(5 * S + t * S // 2) for t in range(1, 40)]  # 20 s of silence
    events += [exited(0, 12 * S, code=1, incarnation=incarnation, host="node-a")]
    return events


def test_sigkill_names_the_culprit_rank_and_host_at_once() -> None:
    state, verdicts = fold_heartbeats(killed_gang(), CFG)
    assert [(v.kind, v.rank) for v in verdicts] == [("dead_rank", 1)], "peers not reported"
    (verdict,) = verdicts
    assert verdict.ts_ns == 5 * S + S // 10, "raised on the exit event, not after a timeout"
    assert "rank 1 on node-b" in verdict.detail and "signal 9 (SIGKILL)" in verdict.detail
    assert "pid 4242" in verdict.detail and "after step 20" in verdict.detail
    assert verdict.step == 20 and verdict.value == 137.0
    assert state is not None and state.exit_rank == 1 and state.dead_ranks == (1,)


def test_without_exit_evidence_both_ranks_are_reported() -> None:
    # The contrast: the same silence without the RankExited events.
    events = [e for e in killed_gang() if not isinstance(e, RankExited)]
    _, verdicts = fold_heartbeats(events, CFG)
    assert [(v.kind, v.rank, v.ranks) for v in verdicts] == [
        ("dead_rank", 0, (0, 1)),  # one verdict naming both
        ("hang", None, ()),
    ]


def test_exit_code_is_named_and_one_verdict_per_incarnation() -> None:
    events: list[Event] = [started(world_size=4), *lockstep(4, range(1, 5))]
    events += [exited(2, 2 * S, code=3), exited(3, 2 * S + 1, code=1)]
    _, verdicts = fold_heartbeats(events, CFG)
    assert [(v.kind, v.rank) for v in verdicts] == [("dead_rank", 2)]
    assert "exit code 3" in verdicts[0].detail


def test_a_clean_exit_is_no_fault_and_not_reported_silent() -> None:
    events: list[Event] = [started(world_size=2), *lockstep(2, range(1, 21))]
    events += [exited(1, 5 * S + 1, code=0)]
    # rank 0 keeps going alone (e.g. writes the last checkpoint) for 10 s
    events += [Heartbeat(run_id="r", ts_ns=(5 + t) * S, rank=0, step=20 + t) for t in range(11)]
    events += [ended(ts_ns=16 * S, status="completed")]
    state, verdicts = fold_heartbeats(events, CFG)
    assert verdicts == []
    assert state is not None and state.exit_rank == -1


def finished_then_aborted(*, finished: bool, before_run_ended: bool) -> list[Event]:
    """Rank 1 of 2 aborts (SIGABRT) in its teardown after the last step; rank 0 exits 0.

    Rank 0's RunEnded and the agent's RankExited race on the heartbeats topic (rank 0's
    emitter thread against the agent's producer): both orders.
    """
    events: list[Event] = [started(world_size=2), *lockstep(2, range(1, 21))]
    abort = exited(1, 5 * S + 2, sig=6, finished=finished)
    end = ended(ts_ns=5 * S + 1, status="completed")
    events += [abort, end] if before_run_ended else [end, abort]
    return [*events, exited(0, 5 * S + 3, code=0, host="node-a")]


@pytest.mark.parametrize("before_run_ended", [True, False], ids=["exit-first", "end-first"])
def test_a_teardown_abort_after_the_rank_finished_is_a_clean_exit(before_run_ended) -> None:
    events = finished_then_aborted(finished=True, before_run_ended=before_run_ended)
    state, verdicts = fold_heartbeats(events, CFG)
    assert verdicts == []
    assert state is not None and state.exit_rank == -1


def test_the_same_abort_before_the_rank_finished_is_its_gangs_culprit() -> None:
    # The contrast: without the rank's word that it finished, the abort that beats
    # RunEnded to the topic is a dead rank (what a completed run used to be paged for).
    events = finished_then_aborted(finished=False, before_run_ended=True)
    _, verdicts = fold_heartbeats(events, CFG)
    assert [(v.kind, v.rank) for v in verdicts] == [("dead_rank", 1)]
    assert "signal 6 (SIGABRT)" in verdicts[0].detail


def test_a_finished_rank_that_exits_is_not_reported_silent_while_its_peers_finish() -> None:
    events: list[Event] = [started(world_size=2), *lockstep(2, range(1, 21))]
    events += [exited(1, 5 * S + 1, sig=6, finished=True)]
    events += [Heartbeat(run_id="r", ts_ns=(5 + t) * S, rank=0, step=20 + t) for t in range(11)]
    events += [ended(ts_ns=16 * S, status="completed")]
    state, verdicts = fold_heartbeats(events, CFG)
    assert verdicts == []
    assert state is not None and state.exit_rank == -1


def test_unknown_status_is_a_fault() -> None:
    events: list[Event] = [started(world_size=2), *lockstep(2, range(1, 3)), exited(0, S)]
    _, verdicts = fold_heartbeats(events, CFG)
    assert [(v.kind, v.rank) for v in verdicts] == [("dead_rank", 0)]
    assert "unknown exit status" in verdicts[0].detail


def test_old_incarnation_and_suspended_runs_are_ignored() -> None:
    events: list[Event] = [started(world_size=2, incarnation=1), *lockstep(2, range(1, 5))]
    events += [exited(1, 2 * S, sig=9, incarnation=0)]  # the previous gang's straggling exit
    _, verdicts = fold_heartbeats(events, CFG)
    assert verdicts == []
    events = [started(world_size=2), *lockstep(2, range(1, 5)), ended(ts_ns=2 * S)]
    events += [exited(1, 2 * S + 1, sig=15)]  # stopped by the controller after RunEnded
    _, verdicts = fold_heartbeats(events, CFG)
    assert verdicts == []


def test_next_incarnation_clears_the_culprit_and_reports_again() -> None:
    state, first = fold_heartbeats(killed_gang(0), CFG)
    # The first gang's log ends at 24.5 s (its last tick).
    events: list[Event] = [ended(ts_ns=25 * S), started(ts_ns=26 * S, world_size=2, incarnation=1)]
    events += [
        Heartbeat(run_id="r", ts_ns=26 * S + n * S // 4 + k, rank=k, step=20 + n)
        for n in range(1, 5)
        for k in range(2)
    ]
    events += [exited(0, 28 * S, sig=11, incarnation=1, host="node-a")]
    state, second = fold_heartbeats(events, CFG, state, first_offset=1000)
    assert [(v.rank, v.incarnation) for v in first + second] == [(1, 0), (0, 1)]
    assert "signal 11 (SIGSEGV)" in second[0].detail
    assert first[0].verdict_id != second[0].verdict_id


def test_a_rank_already_flagged_silent_gets_no_second_verdict() -> None:
    events: list[Event] = [started(world_size=2), *lockstep(2, range(1, 21))]
    events += [Heartbeat(run_id="r", ts_ns=(5 + t) * S, rank=0, step=20 + t) for t in range(5)]
    events += [exited(1, 9 * S + 1, sig=9)]  # the agent's evidence came late
    events += [tick((9 + t) * S) for t in range(1, 20)]
    _, verdicts = fold_heartbeats(events, CFG)
    assert [(v.kind, v.rank) for v in verdicts] == [("dead_rank", 1)]
    assert "silent" in verdicts[0].detail


def test_the_policy_issues_one_respawn() -> None:
    _, verdicts = fold_heartbeats(killed_gang(), CFG)
    state = None
    commands = []
    for i, v in enumerate(verdicts):
        state, out = fold_policy(state, v, src(i, "runwatch.anomalies"), CFG)
        commands += out
    assert [(c.action, c.incarnation, c.cause_kind) for c in commands] == [
        ("respawn", 0, "dead_rank")
    ]


def test_replay_reproduces_the_verdict_and_the_state_round_trips() -> None:
    records: list[Record] = [
        ("heartbeats", Provenance(topic="runwatch.heartbeats", partition=0, offset=i), e)
        for i, e in enumerate(killed_gang())
    ]
    live_state, live = fold_heartbeats(killed_gang(), CFG)
    first, again = replay(records, CFG), replay(records, CFG)
    assert [v.verdict_id for v in first.anomalies] == [v.verdict_id for v in live]
    assert first.anomalies == again.anomalies and len(first.commands) == 1
    assert first.commands == again.commands
    assert live_state is not None
    assert decode_state("liveness", encode_state(live_state)) == live_state


def test_the_verdict_carries_the_root_cause_the_rank_recorded() -> None:
    events: list[Event] = [started(world_size=2), *lockstep(2, range(1, 11))]
    failed = exited(1, 3 * S, code=1)
    events += [msgspec.structs.replace(failed, root_cause="ValueError: batch 7 has no tokens")]
    _, (verdict,) = fold_heartbeats(events, CFG)
    assert verdict.kind == "dead_rank" and verdict.rank == 1
    assert verdict.detail.endswith(
        "its peers are blocked on it; root cause: ValueError: batch 7 has no tokens"
    )
    # Evidence without one (a signal, no @record, an older agent) reads as before.
    _, (plain,) = fold_heartbeats([*events[:-1], failed], CFG)
    assert plain.detail.endswith("its peers are blocked on it")
    assert plain.verdict_id == verdict.verdict_id  # the same verdict, better described


def test_an_exit_before_the_run_started_is_read_is_bound_to_the_agents_launch() -> None:
    """A rank killed in its first steps: its RankExited may be read before the RunStarted
    (rank 0's packs flush later than rank 1's); the dead_rank then takes the launch from
    the agent's evidence, or its command is refused as unbound (CI, the torchft loop)."""
    gone = msgspec.structs.replace(exited(1, 2 * S, sig=9), launch_id="L9")
    _, verdicts = fold_heartbeats([*lockstep(2, range(1, 3)), gone], CFG)
    assert [(v.kind, v.rank, v.launch_id) for v in verdicts] == [("dead_rank", 1, "L9")]


def test_the_run_s_own_launch_wins_over_the_evidence_s() -> None:
    events = [started(world_size=2, launch_id="L1"), *lockstep(2, range(1, 3))]
    gone = msgspec.structs.replace(exited(1, 2 * S, sig=9), launch_id="L9")
    _, verdicts = fold_heartbeats([*events, gone], CFG)
    assert [(v.kind, v.launch_id) for v in verdicts] == [("dead_rank", "L1")]
