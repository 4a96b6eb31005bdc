"""Two nodes' agents of a torchft run, each with its own replica group: who restarts what.

Real processes (plain Python sleepers standing in for the groups' ranks: nothing here
talks to a Lighthouse), no Kafka: what an agent would publish is collected, and the
verdict a command names is what `controller.loop.PeerWatch.cause` would have read.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

from runwatch.controller.state import ControllerState, FaultToleranceSpec, GangFile
from runwatch.controller.supervisor import RunSupervisor
from runwatch.controller.torchft_compat import JoinedLighthouse
from runwatch.controller.torchft_launcher import ReplicaLayout, TorchFTLauncher
from runwatch.schemas.events import (
    AgentReady,
    AnomalyDetected,
    BackendDeclaration,
    Event,
    RestartCompleted,
    RestartRequested,
)
from tests.unit.controller.builders import command, multinode, spec, verdict

SLEEPER = "import time\ntime.sleep(600)\n"
NOWHERE = JoinedLighthouse(address="http://127.0.0.1:1", barrier="http://127.0.0.1:2")


@dataclass
class Cause:
    """The verdict every agent reads for a command (`controller.supervisor.Peers`)."""

    verdict: AnomalyDetected | None

    def backend(self, run_id: str) -> BackendDeclaration | None:
        return None

    def cause(self, command: RestartRequested) -> AnomalyDetected | None:
        return self.verdict

    def await_ready(
        self, run_id: str, incarnation: int, nnodes: int, timeout_s: float
    ) -> Mapping[int, AgentReady]:
        raise AssertionError("a group restart asks no other agent")


def _agent(tmp_path, node: int, peers: Cause) -> tuple[RunSupervisor, list[Event]]:
    launched = spec(
        argv=(sys.executable, "-c", SLEEPER),
        grace_s=0.2,
        topology=multinode(node, nproc_per_node=1),
        fault_tolerance=FaultToleranceSpec(replica_groups=2),
    )
    state = ControllerState(tmp_path / f"node{node}")
    rec = launched.first_record()
    state.save_gang(GangFile(spec=launched, record=rec))
    layout = ReplicaLayout(groups=2, nodes=2, node=node)
    published: list[Event] = []
    sup = RunSupervisor(
        state=state,
        spec=launched,
        record=rec,
        launcher=TorchFTLauncher(state, launched, layout, NOWHERE),
        publish=published.append,
        announce_end=lambda *_: None,
        peers=peers,
    )
    sup.launch(None)
    return sup, published


def test_only_the_agent_that_owns_the_group_named_by_the_verdict_restarts_it(tmp_path) -> None:
    """A dead rank 1 (group 1, node 1): node 0 leaves its rank alone and says nothing."""
    peers = Cause(verdict(rank=1))
    node0, said0 = _agent(tmp_path, 0, peers)
    node1, said1 = _agent(tmp_path, 1, peers)
    try:
        assert [p.rank for p in node0.record.ranks] == [0]
        assert [p.rank for p in node1.record.ranks] == [1]
        pid0, pid1 = node0.record.ranks[0].pid, node1.record.ranks[0].pid
        for agent in (node0, node1):
            agent.execute(command(), time.monotonic())
        assert node0.record.ranks[0].pid == pid0 and said0 == []
        assert node1.record.ranks[0].pid != pid1 and node1.record.incarnation == 0
        (done,) = said1
        assert isinstance(done, RestartCompleted) and done.checkpoint_step is None
        # both recorded the command as processed: neither executes it again
        for agent in (node0, node1):
            assert agent.state.processed == {"c1"}
        # a respawn_group for group 0 is node 0's
        asked = command(
            command_id="c2", action="respawn_group", replica_group=0, cause_kind="replica_lost"
        )
        node1.execute(asked, time.monotonic())
        assert said1 == [done]
        node0.execute(asked, time.monotonic())
        assert node0.record.ranks[0].pid != pid0 and len(said0) == 1
    finally:
        for agent in (node0, node1):
            agent.stop()
