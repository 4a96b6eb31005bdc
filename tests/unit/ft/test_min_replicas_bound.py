"""Steps below --min-replicas for longer than a bound (log time) restart the gang.

A rule per test: `replicas.below_floor` (the step reducer's verdict), the policy's
`_escalation` (the gang command), `group_plan` rules 2 and 7, and the launch's plumbing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from runwatch.cmd.launch import fault_tolerance
from runwatch.controller.group_plan import ReplicaGroups, plan_group
from runwatch.controller.torchft_launcher import ReplicaLayout
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.policy import PolicyState, fold_policy
from runwatch.processors.core.replicas import BELOW_RAISED, Floor, below_floor
from runwatch.processors.core.steps import fold_step
from runwatch.processors.core.verdicts import make_anomaly
from runwatch.producers.torchft_backend import floor_thresholds
from runwatch.schemas.events import (
    AnomalyDetected,
    AnomalyKind,
    BackendDeclaration,
    RestartRequested,
    StepCompleted,
)
from tests.unit.core.factories import src, started

S = 1_000_000_000
FLOOR = Floor(min_replicas=2, bound_s=10.0)


def step(n: int, participants: tuple[int, ...], ts_s: float) -> StepCompleted:
    return StepCompleted(
        run_id="r",
        ts_ns=int(ts_s * S),
        step=n,
        loss=2.0,
        step_time_s=0.5,
        replica_group=participants[0],
        participants=participants,
    )


def below(
    since_ns: int, participants: tuple[int, ...], ts_s: float, floor: Floor = FLOOR
) -> tuple[int, list[str]]:
    said: list[str] = []
    got = below_floor(
        since_ns,
        step(1, participants, ts_s),
        len(participants),
        floor,
        lambda kind, group, _d: said.append(f"{kind}:{group}"),
    )
    return got, said


# ---------------------------------------------------------------- the step reducer's verdict


def test_floor_rule_1_no_floor_or_a_full_enough_quorum_ends_the_stretch() -> None:
    assert below(5 * S, (0,), 100.0, Floor()) == (-1, [])
    assert below(5 * S, (0, 1), 100.0) == (-1, [])
    assert below(BELOW_RAISED, (0, 1, 2), 100.0) == (-1, [])


def test_floor_rule_2_a_raised_stretch_says_nothing_more() -> None:
    assert below(BELOW_RAISED, (0,), 1000.0) == (BELOW_RAISED, [])


def test_floor_rule_3_the_first_step_below_starts_the_stretch_at_its_log_time() -> None:
    assert below(-1, (0,), 7.5) == (int(7.5 * S), [])


def test_floor_rule_4_past_the_bound_in_log_time_the_verdict_is_raised_once() -> None:
    assert below(5 * S, (0,), 15.0) == (5 * S, [])  # exactly the bound: not past it
    assert below(5 * S, (0,), 15.5) == (BELOW_RAISED, ["replicas_below_min:None"])


def test_the_step_reducer_takes_the_floor_from_the_run_s_thresholds() -> None:
    cfg, verdicts = DetectorConfig(), []
    thresholds = {"min_replicas": 2.0, "min_replicas_bound_s": 10.0}
    state, _ = fold_step(None, started(thresholds=thresholds), src(0, "steps"), cfg)
    events = [step(1, (0, 1), 1), step(2, (0,), 2), step(3, (0,), 11), step(4, (0,), 12.5)]
    events += [step(5, (0,), 30), step(6, (0, 1), 31), step(7, (0,), 32)]
    for i, e in enumerate(events, start=1):
        state, out = fold_step(state, e, src(i, "steps"), cfg)
        verdicts += [(v.kind, v.step) for v in out if isinstance(v, AnomalyDetected)]
    assert ("replicas_below_min", 4) in verdicts  # 10.5 s of log time below 2 groups
    assert [v for v in verdicts if v[0] == "replicas_below_min"] == [("replicas_below_min", 4)]
    assert state.replicas.below_verdicts == 1
    assert state.replicas.below_since_ns == 32 * S  # a new stretch after step 6's full quorum


def test_without_thresholds_the_steps_may_stay_below_any_time() -> None:
    cfg, state = DetectorConfig(), None
    for i, e in enumerate([step(1, (0, 1), 1), step(2, (0,), 2), step(3, (0,), 5000)]):
        state, out = fold_step(state, e, src(i, "steps"), cfg)
        assert all(v.kind != "replicas_below_min" for v in out if isinstance(v, AnomalyDetected))


# ---------------------------------------------------------------- the policy's escalation


def anomaly(kind: AnomalyKind, step_n: int, incarnation: int = 0) -> AnomalyDetected:
    return make_anomaly(
        run_id="r",
        kind=kind,
        step=step_n,
        ts_ns=step_n * S,
        source=src(step_n, "anomalies"),
        config_hash="h",
        incarnation=incarnation,
    )


def fold(
    anomalies: list[AnomalyDetected], cfg: DetectorConfig | None = None
) -> tuple[PolicyState | None, list[RestartRequested]]:
    state: PolicyState | None = None
    out: list[RestartRequested] = []
    for a in anomalies:
        state, cmds = fold_policy(state, a, a.source, cfg or DetectorConfig())
        out += cmds
    return state, out


def test_escalation_rule_1_an_older_incarnation_is_stale() -> None:
    state, out = fold([anomaly("dead_rank", 1, incarnation=1), anomaly("replicas_below_min", 2)])
    assert [c.incarnation for c in out] == [1] and state is not None and state.stale == 1


def test_escalation_rule_2_one_gang_restart_per_incarnation() -> None:
    _, out = fold([anomaly("replicas_below_min", 5), anomaly("replicas_below_min", 9)])
    assert [c.action for c in out] == ["respawn"]


def test_escalation_rule_3_shadow_records_what_it_would_do() -> None:
    _, out = fold([anomaly("replicas_below_min", 5)], DetectorConfig(shadow=True))
    assert [(c.action, c.shadow) for c in out] == [("respawn", True)]


def test_escalation_rule_4_the_budget_holds() -> None:
    state, out = fold([anomaly("replicas_below_min", 5)], DetectorConfig(restart_budget=0))
    assert out == [] and state is not None and state.over_budget == 1


def test_escalation_rule_5_a_gang_command_after_the_group_restart_of_the_same_incarnation() -> None:
    # the dead rank's respawn was carried out as a group restart; the group never came back
    _, out = fold([anomaly("dead_rank", 3), anomaly("hang", 4), anomaly("replicas_below_min", 9)])
    assert [(c.action, c.cause_kind, c.incarnation) for c in out] == [
        ("respawn", "dead_rank", 0),
        ("respawn", "replicas_below_min", 0),
    ]
    assert out[0].command_id != out[1].command_id


# ---------------------------------------------------------------- the controller's plan

FT = BackendDeclaration(name="torchft-ddp", per_step_fault_tolerance=True)


def command(kind: AnomalyKind) -> RestartRequested:
    return RestartRequested(
        run_id="r", ts_ns=1, command_id="c", action="respawn", cause_verdict_id="v", cause_kind=kind
    )


def test_group_plan_rule_2_below_min_too_long_is_a_gang_restart_even_while_groups_heal() -> None:
    groups = ReplicaGroups(groups=3, nproc_per_group=1, min_replicas=2, bounded=True)
    plan = plan_group(command("replicas_below_min"), groups, FT, (), healing=(1, 2))
    assert (plan.verdict, plan.rule) == ("gang", 2)
    assert plan_group(command("hang"), groups, FT, (), healing=(1,)).verdict == "refuse"


def test_group_plan_rule_6_with_a_bound_the_survivors_may_step_below_the_floor() -> None:
    from runwatch.controller.elastic import RankExit

    bounded = ReplicaGroups(groups=2, nproc_per_group=1, min_replicas=2, bounded=True)
    plan = plan_group(command("dead_rank"), bounded, FT, [RankExit(1, -9, 1.0)])
    assert (plan.verdict, plan.groups, plan.rule) == ("groups", (1,), 8)
    strict = ReplicaGroups(groups=2, nproc_per_group=1, min_replicas=2)
    assert plan_group(command("dead_rank"), strict, FT, [RankExit(1, -9, 1.0)]).rule == 6
    both = plan_group(command("dead_rank"), bounded, FT, [RankExit(0, -9, 1.0), RankExit(1, 1, 1)])
    assert (both.verdict, both.rule) == ("gang", 6)


# ---------------------------------------------------------------- the launch's plumbing


def test_the_bound_lowers_torchft_s_floor_to_one_and_the_run_announces_the_real_one() -> None:
    ns = argparse.Namespace(
        fault_tolerance="torchft",
        replica_groups=3,
        nproc_per_group=1,
        min_replicas=2,
        nproc=None,
        min_replicas_bound_s=60.0,
    )
    spec = fault_tolerance(ns)
    assert spec is not None and (spec.min_replicas, spec.quorum_floor) == (2, 1)
    ns.min_replicas_bound_s = None
    unbounded = fault_tolerance(ns)
    assert unbounded is not None and unbounded.quorum_floor == 2
    assert ReplicaLayout(3, 1, 2, 60.0).quorum_floor == 1
    assert ReplicaLayout(3, 1, 2).quorum_floor == 2
    env = {"RUNWATCH_REPLICA_FLOOR": "2", "RUNWATCH_REPLICA_FLOOR_BOUND_S": "60"}
    assert floor_thresholds(env) == {"min_replicas": 2.0, "min_replicas_bound_s": 60.0}
    assert floor_thresholds({}) == {}


def test_the_groups_get_torchft_s_floor_and_the_run_s_floor_in_their_environment(
    tmp_path: Path,
) -> None:
    from runwatch.controller.state import ControllerState, LaunchSpec
    from runwatch.controller.topology import RunBinding
    from runwatch.controller.torchft_compat import LighthouseProcess
    from runwatch.controller.torchft_launcher import TorchFTLauncher
    from runwatch.producers.torchft_backend import (
        ENV_MIN_REPLICAS,
        ENV_REPLICA_FLOOR,
        ENV_REPLICA_FLOOR_BOUND_S,
        ReplicaEnv,
    )

    spec = LaunchSpec(run=RunBinding(run_id="r", bootstrap="", prefix="p"), argv=("true",))
    lighthouse = LighthouseProcess(pid=1, address="http://h:1", barrier="http://h:2")
    state = ControllerState(tmp_path)
    bounded = TorchFTLauncher(state, spec, ReplicaLayout(3, 1, 2, 45.0), lighthouse)
    env = bounded._group_env(1)
    assert (env[ENV_MIN_REPLICAS], env[ENV_REPLICA_FLOOR], env[ENV_REPLICA_FLOOR_BOUND_S]) == (
        "1",
        "2",
        "45",
    )
    assert ReplicaEnv.from_env(env).min_replicas == 1  # torchft's quorum needs one group
    assert floor_thresholds(env) == {"min_replicas": 2.0, "min_replicas_bound_s": 45.0}
    strict = TorchFTLauncher(state, spec, ReplicaLayout(3, 1, 2), lighthouse)._group_env(1)
    assert strict[ENV_MIN_REPLICAS] == "2" and floor_thresholds(strict) == {}
