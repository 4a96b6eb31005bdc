"""torchft replica groups across nodes: two agents on loopback, one group each.

`runwatch launch --nnodes 2 --fault-tolerance torchft --replica-groups 2`, once per node,
the processors and Kafka, all real; gloo on CPU, torchft 0.2.0, one rank of
`examples/train_ft.py` per group. Node 0's agent starts the Lighthouse (at
``--master-port + 16``, its start barrier on the next port); node 1's agent joins it there
and starts group 1. Group 1's rank is SIGKILLed on node 1: its agent's exit evidence makes
the dead_rank verdict and the policy's ``respawn``; every agent reads the command, node
0's ignores it (group plan rule 7: group 1 is node 1's), node 1's restarts group 1 alone
(rule 8); group 0's process on node 0 keeps its pid and steps alone meanwhile; group 1
heals from group 0 (torchft's checkpoint transport: no checkpoint directory at all); the
run completes with both groups' weights equal; the audit agrees.

Waiting is a read of the ranks' output or of Kafka with a deadline, never a sleep.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from runwatch.controller.state import GANG_FILE, GangRecord, read_gang_file
from runwatch.controller.topology import PORT_SPAN
from runwatch.schemas.events import AnomalyDetected, RestartCompleted, RestartRequested

from .test_fault_tolerance import REPO, SCRIPT, kill_ranks, python_child, steps, wait_for

pytestmark = [pytest.mark.torch, pytest.mark.integration]


def _record(state: Path) -> GangRecord:
    gang = read_gang_file(state / GANG_FILE)
    assert gang is not None, f"no gang record in {state}"
    return gang.record


def test_a_group_killed_on_node_1_is_restarted_by_node_1s_agent_alone(
    loop: Any, tmp_path: Path
) -> None:
    from tests.integration.controller.conftest import (
        Proc,
        audit_cli,
        free_rendezvous_ports,
        of_run,
        rank_env,
        wait_events,
    )

    run_id = "ft-nodes"
    anomalies = loop.reader(loop.topics.anomalies)
    commands = loop.reader(loop.topics.commands)
    controller = loop.reader(loop.topics.controller)
    base = tmp_path / run_id
    stop_file, sums = base / "stop", base / "sums"
    base.mkdir()
    port = free_rendezvous_ports(PORT_SPAN + 2)  # the incarnations', the Lighthouse's two
    states = [base / "node0", base / "node1"]
    agents = []
    for node in (0, 1):
        args = ["launch", "--bootstrap", loop.bootstrap, "--prefix", loop.prefix]
        args += ["--run-id", run_id, "--launch-id", "ft-nodes-1", "--grace-s", "2"]
        args += ["--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1"]
        args += ["--master-port", str(port), "--state-dir", str(states[node])]
        args += ["--fault-tolerance", "torchft", "--replica-groups", "2", "--"]
        args += [sys.executable, "-u", str(SCRIPT), "--steps", "100000"]
        args += ["--step-delay-s", "0.05", "--timeout-s", "20"]
        args += ["--stop-file", str(stop_file), "--checksum-dir", str(sums)]
        env = rank_env() | {"PYTHONPATH": str(REPO)}
        agents.append(Proc(args, base / f"agent{node}.log", env))
    log0 = states[0] / "logs" / "inc0.rank0.log"
    log1 = states[1] / "logs" / "inc0.rank1.log"
    try:
        wait_for("both groups stepping together", lambda: any(p == (0, 1) for _, p in steps(log1)))
        node0, node1 = _record(states[0]), _record(states[1])
        # each agent started its own group, and only that one
        assert [p.rank for p in node0.ranks] == [0] and [p.rank for p in node1.ranks] == [1]
        pid0, pid1 = node0.ranks[0].pid, node1.ranks[0].pid
        lighthouse = f"http://127.0.0.1:{port + PORT_SPAN}"
        assert lighthouse in (base / "agent1.log").read_text(), "node 1 did not join node 0's"

        python_child_0 = python_child(pid0)
        os.kill(python_child(pid1), signal.SIGKILL)
        (command,) = wait_events(commands, of_run(run_id, RestartRequested))
        assert (command.action, command.cause_kind, command.incarnation) == (
            "respawn",
            "dead_rank",
            0,
        )
        (done,) = wait_events(controller, of_run(run_id, RestartCompleted))
        assert done.command_id == command.command_id and done.checkpoint_step is None
        after1 = _record(states[1])
        assert after1.incarnation == 0 and after1.ranks[0].pid != pid1

        before = len(steps(log1))
        wait_for("group 1 back", lambda: any(p == (0, 1) for _, p in steps(log1)[before:]))
        assert any(p == (0,) for _, p in steps(log0)), "group 0 never stepped alone"
        assert python_child(_record(states[0]).ranks[0].pid) == python_child_0
        # node 0's agent read the command and left it to group 1's owner
        agent0 = (base / "agent0.log").read_text(errors="replace")
        assert "respawn not for this node: groups [1] are another node's" in agent0, agent0

        last = max(steps(log0)[-1][0], steps(log1)[-1][0]) + 10
        (base / "stop.tmp").write_text(str(last))
        (base / "stop.tmp").rename(stop_file)
        for agent in agents:
            assert agent.wait() == 0, agent.log()
        s0 = (sums / "group0.rank0.txt").read_text().split()
        s1 = (sums / "group1.rank0.txt").read_text().split()
        assert s0 == s1 and s0[0] == str(last), "the groups ended on different weights"
        final0, final1 = _record(states[0]), _record(states[1])
        assert (final0.status, final1.status) == ("completed", "completed")
        assert final0.ranks[0].pid == pid0 and final0.incarnation == final1.incarnation == 0

        rejoined = wait_events(
            anomalies,
            lambda e: of_run(run_id, AnomalyDetected)(e) and e.kind == "replica_rejoined",
        )
        assert rejoined[0].replica_group == 1
        # one restart, by one agent, for one failure
        completed = [e for e in controller.events if of_run(run_id, RestartCompleted)(e)]
        assert [c.command_id for c in completed] == [command.command_id]
        assert [e.command_id for e in commands.events if of_run(run_id, RestartRequested)(e)] == [
            command.command_id
        ]
        audit = audit_cli(loop, run_id)
        assert audit.returncode == 0, (audit.stdout, audit.stderr)
    finally:
        for agent in agents:
            agent.close()
        for state in states:
            kill_ranks(state)
