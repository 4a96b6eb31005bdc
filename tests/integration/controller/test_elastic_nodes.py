"""Elastic by whole nodes: two agents on loopback, node 1's agent SIGKILLed with its rank.

Nothing comes from node 1 any more. Rank 0 (node 0) fails its next collective on the dead
peer and exits 1; node 0's agent names it in a RankExited, the processors raise dead_rank,
the policy signs a respawn. Node 0's agent stops its rank, announces itself ready for
incarnation 1 (AgentReady) and waits ``--node-timeout`` for node 1's agent, which never
comes. Then `controller.membership` decides:

* with ``--min-nnodes 1`` (and `examples/train_ddp.py` declaring torch-ddp's reshardable
  checkpoint and elastic restart in its RunStarted) the run resumes on node 0 alone, one
  rank, from the DCP checkpoint the two ranks wrote, with the global batch preserved (the
  one rank draws the two ranks' samples of each step);
* without it, the run fails: one RestartFailed saying node 1 is lost and ``--min-nnodes``
  forbids shrinking, RunEnded ``failed``, the agent exits 1.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from runwatch.schemas.events import (
    AgentReady,
    CheckpointCommitted,
    RestartCompleted,
    RestartFailed,
    RestartRequested,
    RunEnded,
    RunStarted,
)

from .conftest import Proc, of_run, reference_losses, wait_events
from .test_multinode import _agent as _node_agent
from .test_multinode import _free_port_pair, _logs, _record

pytestmark = [pytest.mark.integration, pytest.mark.torch]

STEPS = 40
SCRIPT_ARGS = ["--steps", str(STEPS), "--seed", "3", "--step-delay-s", "0.1"]


def _agent(loop, base, run_id: str, node: int, port: int, extra: list[str]) -> Proc:
    return _node_agent(loop, base, run_id, node, port, SCRIPT_ARGS, ["--node-timeout", "5", *extra])


def _lose_node_1(loop, base, run_id: str, agents: list[Proc]) -> None:
    """Once a checkpoint is committed, SIGKILL node 1's agent, then its rank (the node dies)."""
    checkpoints = loop.reader(loop.topics.checkpoints)
    wait_events(checkpoints, lambda e: of_run(run_id, CheckpointCommitted)(e) and e.step >= 10)
    agents[1].kill()  # first the agent, so no exit evidence can come from node 1
    for proc in _record(base, 1).ranks:
        os.killpg(proc.pid, signal.SIGKILL)


def test_a_lost_node_shrinks_the_run_to_the_survivor_with_min_nnodes_1(loop, tmp_path):
    run_id = "lost-node-shrinks"
    runs = loop.reader(loop.topics.runs)
    commands = loop.reader(loop.topics.commands)
    controller = loop.reader(loop.topics.controller)
    base = tmp_path / run_id
    base.mkdir()
    port = _free_port_pair()
    agents = [_agent(loop, base, run_id, n, port, ["--min-nnodes", "1"]) for n in (0, 1)]
    try:
        _lose_node_1(loop, base, run_id, agents)
        (tmp_path / "ref").mkdir()
        reference = reference_losses(tmp_path / "ref", SCRIPT_ARGS, nproc=2)
        assert agents[0].wait() == 0, _logs(base)
    finally:
        for agent in agents:
            agent.close()

    # The trainer declared what its backend can do; the agent read it from RunStarted.
    (started,) = wait_events(runs, lambda e: of_run(run_id, RunStarted)(e) and e.incarnation == 0)
    assert started.backend is not None and started.backend.name == "torch-ddp"
    assert started.backend.reshardable_checkpoint and started.backend.elastic_restart
    (command,) = wait_events(commands, of_run(run_id, RestartRequested))
    assert command.incarnation == 0
    # Only node 0 announced itself for incarnation 1; node 0 still speaks for the gang.
    ready, done = wait_events(
        controller, lambda e: of_run(run_id)(e) and isinstance(e, AgentReady | RestartCompleted), 2
    )
    assert isinstance(ready, AgentReady) and (ready.incarnation, ready.node_rank) == (1, 0)
    assert isinstance(done, RestartCompleted) and done.command_id == command.command_id
    assert done.world_size == 1 and done.checkpoint_step is not None and done.checkpoint_step >= 10

    record = _record(base, 0)
    assert (record.incarnation, record.status, record.world_size) == (1, "completed", 1)
    assert (record.topology.nnodes, record.topology.node_rank) == (1, 0)
    assert record.backend is not None and record.backend.name == "torch-ddp"
    log = (base / "agent0.log").read_text()
    assert "elastic by nodes: node 1 of 2 lost (no agent ready within 5s): 2 -> 1 nodes" in log

    metrics = json.loads((base / "trace" / "metrics.json").read_text())
    assert (metrics["incarnation"], metrics["world_size"]) == (1, 1)
    assert metrics["resumed_from"] == done.checkpoint_step
    resumed = {int(k): v for k, v in metrics["losses"].items()}
    assert sorted(resumed) == list(range(done.checkpoint_step + 1, STEPS + 1))

    # The global batch is preserved: the one rank draws, step by step, exactly the samples
    # the two ranks of the uninterrupted reference drew between them...
    def samples(root, ranks):
        out: dict[int, set[int]] = {}
        for r in ranks:
            for line in (root / f"samples.rank{r}.jsonl").read_text().splitlines():
                row = json.loads(line)
                out.setdefault(row["step"], set()).update(row["ids"])
        return out

    ours, theirs = samples(base / "trace", [0]), samples(tmp_path / "ref" / "trace", [0, 1])
    assert all(ours[s] == theirs[s] for s in resumed)
    # ... so the losses are the reference's, to rounding (one rank sums what two averaged).
    assert resumed == pytest.approx({s: reference[s] for s in resumed}, rel=1e-3)
    assert "saved by 2 ranks, now 1" in (base / "node0" / "logs" / "inc1.rank0.log").read_text()


def test_a_lost_node_fails_the_run_when_it_may_not_shrink(loop, tmp_path):
    run_id = "lost-node-fails"
    runs = loop.reader(loop.topics.runs)
    controller = loop.reader(loop.topics.controller)
    base = tmp_path / run_id
    base.mkdir()
    port = _free_port_pair()
    agents = [_agent(loop, base, run_id, n, port, []) for n in (0, 1)]
    try:
        _lose_node_1(loop, base, run_id, agents)
        assert agents[0].wait() == 1, _logs(base)
    finally:
        for agent in agents:
            agent.close()
    reason = (
        "node 1 of 2 lost (no agent ready within 5s); --min-nnodes 2 (default: --nnodes) "
        "forbids shrinking"
    )
    (failed,) = wait_events(controller, of_run(run_id, RestartFailed))
    assert failed.reason == reason
    (ended,) = wait_events(runs, lambda e: of_run(run_id, RunEnded)(e) and e.status == "failed")
    assert ended.reason == reason
    record = _record(base, 0)
    assert (record.incarnation, record.status) == (0, "failed")
    assert f"failed: {reason}" in (base / "agent0.log").read_text()
