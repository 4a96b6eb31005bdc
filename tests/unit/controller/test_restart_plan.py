"""The restart planner (`controller.restart_plan`): each numbered rule, pure, no process."""

from __future__ import annotations

import pytest

from runwatch.controller.elastic import RankExit
from runwatch.controller.launcher import WHOLE_NODE
from runwatch.controller.restart_plan import Heard, Note, plan_restart, plan_stop
from runwatch.controller.topology import NodeTopology
from runwatch.schemas.events import AgentReady, BackendDeclaration, RankStack
from tests.unit.controller.builders import command, multinode, record, spec, verdict

ELASTIC = BackendDeclaration(name="torch-ddp", reshardable_checkpoint=True, elastic_restart=True)
ONE_HOST = spec(nproc=2, rank_failure_budget=1, min_nproc=1)
STACKS = (RankStack(rank=0, host="h", where="f (a.py:1)"), RankStack(rank=1, host="h", note="x"))


def ready(*nodes: int, hosts: dict[int, str] | None = None) -> dict[int, AgentReady]:
    """The AgentReady of ``nodes`` for incarnation 1 of a 2-node gang."""
    hosts = hosts or {}
    return {
        n: AgentReady(
            run_id="r",
            ts_ns=1,
            command_id="c1",
            incarnation=1,
            node_rank=n,
            nnodes=2,
            host=hosts.get(n, f"host{n}"),
            stacks=(RankStack(rank=2 * n, host=f"host{n}", where=f"n{n} (x.py:1)"),),
        )
        for n in nodes
    }


def two_nodes(node_rank: int, **kw):
    """The spec and first record of node ``node_rank`` of a 2-node gang of 2 ranks each."""
    topology = multinode(node_rank, min_nnodes=kw.pop("min_nnodes", 1))
    launched = spec(topology=topology, node_failure_budget=1, node_timeout_s=5.0)
    return launched, record(launched, **kw)


# --------------------------------------------------------------------------- plan_stop


@pytest.mark.parametrize(
    ("exits", "found_dead", "blamed", "counts"),
    [
        pytest.param([RankExit(1, -9, 1.0)], False, (1,), (0, 1), id="rule1-signalled-charged"),
        pytest.param(
            [RankExit(0, 1, 1.0), RankExit(1, 1, 1.2)], False, (0, 1), (1, 1), id="rule1-first-two"
        ),
        pytest.param([RankExit(1, -9, 1.0)], True, (), (), id="rule1-found-dead-charged-before"),
        pytest.param([RankExit(1, 0, 1.0)], False, (), (), id="rule1-clean-exit-charges-nobody"),
        pytest.param([], False, (), (), id="rule1-no-exit"),
    ],
)
def test_rule_1_charges_the_exits_noticed_before_the_stop(exits, found_dead, blamed, counts):
    plan = plan_stop(command(), record(ONE_HOST), exits, found_dead=found_dead, can_ask_peers=False)
    assert plan.blamed == blamed and plan.record.failure_counts == counts


@pytest.mark.parametrize(
    ("action", "kill_now"),
    [
        pytest.param("rollback", True, id="rollback-sigkill"),
        pytest.param("respawn", False, id="respawn-term"),
    ],
)
def test_rule_2_a_rollback_is_killed_at_once(action, kill_now):
    plan = plan_stop(
        command(action=action), record(ONE_HOST), [], found_dead=False, can_ask_peers=False
    )
    assert (plan.kill_now, plan.scope) == (kill_now, WHOLE_NODE)


@pytest.mark.parametrize(
    ("max_restarts", "incarnation", "give_up"),
    [
        pytest.param(0, 0, "--max-restarts 0 reached (after 0)", id="rule3-zero"),
        pytest.param(2, 2, "--max-restarts 2 reached (after 2)", id="rule3-reached"),
        pytest.param(2, 1, "", id="rule3-left"),
        pytest.param(None, 50, "", id="rule3-no-limit"),
    ],
)
def test_rule_3_max_restarts_gives_up_after_the_stop(max_restarts, incarnation, give_up):
    launched = spec(topology=multinode(1, max_restarts=max_restarts))
    plan = plan_stop(
        command(),
        record(launched, incarnation=incarnation),
        [],
        found_dead=False,
        can_ask_peers=True,
    )
    assert plan.give_up == give_up
    assert plan.ask_peers == (not give_up)  # giving up asks nobody


@pytest.mark.parametrize(
    ("topology", "can_ask", "ask"),
    [
        pytest.param(multinode(0), True, True, id="rule4-several-nodes"),
        pytest.param(multinode(0), False, False, id="rule5-no-one-to-ask"),
        pytest.param(NodeTopology(nproc_per_node=2), True, False, id="rule5-one-node"),
    ],
)
def test_rule_4_several_nodes_hear_the_others(topology, can_ask, ask):
    plan = plan_stop(
        command(), record(spec(topology=topology)), [], found_dead=False, can_ask_peers=can_ask
    )
    assert plan.ask_peers == ask and not plan.give_up


# --------------------------------------------------------------------------- plan_restart


def test_rule_1_one_node_restarts_in_place_and_speaks():
    rec = record(ONE_HOST, incarnation=4, master_port=1234, backend=ELASTIC)
    plan = plan_restart(command(), ONE_HOST, rec, None, stacks=STACKS, host="me")
    assert (plan.verdict, plan.speaks, plan.stacks, plan.notes) == ("restart", True, STACKS, ())
    nxt = plan.record
    assert (nxt.incarnation, nxt.topology, nxt.ranks, nxt.backend) == (
        5,
        ONE_HOST.topology,
        (),
        ELASTIC,
    )


@pytest.mark.parametrize(
    "node_rank", [pytest.param(0, id="node0-speaks"), pytest.param(1, id="node1-quiet")]
)
def test_rule_1_several_nodes_without_peers_restart_at_full_size(node_rank):
    launched, rec = two_nodes(node_rank)
    plan = plan_restart(command(world_size=1), launched, rec, None, stacks=(), host="me")
    assert plan.verdict == "restart" and plan.speaks == (node_rank == 0)
    assert (plan.record.topology, plan.record.world_size) == (rec.topology, 4)
    assert plan.notes == (
        Note("warning", "command asks for 1 ranks; a gang of 2 nodes restarts at its size (4)"),
    )


def test_rule_2_charges_the_named_node_and_merges_the_stacks():
    launched, rec = two_nodes(0)
    heard = Heard(ready=ready(0, 1), backend=ELASTIC, cause=verdict(3))
    plan = plan_restart(command(), launched, rec, heard, stacks=STACKS, host="me")
    assert plan.verdict == "restart" and plan.record.node_failure_counts == (0, 1)
    assert plan.notes == (Note("info", "failures per node [0, 1] (--node-failure-budget 1)"),)
    assert [s.rank for s in plan.stacks] == [0, 1, 2]  # this node's own, then node 1's rank 2
    assert plan.stacks[:2] == STACKS and plan.record.backend == ELASTIC


@pytest.mark.parametrize(
    ("min_nnodes", "backend", "why"),
    [
        pytest.param(2, ELASTIC, "--min-nnodes 2 (default: --nnodes) forbids shrinking", id="min"),
        pytest.param(1, None, "the run's backend declared no capabilities", id="no-backend"),
        pytest.param(
            1,
            BackendDeclaration(name="megatron"),
            "does not declare reshardable_checkpoint",
            id="fixed",
        ),
    ],
)
def test_rule_3_a_lost_node_that_may_not_be_dropped_fails_the_run(min_nnodes, backend, why):
    launched, rec = two_nodes(0, min_nnodes=min_nnodes)
    plan = plan_restart(
        command(), launched, rec, Heard(ready=ready(0), backend=backend), stacks=(), host="me"
    )
    assert plan.verdict == "fail" and plan.reason.startswith(
        "node 1 of 2 lost (no agent ready within 5s)"
    )
    assert why in plan.reason
    assert plan.record.status == "running"  # the executor gives up (status failed) after saying so


def test_rule_4_a_node_over_its_budget_drops_itself():
    launched, rec = two_nodes(1, node_failure_counts=(0, 1))
    heard = Heard(ready=ready(0, 1), backend=ELASTIC, cause=verdict(2))
    plan = plan_restart(command(), launched, rec, heard, stacks=(), host="me")
    assert plan.verdict == "drop" and plan.record.status == "dropped"
    assert plan.reason.startswith(
        "node 1 of 2 dropped from incarnation 1: node 1 of 2 failed 2 times "
        "(--node-failure-budget 1): 2 -> 1 nodes"
    )
    assert plan.record.node_failure_counts == (0, 2) and plan.record.incarnation == 0


@pytest.mark.parametrize(
    ("hosts", "addr"),
    [
        pytest.param({1: "node1.example"}, "node1.example", id="announced-host"),
        pytest.param({1: ""}, "me", id="no-host-announced-this-agent"),
    ],
)
def test_rule_5_node_1_becomes_node_0_when_node_0_is_lost(hosts, addr):
    launched, rec = two_nodes(1)
    heard = Heard(ready=ready(1, hosts=hosts), backend=ELASTIC)
    plan = plan_restart(command(), launched, rec, heard, stacks=(), host="me")
    t = plan.record.topology
    assert (plan.verdict, plan.speaks) == ("restart", True)
    assert (t.nnodes, t.node_rank, t.master_addr, t.master_port) == (1, 0, addr, 30000)
    assert plan.record.failure_counts == (0, 0)  # a shrink starts the rank counts over
    assert Note("warning", "elastic: 2 -> 1 nodes: 4 -> 2 ranks") in plan.notes


def test_rule_5_node_0_goes_on_alone_at_its_own_address():
    launched, rec = two_nodes(0)
    plan = plan_restart(
        command(), launched, rec, Heard(ready=ready(0), backend=ELASTIC), stacks=(), host="me"
    )
    t = plan.record.topology
    assert (t.nnodes, t.node_rank, t.master_addr) == (1, 0, "10.0.0.1")
    assert plan.notes[0].text.startswith("elastic by nodes: node 1 of 2 lost")
    assert plan.notes[0].text.endswith(
        "2 -> 1 nodes (node 0, renumbered from 0), backend torch-ddp"
    )


@pytest.mark.parametrize(
    ("counts", "requested", "size", "note"),
    [
        pytest.param(
            (0, 2),
            None,
            1,
            "elastic: rank 1 failed 2 times (budget 1): 2 -> 1 ranks",
            id="over-budget",
        ),
        pytest.param((0, 1), None, 2, None, id="within-budget"),
        pytest.param((0, 0), 3, 3, "elastic: command asks for 3 ranks", id="command-wins"),
    ],
)
def test_rule_6_one_node_sizes_by_its_ranks(counts, requested, size, note):
    rec = record(ONE_HOST, failure_counts=counts)
    plan = plan_restart(command(world_size=requested), ONE_HOST, rec, None, stacks=(), host="me")
    nxt = plan.record
    assert (nxt.world_size, nxt.topology.nproc_per_node, nxt.topology.nnodes) == (size, size, 1)
    assert plan.notes == (() if note is None else (Note("warning", note),))
    if size != 2:
        assert nxt.failure_counts == (0,) * size


def test_rule_6_never_below_min_nproc():
    launched = spec(nproc=2, rank_failure_budget=0, min_nproc=2)
    plan = plan_restart(
        command(), launched, record(launched, failure_counts=(0, 5)), None, stacks=(), host="me"
    )
    assert plan.record.world_size == 2 and plan.notes == ()


def test_rule_7_the_next_incarnation_starts_the_whole_node_with_no_ranks_yet():
    launched, rec = two_nodes(1, incarnation=2)
    plan = plan_restart(
        command(), launched, rec, Heard(ready=ready(0, 1), backend=ELASTIC), stacks=(), host="me"
    )
    assert (plan.verdict, plan.start, plan.speaks) == ("restart", WHOLE_NODE, False)
    assert (plan.record.incarnation, plan.record.ranks, plan.record.topology.node_rank) == (
        3,
        (),
        1,
    )
