"""A node that keeps failing, its agent alive: two agents on loopback, real gloo, real DCP.

Rank 1 (node 1) SIGKILLs itself in incarnation 0 and again in incarnation 1. Each time its
agent's RankExited makes the dead_rank verdict name rank 1, the policy signs a respawn,
and both agents read the same verdict at the command's ``source`` and charge node 1
(`controller.membership.charge_failure`). With ``--node-failure-budget 1`` the first
failure restarts both nodes at full size; the second is one too many: both agents decide,
each alone, to drop node 1. Node 1's agent stops (its rank stays down) and exits 3; node 0
resumes alone, one rank, from the same DCP checkpoint with the global batch preserved
(``--min-nnodes 1``, torch-ddp declaring a reshardable checkpoint and elastic restarts).

The hang test: rank 1 (node 1) hangs; before the gang is stopped each agent asks its own
rank for its stacks and announces them in its AgentReady, and node 0's RestartCompleted
lists both nodes' ranks.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from runwatch.schemas.events import (
    AgentReady,
    AnomalyDetected,
    RestartCompleted,
    RestartRequested,
)

from .conftest import Proc, free_rendezvous_ports, of_run, reference_losses, wait_events
from .test_multinode import _agent as _node_agent
from .test_multinode import _logs, _record

pytestmark = [pytest.mark.integration, pytest.mark.torch]

STEPS = 40
SCRIPT_ARGS = ["--steps", str(STEPS), "--seed", "4", "--step-delay-s", "0.1"]
# Rank 1 dies in every incarnation it runs in (a fault fires in one incarnation each).
FAILING = ["--inject", "kill@8:rank=1:incarnation=0,kill@14:rank=1:incarnation=1"]
HOST = socket.gethostname()


def _free_ports(count: int) -> int:
    """A port P such that P .. P + count - 1 (incarnations 0 ..) are free (conftest)."""
    return free_rendezvous_ports(count)


def test_a_node_that_keeps_failing_is_dropped_and_the_run_completes_on_node_0(loop, tmp_path):
    run_id = "failing-node"
    anomalies = loop.reader(loop.topics.anomalies)
    commands = loop.reader(loop.topics.commands)
    controller = loop.reader(loop.topics.controller)
    base = tmp_path / run_id
    base.mkdir()
    port = _free_ports(3)
    flags = ["--node-timeout", "30", "--min-nnodes", "1", "--node-failure-budget", "1"]
    agents = [
        _node_agent(loop, base, run_id, node, port, [*SCRIPT_ARGS, *FAILING], flags)
        for node in (0, 1)
    ]
    try:
        (tmp_path / "ref").mkdir()
        reference = reference_losses(tmp_path / "ref", SCRIPT_ARGS, nproc=2)
        assert agents[1].wait() == 3, _logs(base)
        assert agents[0].wait() == 0, _logs(base)
    finally:
        for agent in agents:
            agent.close()

    # Two verdicts, both naming the culprit on node 1; one command each.
    verdicts = wait_events(anomalies, of_run(run_id, AnomalyDetected), 2)
    assert [(v.kind, v.incarnation, v.rank) for v in verdicts] == [
        ("dead_rank", 0, 1),
        ("dead_rank", 1, 1),
    ]
    first, second = wait_events(commands, of_run(run_id, RestartRequested), 2)
    assert (first.incarnation, second.incarnation) == (0, 1)
    assert [c.cause_verdict_id for c in (first, second)] == [v.verdict_id for v in verdicts]

    # Both agents announced themselves both times (node 1's agent is alive: not lost).
    said = wait_events(
        controller, lambda e: of_run(run_id)(e) and isinstance(e, AgentReady | RestartCompleted), 6
    )
    ready = sorted((e.incarnation, e.node_rank) for e in said if isinstance(e, AgentReady))
    assert ready == [(1, 0), (1, 1), (2, 0), (2, 1)]
    done = [e for e in said if isinstance(e, RestartCompleted)]
    assert [(d.command_id, d.world_size) for d in done] == [
        (first.command_id, 2),
        (second.command_id, 1),
    ]
    resumed_at = done[1].checkpoint_step
    assert resumed_at is not None and resumed_at >= 10

    # Node 1's agent reached the same decision about itself and stopped.
    dropped = _record(base, 1)
    assert (dropped.status, dropped.incarnation) == ("dropped", 1)
    assert dropped.node_failure_counts == (0, 2)
    assert not (base / "node1" / "logs" / "inc2.rank1.log").exists()
    why = "node 1 of 2 failed 2 times (--node-failure-budget 1)"
    assert f"node 1 of 2 dropped from incarnation 2: {why}" in (base / "agent1.log").read_text()
    # Node 0 went on alone: the same reason, one node, one rank.
    kept = _record(base, 0)
    assert (kept.status, kept.incarnation, kept.world_size) == ("completed", 2, 1)
    assert (kept.topology.nnodes, kept.node_failure_counts) == (1, (0,))
    assert f"elastic by nodes: {why}: 2 -> 1 nodes" in (base / "agent0.log").read_text()

    # From the same DCP checkpoint, with the global batch preserved: the reference's losses.
    metrics = json.loads((base / "trace" / "metrics.json").read_text())
    assert (metrics["incarnation"], metrics["world_size"]) == (2, 1)
    assert metrics["resumed_from"] == resumed_at
    resumed = {int(k): v for k, v in metrics["losses"].items()}
    assert sorted(resumed) == list(range(resumed_at + 1, STEPS + 1))
    assert resumed == pytest.approx({s: reference[s] for s in resumed}, rel=1e-3)


def test_a_hang_on_two_nodes_shows_the_stacks_of_both_nodes_ranks(loop, tmp_path, capsys):
    run_id = "two-node-hang"
    commands = loop.reader(loop.topics.commands)
    controller = loop.reader(loop.topics.controller)
    base = tmp_path / run_id
    base.mkdir()
    port = _free_ports(2)
    args = ["--steps", "16", "--seed", "2", "--inject", "hang@8:rank=1:secs=600"]
    agents: list[Proc] = [_node_agent(loop, base, run_id, n, port, args) for n in (0, 1)]
    try:
        (command,) = wait_events(commands, of_run(run_id, RestartRequested))
        assert command.cause_kind in ("hang", "dead_rank")
        for agent in agents:
            assert agent.wait() == 0, _logs(base)
    finally:
        for agent in agents:
            agent.close()

    said = wait_events(
        controller, lambda e: of_run(run_id)(e) and isinstance(e, AgentReady | RestartCompleted), 3
    )
    announced = {e.node_rank: e for e in said if isinstance(e, AgentReady)}
    assert [s.rank for s in announced[1].stacks] == [1]  # node 1 announced its own rank's
    (done,) = [e for e in said if isinstance(e, RestartCompleted)]
    assert done.command_id == command.command_id
    where = {s.rank: s for s in done.stacks}
    assert sorted(where) == [0, 1] and {s.host for s in done.stacks} == {HOST}
    assert where[1].where.startswith("before_step (examples/faults.py:"), where[1]
    assert where[0].where and "faults.py" not in where[0].where, where[0]  # in the collective
    # Each node's full stacks stay in its own agent's state directory.
    full = (base / "node1" / "stacks" / "inc0.rank1.txt").read_text()
    assert "in before_step" in full
    assert Path(done.stacks_dir) == base / "node0" / "stacks"

    from runwatch.cli import main

    argv = ["--bootstrap", loop.bootstrap, "--prefix", loop.prefix, "--app-id", loop.app_id]
    assert main(["status", *argv, "--run", run_id]) == 0
    out = capsys.readouterr().out
    ranks = {line.split()[1] for line in out.splitlines() if line.strip().startswith("rank ")}
    assert ranks == {"0", "1"}, out
