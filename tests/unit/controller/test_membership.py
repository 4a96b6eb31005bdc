"""The next incarnation's nodes: each numbered rule of `controller.membership`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.membership import decide_nodes
from schemas.events import BackendDeclaration

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
