"""Replica groups from the steps' participants: lost, rejoined, degraded steps."""

from __future__ import annotations

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.replicas import ReplicaTally, fold_replicas
from runwatch.processors.core.steps import fold_step
from runwatch.schemas.events import AnomalyDetected, StepCompleted
from tests.unit.core.factories import src


def step(
    n: int, participants: tuple[int, ...], *, group: int = 0, dt: float = 0.5
) -> StepCompleted:
    return StepCompleted(
        run_id="r",
        ts_ns=n * 1_000_000_000,
        step=n,
        loss=2.0,
        step_time_s=dt,
        replica_group=group,
        participants=participants,
    )


def run(events: list[StepCompleted]) -> tuple[ReplicaTally, list[tuple[str, int, int]]]:
    tally, out = ReplicaTally(), []
    for e in events:
        tally = fold_replicas(tally, e, lambda kind, g, _d, n=e.step: out.append((kind, g, n)))
    return tally, out


def test_a_group_missing_from_the_quorum_is_lost_once_and_rejoins_once() -> None:
    tally, verdicts = run(
        [step(1, (0, 1, 2)), step(2, (0, 2)), step(3, (0, 2)), step(4, (0, 1, 2))]
    )
    assert verdicts == [("replica_lost", 1, 2), ("replica_rejoined", 1, 4)]
    assert tally.lost == () and tally.groups == (0, 1, 2)
    assert (tally.steps, tally.degraded_steps, tally.degraded_time_s) == (4, 2, 1.0)


def test_rule_1_steps_without_participants_say_nothing() -> None:
    tally, verdicts = run([step(1, (0, 1)), step(2, ())])
    assert verdicts == [] and tally.steps == 1


def test_two_groups_lost_in_one_step_get_a_verdict_each() -> None:
    _, verdicts = run([step(1, (0, 1, 2)), step(2, (0,))])
    assert verdicts == [("replica_lost", 1, 2), ("replica_lost", 2, 2)]


def test_a_step_reported_again_is_judged_but_not_counted_twice() -> None:
    tally, _ = run([step(1, (0, 1)), step(1, (0, 1), group=1), step(2, (0,))])
    assert (tally.steps, tally.degraded_steps) == (2, 1)


def test_the_step_reducer_raises_the_replica_verdicts_with_the_group_in_their_identity() -> None:
    cfg, state, verdicts = DetectorConfig(), None, []
    for i, e in enumerate([step(1, (0, 1)), step(2, (0,)), step(3, (0, 1))]):
        state, out = fold_step(state, e, src(i, "steps"), cfg)
        verdicts.extend(out)
    got = [(v.kind, v.replica_group, v.step) for v in verdicts if isinstance(v, AnomalyDetected)]
    assert got == [("replica_lost", 1, 2), ("replica_rejoined", 1, 3)]
    assert state is not None and state.replicas.degraded_steps == 1
    assert verdicts[0].verdict_id != verdicts[1].verdict_id


def test_the_receipt_shows_the_replica_groups_and_degraded_steps() -> None:
    from runwatch.processors.core.report import health_report

    cfg, state = DetectorConfig(), None
    for i, e in enumerate([step(1, (0, 1)), step(2, (0,), dt=0.25), step(3, (0,), dt=0.25)]):
        state, _ = fold_step(state, e, src(i, "steps"), cfg)
    report = health_report(state)
    assert report["replicas"] == {
        "groups": 2,
        "lost_now": [1],
        "steps": 3,
        "degraded_steps": 2,
        "degraded_time_s": 0.5,
        "lost": 1,
        "rejoined": 0,
    }
    assert "replicas" not in health_report(fold_step(None, step(1, ()), src(0, "steps"), cfg)[0])


def test_status_shows_the_groups_stepping_and_the_degraded_steps() -> None:
    from runwatch.cmd.status import format_row
    from runwatch.processors.fleet import RunView, summarize

    cfg, state = DetectorConfig(), None
    for i, e in enumerate([step(1, (0, 1)), step(2, (0,)), step(3, (0,))]):
        state, _ = fold_step(state, e, src(i, "steps"), cfg)
    row = summarize(RunView(run_id="r", steps=state))
    assert (row.replica_groups, row.replicas_lost, row.degraded_steps) == (2, (1,), 2)
    assert format_row(row).endswith("groups 1/2, 2 degraded steps")
