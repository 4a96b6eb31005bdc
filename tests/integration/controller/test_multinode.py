"""Two nodes on loopback: one `runwatch launch` agent per node, restarts gang-wide via Kafka.

Each agent is its own process with its own state directory (``<run>/node<I>``), starting
one gloo rank of `examples/train_ddp.py`; the two ranks rendezvous at node 0's address on
the incarnation's port. Rank 1 (node 1) SIGKILLs itself at step 19: node 1's agent names it
in a RankExited, the processors raise one dead_rank naming rank 1 and the host, the policy
signs one respawn, and both agents, each on its own reading of the commands topic, stop
their rank and start incarnation 1 from the shared DCP checkpoint.

A second test runs an agent under an ``srun``-like environment (SLURM's variables, no
topology flags): the node's ranks get their places from SLURM.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Sequence

import pytest

from runwatch.controller.state import GANG_FILE, GangRecord, read_gang_file
from runwatch.schemas.events import (
    AgentReady,
    AnomalyDetected,
    CommandRejected,
    RankExited,
    RestartCompleted,
    RestartRequested,
)

from .conftest import (
    SCRIPT,
    WAIT_S,
    Proc,
    ended_liveness,
    free_rendezvous_ports,
    of_run,
    rank_env,
    reference_losses,
    wait_events,
)

pytestmark = [pytest.mark.integration, pytest.mark.torch]

STEPS = 40
KILL_AT = 19
SCRIPT_ARGS = ["--steps", str(STEPS), "--seed", "2"]
HOST = socket.gethostname()


def _free_port_pair() -> int:
    """A port P such that P and P + 1 (incarnations 0 and 1) are free (conftest)."""
    return free_rendezvous_ports(2)


def _agent(
    loop, base, run_id: str, node: int, port: int, script_args, extra: Sequence[str] = ()
) -> Proc:
    """`runwatch launch` as node ``node`` of 2 (one rank), ``extra`` launch flags added."""
    args = [
        "launch",
        "--bootstrap",
        loop.bootstrap,
        "--prefix",
        loop.prefix,
        "--nnodes",
        "2",
        "--node-rank",
        str(node),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "--nproc-per-node",
        "1",
        "--run-id",
        run_id,
        "--checkpoint-dir",
        str(base / "ckpt"),
        "--state-dir",
        str(base / f"node{node}"),
        "--grace-s",
        "5",
        "--command-timeout",
        "60",
        *extra,
        "--",
        sys.executable,
        str(SCRIPT),
        "--trace-dir",
        str(base / "trace"),
        "--checkpoint-every",
        "5",
        *script_args,
    ]
    return Proc(args, base / f"agent{node}.log", rank_env())


def _drain(reader) -> list:
    """Every event the topic holds now (its writers have exited: nothing more comes)."""
    tps = list(reader.consumer.assignment())
    ends = reader.consumer.end_offsets(tps)
    return reader.wait_for(lambda _: all(reader.consumer.position(tp) >= ends[tp] for tp in tps))


def _record(base, node: int) -> GangRecord:
    """Node ``node``'s agent's gang record (what happened), read only."""
    return _state_record(base / f"node{node}")


def _state_record(state) -> GangRecord:
    """The gang record in the agent state directory ``state``, read only."""
    gang = read_gang_file(state / GANG_FILE)
    assert gang is not None, f"no gang record in {state}"
    return gang.record


def _logs(base) -> str:
    out = []
    for path in sorted(base.glob("agent*.log")) + sorted(base.glob("node*/logs/*.log")):
        out.append(f"--- {path.relative_to(base)}\n{path.read_text(errors='replace')[-3000:]}")
    return "\n".join(out)


def test_a_rank_killed_on_node_1_restarts_both_nodes_from_the_checkpoint(loop, tmp_path):
    run_id = "two-nodes"
    heartbeats = loop.reader(loop.topics.heartbeats)
    anomalies = loop.reader(loop.topics.anomalies)
    commands = loop.reader(loop.topics.commands)
    controller = loop.reader(loop.topics.controller)
    base = tmp_path / run_id
    base.mkdir()
    port = _free_port_pair()
    args = [*SCRIPT_ARGS, "--inject", f"kill@{KILL_AT}:rank=1"]
    agents = [_agent(loop, base, run_id, node, port, args) for node in (0, 1)]
    try:
        # The reference runs meanwhile: same seed, same world size, one host, no Kafka.
        (tmp_path / "ref").mkdir()
        reference = reference_losses(tmp_path / "ref", SCRIPT_ARGS, nproc=2)
        for agent in agents:
            assert agent.wait() == 0, _logs(base)
    finally:
        for agent in agents:
            agent.close()

    # Node 1's agent saw its rank die and said so, naming the global rank and its host.
    (exit_1,) = wait_events(
        heartbeats, lambda e: of_run(run_id, RankExited)(e) and e.rank == 1 and e.signal
    )
    assert (exit_1.incarnation, exit_1.signal, exit_1.host) == (0, 9, HOST)
    # Node 0's rank fails its collective a moment later; its agent holds that exit back, so
    # the culprit's evidence is first in the partition whatever the two agents' timing.
    exits = [e for e in _drain(heartbeats) if of_run(run_id, RankExited)(e)]
    assert next(e.rank for e in exits if e.incarnation == 0) == 1
    # One verdict, naming the culprit: rank 0 on node 0 (blocked on it, then failing) is not.
    (dead,) = wait_events(anomalies, of_run(run_id, AnomalyDetected))
    assert (dead.kind, dead.incarnation, dead.rank) == ("dead_rank", 0, 1)
    assert f"rank 1 on {HOST} exited (signal 9 (SIGKILL)" in dead.detail
    assert dead.source.topic == loop.topics.heartbeats
    (command,) = wait_events(commands, of_run(run_id, RestartRequested))
    assert (command.action, command.incarnation) == ("respawn", 0)
    # Node 0's agent speaks for the gang: one RestartCompleted for the one command.
    said = [e for e in _drain(controller) if e.run_id == run_id]
    # Each agent announced itself ready for incarnation 1; both were heard: full size.
    ready = [e for e in said if isinstance(e, AgentReady)]
    assert sorted((e.node_rank, e.incarnation, e.command_id) for e in ready) == [
        (0, 1, command.command_id),
        (1, 1, command.command_id),
    ]
    (done,) = [e for e in said if not isinstance(e, AgentReady)]
    assert isinstance(done, RestartCompleted) and done.command_id == command.command_id
    assert done.world_size == 2 and done.checkpoint_step in (10, 15)

    # Both agents executed the command exactly once and ran incarnation 1 to completion.
    for node in (0, 1):
        record = _record(base, node)
        assert (record.incarnation, record.status) == (1, "completed"), _logs(base)
        assert record.topology.node_rank == node
        assert [r.rank for r in record.ranks] == [node]
        processed = (base / f"node{node}" / "processed.jsonl").read_text().splitlines()
        assert [json.loads(line)["command_id"] for line in processed] == [command.command_id]
        assert (base / f"node{node}" / "logs" / f"inc1.rank{node}.log").is_file()
    assert "rendezvous port" in (base / "agent1.log").read_text()

    metrics = json.loads((base / "trace" / "metrics.json").read_text())
    assert (metrics["incarnation"], metrics["world_size"]) == (1, 2)
    assert metrics["resumed_from"] == done.checkpoint_step
    resumed = {int(k): v for k, v in metrics["losses"].items()}
    assert sorted(resumed) == list(range(done.checkpoint_step + 1, STEPS + 1))
    assert resumed == {s: reference[s] for s in resumed}  # bit for bit, step for step

    liveness = ended_liveness(loop, run_id, incarnation=1)
    assert liveness.anomaly_counts == {"dead_rank": 1}, liveness.anomaly_counts


def _await_record(base, node: int, done, timeout_s: float = WAIT_S) -> GangRecord:
    """Node ``node``'s gang record once ``done(record)`` (polling a file the agent writes)."""
    deadline = time.monotonic() + timeout_s
    while True:
        gang = read_gang_file(base / f"node{node}" / GANG_FILE)
        record = None if gang is None else gang.record
        if record is not None and done(record):
            return record
        assert time.monotonic() < deadline, f"node {node}: {record}\n{_logs(base)}"
        time.sleep(0.1)  # polling a file, not synchronising on time


def test_a_killed_node_agent_is_adopted_and_repeats_nothing(loop, tmp_path):
    run_id = "two-nodes-adopted"
    commands = loop.reader(loop.topics.commands)
    controller = loop.reader(loop.topics.controller)
    base = tmp_path / run_id
    base.mkdir()
    # Long enough after the respawn (70 steps x >= 0.1 s) for the handover to happen mid-run.
    args = ["--steps", "80", "--inject", "kill@8:rank=1", "--step-delay-s", "0.1"]
    port = _free_port_pair()
    agents = [_agent(loop, base, run_id, node, port, args) for node in (0, 1)]
    successor = None
    try:
        (command,) = wait_events(commands, of_run(run_id, RestartRequested))
        restarted = _await_record(base, 1, lambda r: r.incarnation == 1 and r.ranks)
        agents[1].kill()  # node 1's agent dies; its rank runs on in its own session
        pids = [r.pid for r in restarted.ranks]
        successor = Proc(
            ["controller", "--state-dir", str(base / "node1")], base / "adopter.log", rank_env()
        )
        (replayed,) = wait_events(controller, of_run(run_id, CommandRejected))
        assert replayed.command_id == command.command_id
        assert replayed.reason.startswith("replayed")
        assert successor.wait() == 0, _logs(base) + successor.log()
        assert agents[0].wait() == 0, _logs(base)
    finally:
        for proc in [*agents, *([successor] if successor else [])]:
            proc.close()
    assert "adopted run two-nodes-adopted, incarnation 1" in successor.log()
    for node in (0, 1):
        record = _record(base, node)
        assert (record.incarnation, record.status) == (1, "completed"), _logs(base)
        processed = (base / f"node{node}" / "processed.jsonl").read_text()
        assert processed.count("command_id") == 1  # exactly once per agent, crash or not
    assert [r.pid for r in _record(base, 1).ranks] == pids
    metrics = json.loads((base / "trace" / "metrics.json").read_text())
    assert max(int(k) for k in metrics["losses"]) == 80 and metrics["incarnation"] == 1
    done = [e for e in _drain(controller) if e.run_id == run_id and not isinstance(e, AgentReady)]
    assert [type(e).__name__ for e in done] == ["RestartCompleted", "CommandRejected"]


# An srun task's view of a one-node step with two GPUs (no topology flags at all).
SRUN_ENV = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_NNODES": "1",
    "SLURM_NTASKS": "1",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_PROCID": "0",
    "SLURM_NODEID": "0",
    "SLURM_GPUS_ON_NODE": "2",
    "SLURM_JOB_NODELIST": "localhost",
    "SLURM_STEP_NODELIST": "localhost",
}
PRINT_ENV = (
    "import json, os\n"
    "keys = ('RANK', 'LOCAL_RANK', 'GROUP_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE',\n"
    "        'MASTER_ADDR', 'MASTER_PORT', 'TORCHELASTIC_RESTART_COUNT', 'RUNWATCH_RUN_ID')\n"
    "print('ENV ' + json.dumps({k: os.environ.get(k) for k in keys}), flush=True)\n"
)


def test_an_srun_task_launches_its_node_from_slurms_variables(loop, tmp_path):
    state = tmp_path / "state"
    args = ["launch", "--bootstrap", loop.bootstrap, "--prefix", loop.prefix]
    args += ["--state-dir", str(state), "--", sys.executable, "-c", PRINT_ENV]
    agent = Proc(args, tmp_path / "agent.log", rank_env() | SRUN_ENV)
    try:
        assert agent.wait() == 0, agent.log()
    finally:
        agent.close()
    assert "run slurm-4242.0" in agent.log()
    seen = []
    for rank in (0, 1):
        text = (state / "logs" / f"inc0.rank{rank}.log").read_text()
        seen.append(json.loads(text.split("ENV ", 1)[1].splitlines()[0]))
    port = str(20000 + 4242)
    assert seen == [
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "GROUP_RANK": "0",
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "localhost",
            "MASTER_PORT": port,
            "TORCHELASTIC_RESTART_COUNT": "0",
            "RUNWATCH_RUN_ID": "slurm-4242.0",
        }
        for rank in (0, 1)
    ]
    record = _state_record(state)
    assert record.status == "completed" and record.topology.source == "slurm"


def test_two_srun_tasks_are_two_nodes_of_one_gang(loop, tmp_path):
    home = tmp_path / "home"
    agents = []
    for node in (0, 1):
        env = rank_env() | SRUN_ENV
        env |= {
            "RUNWATCH_HOME": str(home),
            "SLURM_JOB_ID": "4243",
            "SLURM_NNODES": "2",
            "SLURM_NTASKS": "2",
            "SLURM_PROCID": str(node),
            "SLURM_NODEID": str(node),
            "SLURM_GPUS_ON_NODE": "1",
            "SLURM_JOB_NODELIST": "localhost,localhost",
            "SLURM_STEP_NODELIST": "localhost,localhost",
        }
        args = ["launch", "--bootstrap", loop.bootstrap, "--prefix", loop.prefix]
        args += ["--", sys.executable, "-c", PRINT_ENV]
        agents.append(Proc(args, tmp_path / f"agent{node}.log", env))
    try:
        for agent in agents:
            assert agent.wait() == 0, agent.log()
    finally:
        for agent in agents:
            agent.close()
    seen = []
    for node in (0, 1):  # each agent's default state dir: <home>/controller/<run>/node<I>
        state = home / "controller" / "slurm-4243.0" / f"node{node}"
        text = (state / "logs" / f"inc0.rank{node}.log").read_text()
        seen.append(json.loads(text.split("ENV ", 1)[1].splitlines()[0]))
        assert _state_record(state).status == "completed"
    assert [(e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"]) for e in seen] == [
        ("0", "0", "0"),
        ("1", "0", "1"),
    ]
    assert {(e["WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"]) for e in seen} == {
        ("2", "localhost", str(20000 + 4243))
    }
