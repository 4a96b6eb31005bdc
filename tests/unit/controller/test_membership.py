"""The next incarnation's nodes and the node failure counts: each rule of `controller.membership`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runwatch.controller.membership import charge_failure, decide_nodes
from runwatch.schemas.events import AnomalyDetected, BackendDeclaration, RestartRequested

ELASTIC = BackendDeclaration(name="torch-ddp", reshardable_checkpoint=True, elastic_restart=True)


def test_rule_1_every_node_ready_restarts_at_full_size_whatever_else():
    decision = decide_nodes(3, [2, 0, 1], min_nnodes=3, backend=None, timeout_s=30)
    assert (decision.verdict, decision.nodes, decision.reason) == ("full", (0, 1, 2), "")


def test_rule_2_the_default_min_nnodes_forbids_shrinking():
    decision = decide_nodes(2, [0], min_nnodes=2, backend=ELASTIC, timeout_s=30)
    assert decision.verdict == "fail" and decision.nodes == ()
    assert decision.reason == (
        "node 1 of 2 lost (no agent ready within 30s); --min-nnodes 2 (default: --nnodes) "
        "forbids shrinking"
    )


def test_rule_3_a_backend_that_said_nothing_is_not_shrunk():
    decision = decide_nodes(2, [0], min_nnodes=1, backend=None, timeout_s=5)
    assert decision.verdict == "fail"
    assert "declared no capabilities (RunStarted.backend)" in decision.reason


@pytest.mark.parametrize(
    ("declared", "why"),
    [
        (
            BackendDeclaration(name="x", reshardable_checkpoint=False, elastic_restart=True),
            "backend x does not declare reshardable_checkpoint",  # rule 4
        ),
        (
            BackendDeclaration(name="x", reshardable_checkpoint=True, elastic_restart=False),
            "backend x does not declare elastic_restart",  # rule 5
        ),
        (BackendDeclaration(name="x"), "does not declare reshardable_checkpoint"),  # 4 first
    ],
)
def test_rules_4_and_5_the_backend_must_declare_both(declared, why):
    decision = decide_nodes(2, [0], min_nnodes=1, backend=declared, timeout_s=5)
    assert decision.verdict == "fail" and decision.reason.endswith(why)


def test_rule_6_not_below_min_nnodes():
    decision = decide_nodes(4, [0, 3], min_nnodes=3, backend=ELASTIC, timeout_s=5)
    assert decision.verdict == "fail"
    assert decision.reason == (
        "nodes 1, 2 of 4 lost (no agent ready within 5s); 2 left, below --min-nnodes 3"
    )


def test_rule_7_shrinks_to_the_ready_nodes_renumbered_in_order():
    decision = decide_nodes(4, [3, 0, 2], min_nnodes=2, backend=ELASTIC, timeout_s=5)
    assert (decision.verdict, decision.nodes) == ("shrink", (0, 2, 3))
    assert [decision.new_rank(n) for n in (0, 2, 3)] == [0, 1, 2]
    assert decision.reason.startswith("node 1 of 4 lost")
    assert "4 -> 3 nodes" in decision.reason
    with pytest.raises(ValueError):
        decision.new_rank(1)


def test_node_0_lost_makes_the_first_survivor_node_0():
    decision = decide_nodes(2, [1], min_nnodes=1, backend=ELASTIC, timeout_s=5)
    assert (decision.verdict, decision.nodes, decision.new_rank(1)) == ("shrink", (1,), 0)


def test_announcements_from_outside_the_gang_are_ignored():
    decision = decide_nodes(2, [0, 1, 7, -1], min_nnodes=2, backend=None, timeout_s=5)
    assert (decision.verdict, decision.nodes) == ("full", (0, 1))


@given(
    nnodes=st.integers(1, 6),
    ready=st.sets(st.integers(0, 5)),
    min_nnodes=st.integers(1, 6),
    reshard=st.booleans(),
    elastic=st.booleans(),
)
def test_survivors_that_heard_the_same_agents_decide_the_same(
    nnodes, ready, min_nnodes, reshard, elastic
):
    min_nnodes = min(min_nnodes, nnodes)
    backend = BackendDeclaration(name="b", reshardable_checkpoint=reshard, elastic_restart=elastic)
    decision = decide_nodes(
        nnodes, sorted(ready), min_nnodes=min_nnodes, backend=backend, timeout_s=1
    )
    again = decide_nodes(
        nnodes, sorted(ready, reverse=True), min_nnodes=min_nnodes, backend=backend, timeout_s=1
    )
    assert decision == again
    if decision.verdict != "fail":
        assert len(decision.nodes) >= min_nnodes
        assert list(decision.nodes) == sorted(decision.nodes)
    if decision.verdict == "shrink":
        assert reshard and elastic and len(decision.nodes) < nnodes


# --------------------------------------------------------------- a node that keeps failing

COMMAND = RestartRequested(
    run_id="r",
    ts_ns=1,
    command_id="c1",
    action="respawn",
    cause_verdict_id="v1",
    cause_kind="dead_rank",
)


def _verdict(rank: int | None, kind: str = "dead_rank", verdict_id: str = "v1"):
    return AnomalyDetected(run_id="r", ts_ns=1, verdict_id=verdict_id, kind=kind, step=3, rank=rank)


def _charge(verdict, ready=(0, 1, 2), failures=()):
    return charge_failure(
        failures, nnodes=3, nproc_per_node=2, command=COMMAND, verdict=verdict, ready=ready
    )


def test_charge_rule_5_the_node_of_the_named_rank_gets_one_failure():
    assert _charge(_verdict(3)) == (0, 1, 0)  # rank 3 of 2 per node: node 1
    assert _charge(_verdict(5), failures=(2, 1)) == (2, 1, 1)  # counts padded to the nodes
    assert _charge(_verdict(0, kind="hang"), failures=(1, 0, 0)) == (2, 0, 0)


def test_charge_rule_1_no_verdict_or_not_the_commands_charges_nobody():
    assert _charge(None, failures=(0, 1, 0)) == (0, 1, 0)
    assert _charge(_verdict(3, verdict_id="other")) == (0, 0, 0)


def test_charge_rule_2_a_models_fault_is_no_nodes_fault():
    assert _charge(_verdict(3, kind="nonfinite_loss")) == (0, 0, 0)


def test_charge_rule_3_a_verdict_naming_no_rank_charges_nobody():
    assert _charge(_verdict(None)) == (0, 0, 0)


def test_charge_rule_4_with_a_node_lost_the_survivor_it_names_is_not_charged():
    # Node 2 is lost; the verdict names a rank of node 1 (it failed its collective on node 2).
    assert _charge(_verdict(3), ready=(0, 1)) == (0, 0, 0)


def test_rule_1_a_failing_count_within_budget_restarts_at_full_size():
    decision = decide_nodes(
        2, [0, 1], min_nnodes=1, backend=ELASTIC, timeout_s=5, failures=(0, 2), failure_budget=2
    )
    assert (decision.verdict, decision.nodes, decision.reason) == ("full", (0, 1), "")
    assert decision.counts((0, 2)) == (0, 2)


def test_rule_7_a_node_over_its_failure_budget_is_dropped():
    decision = decide_nodes(
        3,
        [0, 1, 2],
        min_nnodes=1,
        backend=ELASTIC,
        timeout_s=5,
        failures=(1, 3, 0),
        failure_budget=2,
    )
    assert (decision.verdict, decision.nodes) == ("shrink", (0, 2))
    assert decision.reason == (
        "node 1 of 3 failed 3 times (--node-failure-budget 2): 3 -> 2 nodes (nodes 0, 2, "
        "renumbered from 0), backend torch-ddp"
    )
    assert decision.counts((1, 3, 0)) == (1, 0)  # the survivors keep theirs, renumbered


def test_without_a_budget_no_node_is_dropped_for_failing():
    decision = decide_nodes(2, [0, 1], min_nnodes=1, backend=ELASTIC, timeout_s=5, failures=(9, 9))
    assert decision.verdict == "full"


@pytest.mark.parametrize(
    ("min_nnodes", "backend", "why"),
    [
        (2, ELASTIC, "--min-nnodes 2 (default: --nnodes) forbids shrinking"),  # rule 2
        (1, None, "the run's backend declared no capabilities"),  # rule 3
        (1, BackendDeclaration(name="x"), "backend x does not declare reshardable_checkpoint"),
        (
            1,
            BackendDeclaration(name="x", reshardable_checkpoint=True),
            "backend x does not declare elastic_restart",  # rule 5
        ),
    ],
)
def test_rules_2_to_5_keep_a_failing_node_that_may_not_be_dropped(min_nnodes, backend, why):
    decision = decide_nodes(
        2,
        [0, 1],
        min_nnodes=min_nnodes,
        backend=backend,
        timeout_s=5,
        failures=(0, 3),
        failure_budget=2,
    )
    assert (decision.verdict, decision.nodes) == ("full", (0, 1))
    assert decision.reason.startswith(
        "node 1 of 2 failed 3 times (--node-failure-budget 2); kept: "
    )
    assert why in decision.reason


def test_rule_6_failing_nodes_are_kept_rather_than_going_below_min_nnodes():
    decision = decide_nodes(
        3,
        [0, 1, 2],
        min_nnodes=2,
        backend=ELASTIC,
        timeout_s=5,
        failures=(3, 3, 0),
        failure_budget=2,
    )
    assert (decision.verdict, decision.nodes) == ("full", (0, 1, 2))
    assert decision.reason.endswith("kept: 1 left, below --min-nnodes 2")


def test_a_lost_node_still_fails_the_run_when_a_failing_node_may_not_be_dropped():
    decision = decide_nodes(
        3, [0, 1], min_nnodes=3, backend=ELASTIC, timeout_s=5, failures=(0, 3), failure_budget=2
    )
    assert decision.verdict == "fail" and decision.nodes == ()
    assert decision.reason == (
        "node 2 of 3 lost (no agent ready within 5s); node 1 of 3 failed 3 times "
        "(--node-failure-budget 2); --min-nnodes 3 (default: --nnodes) forbids shrinking"
    )


def test_lost_and_failing_nodes_are_dropped_together():
    decision = decide_nodes(
        4,
        [0, 1, 3],
        min_nnodes=1,
        backend=ELASTIC,
        timeout_s=5,
        failures=(0, 3, 0, 0),
        failure_budget=2,
    )
    assert (decision.verdict, decision.nodes) == ("shrink", (0, 3))


@given(
    nnodes=st.integers(1, 6),
    ready=st.sets(st.integers(0, 5)),
    failures=st.lists(st.integers(0, 4), max_size=6),
    budget=st.integers(0, 3),
    min_nnodes=st.integers(1, 6),
    rank=st.none() | st.integers(0, 11),
)
def test_agents_with_the_same_log_keep_the_same_counts_and_decide_the_same(
    nnodes, ready, failures, budget, min_nnodes, rank
):
    min_nnodes = min(min_nnodes, nnodes)
    ready = {n for n in ready if n < nnodes}
    counts = charge_failure(
        failures,
        nnodes=nnodes,
        nproc_per_node=2,
        command=COMMAND,
        verdict=_verdict(rank),
        ready=sorted(ready),
    )
    again = charge_failure(
        failures,
        nnodes=nnodes,
        nproc_per_node=2,
        command=COMMAND,
        verdict=_verdict(rank),
        ready=sorted(ready, reverse=True),
    )
    assert counts == again and len(counts) == nnodes
    assert sum(counts) - sum(failures[:nnodes]) in (0, 1)
    decision = decide_nodes(
        nnodes,
        ready,
        min_nnodes=min_nnodes,
        backend=ELASTIC,
        timeout_s=1,
        failures=counts,
        failure_budget=budget,
    )
    if decision.verdict != "fail":
        assert len(decision.nodes) >= min_nnodes
        assert all(n in ready for n in decision.nodes)
        assert len(decision.counts(counts)) == len(decision.nodes)
    if decision.verdict == "shrink":
        assert all(counts[n] <= budget for n in decision.nodes)
