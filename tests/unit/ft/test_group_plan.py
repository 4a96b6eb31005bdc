"""Group restart or gang restart (`controller.group_plan`): a test per rule."""

from __future__ import annotations

import argparse

import pytest

from runwatch.cmd.launch import fault_tolerance
from runwatch.common.errors import UsageError
from runwatch.controller.elastic import RankExit
from runwatch.controller.group_plan import GroupPlan, ReplicaGroups, plan_group
from runwatch.schemas.events import BackendDeclaration, RestartAction, RestartRequested

FT = BackendDeclaration(name="torchft-ddp", per_step_fault_tolerance=True)
DDP = BackendDeclaration(name="torch-ddp", reshardable_checkpoint=True, elastic_restart=True)
THREE = ReplicaGroups(groups=3, nproc_per_group=2, min_replicas=1)


def command(action: RestartAction, group: int | None = None) -> RestartRequested:
    kind = {"respawn": "dead_rank", "rollback": "nonfinite_loss"}.get(action, "replica_lost")
    return RestartRequested(
        run_id="r",
        ts_ns=1,
        command_id="c",
        action=action,
        cause_verdict_id="v",
        cause_kind=kind,  # type: ignore[arg-type]
        replica_group=group,
    )


def killed(*ranks: int) -> list[RankExit]:
    return [RankExit(rank=r, code=-9, seen_s=1.0) for r in ranks]


def test_rule_1_no_replica_groups_gang_path_and_respawn_group_refused() -> None:
    assert plan_group(command("respawn"), None, FT, killed(1)).verdict == "gang"
    assert plan_group(command("respawn_group", 1), None, FT, ()).verdict == "refuse"


def test_rule_2_a_rollback_restarts_every_group_from_dcp() -> None:
    plan = plan_group(command("rollback"), THREE, FT, killed(3))
    assert (plan.verdict, plan.rule) == ("gang", 2)


def test_rule_3_a_backend_without_per_step_fault_tolerance_is_never_asked_to_heal() -> None:
    assert plan_group(command("respawn"), THREE, DDP, killed(3)) == GroupPlan(
        "gang", reason="backend torch-ddp does not declare per_step_fault_tolerance", rule=3
    )
    refused = plan_group(command("respawn_group", 1), THREE, None, ())
    assert (refused.verdict, refused.rule) == ("refuse", 3)


def test_rule_4_respawn_group_restarts_the_group_it_names_or_is_refused() -> None:
    assert plan_group(command("respawn_group", 2), THREE, FT, ()).groups == (2,)
    bad = plan_group(command("respawn_group", 3), THREE, FT, ())
    assert (bad.verdict, bad.rule) == ("refuse", 4)


def test_rule_5_a_dead_rank_restarts_the_groups_of_the_abnormal_exits() -> None:
    exits = [*killed(3), RankExit(rank=0, code=0, seen_s=1.0)]
    plan = plan_group(command("respawn"), THREE, FT, exits)
    assert (plan.verdict, plan.groups, plan.rule) == ("groups", (1,), 8)
    hang = plan_group(command("respawn"), THREE, FT, ())
    assert (hang.verdict, hang.rule) == ("gang", 5)


def test_rule_6_below_min_replicas_escalates_to_a_gang_restart() -> None:
    strict = ReplicaGroups(groups=3, nproc_per_group=2, min_replicas=2)
    plan = plan_group(command("respawn"), strict, FT, killed(0, 3))
    assert (plan.verdict, plan.rule) == ("gang", 6)
    every = plan_group(command("respawn"), THREE, FT, killed(0, 2, 5))
    assert (every.verdict, every.rule) == ("gang", 6)


def test_rule_6_on_several_nodes_every_agent_escalates_not_only_the_owner() -> None:
    """Group 1 lost on node 1 with --min-replicas 2: node 0 must take the gang path too,
    not ignore the command as another node's (the gang restart needs every agent)."""
    node0 = ReplicaGroups(groups=2, nproc_per_group=1, min_replicas=2, local=(0,))
    node1 = ReplicaGroups(groups=2, nproc_per_group=1, min_replicas=2, local=(1,))
    far = plan_group(command("respawn"), node0, FT, (), cause_rank=1)
    near = plan_group(command("respawn"), node1, FT, killed(1), cause_rank=1)
    assert (far.verdict, far.rule) == (near.verdict, near.rule) == ("gang", 6)


NODE0 = ReplicaGroups(groups=2, nproc_per_group=1, min_replicas=1, local=(0,))
NODE1 = ReplicaGroups(groups=2, nproc_per_group=1, min_replicas=1, local=(1,))


def test_rule_7_another_nodes_group_is_ignored_by_this_agent_and_restarted_by_its_owner() -> None:
    """Two nodes, a group each: the command for group 1 is node 1's agent's alone."""
    asked = command("respawn_group", 1)
    ignored = plan_group(asked, NODE0, FT, ())
    assert (ignored.verdict, ignored.groups, ignored.rule) == ("ignore", (1,), 7)
    assert plan_group(asked, NODE1, FT, ()) == GroupPlan(
        "groups", groups=(1,), reason="groups [1] restart alone; 1 of 2 go on", rule=8
    )
    # a dead rank on node 1: node 0 saw no exit, but the verdict names rank 1 (group 1)
    far = plan_group(command("respawn"), NODE0, FT, (), cause_rank=1)
    assert (far.verdict, far.rule) == ("ignore", 7)
    near = plan_group(command("respawn"), NODE1, FT, killed(1), cause_rank=1)
    assert (near.verdict, near.groups, near.rule) == ("groups", (1,), 8)
    # the named group is healing on its node (a silence verdict): covered there, ignored here
    healing = plan_group(command("respawn"), NODE1, FT, (), healing=(1,), cause_rank=1)
    assert (healing.verdict, healing.rule, healing.covered) == ("refuse", 5, True)
    assert plan_group(command("respawn"), NODE0, FT, (), cause_rank=1).verdict == "ignore"


def ns(**kw: object) -> argparse.Namespace:
    base = {
        "fault_tolerance": "torchft",
        "replica_groups": 3,
        "nproc_per_group": 1,
        "min_replicas": 1,
        "nproc": None,
        "min_replicas_bound_s": None,
    }
    return argparse.Namespace(**{**base, **kw})


def test_launch_flags_make_the_spec_part_and_refuse_what_cannot_be() -> None:
    spec = fault_tolerance(ns(min_replicas=2))
    assert spec is not None and (spec.replica_groups, spec.min_replicas) == (3, 2)
    assert fault_tolerance(ns(fault_tolerance=None, replica_groups=None)) is None
    for bad in (
        ns(replica_groups=None),
        ns(min_replicas=4),
        ns(nproc=2),
        ns(fault_tolerance=None),
        ns(min_replicas_bound_s=0.5),
    ):
        with pytest.raises(UsageError):
            fault_tolerance(bad)


def test_rule_5_no_exit_while_a_group_heals_is_refused_not_a_gang_restart() -> None:
    plan = plan_group(command("respawn"), THREE, FT, (), healing=(1,))
    assert (plan.verdict, plan.rule, plan.covered) == ("refuse", 5, True)


def test_only_a_refusal_that_a_healing_group_answers_is_covered() -> None:
    """Every other refusal is a failure a human must see (RestartFailed, critical)."""
    plan = plan_group(command("respawn_group", group=7), THREE, FT, ())
    assert (plan.verdict, plan.rule, plan.covered) == ("refuse", 4, False)
