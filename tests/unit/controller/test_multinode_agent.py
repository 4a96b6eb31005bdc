"""One node's agent of a multi-node gang: its global ranks, its ports, its share of a restart.

Real processes (plain Python, no torch), no Kafka: what the agent would publish is collected.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field

import msgspec

from runwatch.controller.elastic import RankExit, due_reports
from runwatch.controller.state import ControllerState, GangFile
from runwatch.controller.supervisor import EXIT_HOLD_S, Peers, RunSupervisor
from runwatch.controller.topology import NodeTopology
from runwatch.schemas.events import (
    AgentReady,
    AnomalyDetected,
    BackendDeclaration,
    Event,
    RankExited,
    RankStack,
    RestartCompleted,
    RestartFailed,
    RestartRequested,
)
from tests.unit.controller.builders import multinode, record, spec, supervisor

PY = sys.executable
PRINT_ENV = (
    "import json, os\n"
    "keys = ('RANK', 'LOCAL_RANK', 'GROUP_RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT',\n"
    "        'TORCHELASTIC_RESTART_COUNT', 'RUNWATCH_RESTART_FROM')\n"
    "print(json.dumps({k: os.environ.get(k) for k in keys}), flush=True)\n"
)
SLEEPER = PRINT_ENV + "import time\ntime.sleep(600)\n"
COMMAND = RestartRequested(
    run_id="r",
    ts_ns=1,
    command_id="c1",
    action="respawn",
    cause_verdict_id="v1",
    cause_kind="dead_rank",
    world_size=1,  # a size the multi-node gang cannot take: it restarts at full size
)


def _node(
    tmp_path,
    node_rank: int,
    script: str,
    *,
    peers: Peers | None = None,
    counts: tuple[int, ...] = (),
    **topology,
) -> tuple[RunSupervisor, list, list]:
    launched = spec(
        argv=(PY, "-c", script),
        bootstrap="127.0.0.1:1",
        grace_s=0.2,
        node_failure_budget=2,
        topology=multinode(node_rank, **topology),
    )
    published: list[Event] = []
    ends: list[tuple[int, str]] = []
    sup = supervisor(
        ControllerState(tmp_path / f"node{node_rank}"),
        launched,
        record(launched, node_failure_counts=counts),
        publish=published.append,
        announce_end=lambda rec, status, reason: ends.append((rec.incarnation, status)),
        peers=peers,
    )
    return sup, published, ends


def _envs(sup: RunSupervisor, timeout_s: float = 60.0) -> list[dict]:
    """Each local rank's printed environment, once every one has printed it."""
    rec = sup.record
    paths = [sup.state.log_path(rec.incarnation, r) for r in rec.topology.global_ranks]
    deadline = time.monotonic() + timeout_s
    while not all(p.is_file() and p.read_text().endswith("\n") for p in paths):
        assert time.monotonic() < deadline, "the ranks did not print their environment"
        time.sleep(0.02)  # polling files the ranks write, not timing them
    return [json.loads(p.read_text().splitlines()[-1]) for p in paths]


def test_due_reports_hold_only_non_signalled_abnormal_exits():
    exits = [RankExit(0, 1, 10.0), RankExit(1, 137, 10.2), RankExit(2, 0, 10.2)]
    now, held = due_reports(exits, 10.3, hold_s=0.5)
    assert [e.rank for e in now] == [1, 2] and [e.rank for e in held] == [0]
    now, held = due_reports(exits, 10.5, hold_s=0.5)
    assert [e.rank for e in now] == [1, 0, 2] and held == []
    assert due_reports(exits, 10.0, hold_s=0.0)[1] == []


def test_node_1_starts_its_global_ranks_on_the_incarnation_port(tmp_path):
    sup, _, _ = _node(tmp_path, 1, PRINT_ENV)
    sup.launch(None)
    assert sup.launcher.gang.wait(60.0)
    assert [p.rank for p in sup.record.ranks] == [2, 3]
    assert _envs(sup) == [
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank - 2),
            "GROUP_RANK": "1",
            "WORLD_SIZE": "4",
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "30000",
            "TORCHELASTIC_RESTART_COUNT": "0",
            "RUNWATCH_RESTART_FROM": None,
        }
        for rank in (2, 3)
    ]
    sup.observe(time.monotonic())
    assert sup.record.status == "completed"


def test_a_non_signalled_failure_is_published_after_the_hold(tmp_path):
    sup, published, _ = _node(tmp_path, 0, "import sys; sys.exit(1)")
    sup.launch(None)
    assert sup.launcher.gang.wait(60.0)
    seen_s = time.monotonic()
    sup.observe(seen_s)
    assert published == []  # a peer of a rank killed elsewhere: the culprit's agent goes first
    sup.observe(seen_s + EXIT_HOLD_S)
    exits = [e for e in published if isinstance(e, RankExited)]
    assert [(e.rank, e.exit_code) for e in exits] == [(0, 1), (1, 1)]


def test_both_nodes_execute_one_command_node_0_speaks_for_the_gang(tmp_path):
    outcomes = []
    for node in (0, 1):
        sup, published, ends = _node(tmp_path, node, SLEEPER)
        sup.launch(None)
        try:
            assert {e["MASTER_PORT"] for e in _envs(sup)} == {"30000"}
            sup.execute(COMMAND, time.monotonic())
            assert sup.record.incarnation == 1 and sup.record.world_size == 4
            assert sup.state.processed == frozenset({"c1"})
            envs = _envs(sup)
        finally:
            sup.launcher.gang.stop(0.0, kill_now=True)
        assert [e["RANK"] for e in envs] == [str(2 * node), str(2 * node + 1)]
        assert {(e["MASTER_PORT"], e["TORCHELASTIC_RESTART_COUNT"]) for e in envs} == {
            ("30001", "1")
        }
        assert {e["RUNWATCH_RESTART_FROM"] for e in envs} == {"0"}  # no checkpoint dir
        outcomes.append(([type(e).__name__ for e in published], ends))
    node0, node1 = outcomes
    assert node0 == (["RestartCompleted"], [(0, "stopped")])
    assert node1 == ([], [])


def test_max_restarts_fails_the_run_instead_of_restarting(tmp_path):
    sup, published, ends = _node(tmp_path, 1, SLEEPER, max_restarts=0)
    sup.launch(None)
    _envs(sup)
    sup.execute(COMMAND, time.monotonic())
    assert sup.launcher.running() == []
    (failed,) = [e for e in published if isinstance(e, RestartFailed)]
    assert "--max-restarts 0 reached" in failed.reason
    assert not any(isinstance(e, RestartCompleted) for e in published)
    assert ends == [(0, "failed")] and sup.record.status == "failed"
    assert sup.record.incarnation == 0


def _running_record(root, run_id: str, node: int, host: str) -> None:
    t = NodeTopology(nnodes=2, node_rank=node, master_addr="m", master_port=30000)
    launched = spec(
        run_id=run_id, argv=(PY, "x.py"), bootstrap="127.0.0.1:1", topology=t, host=host
    )
    gang = GangFile(spec=launched, record=record(launched))
    ControllerState(root / run_id / f"node{node}").save_gang(gang)


def test_an_adopter_takes_one_agent_of_a_run_and_only_this_hosts(tmp_path, capsys):
    from runwatch.cli import main
    from runwatch.controller.supervisor import HOST

    _running_record(tmp_path / "a", "r", 0, HOST)
    _running_record(tmp_path / "a", "r", 1, HOST)
    assert main(["controller", "--state-dir", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "several agents' state of run r here" in err and len(err.strip().splitlines()) == 1

    _running_record(tmp_path / "b", "r", 0, "some-other-node")
    assert main(["controller", "--state-dir", str(tmp_path / "b")]) == 1
    assert "no running gang to adopt" in capsys.readouterr().err


ELASTIC = BackendDeclaration(name="torch-ddp", reshardable_checkpoint=True, elastic_restart=True)


@dataclass
class HeardPeers:
    """What the agent heard from its run on Kafka (`controller.loop.PeerWatch` does the reading)."""

    ready_nodes: tuple[int, ...]
    declared: BackendDeclaration | None = ELASTIC
    asked: list[tuple[str, int, int, float]] = field(default_factory=list)
    verdict: AnomalyDetected | None = None
    stacks: dict[int, tuple[RankStack, ...]] = field(default_factory=dict)

    def backend(self, run_id: str) -> BackendDeclaration | None:
        return self.declared

    def cause(self, command: RestartRequested) -> AnomalyDetected | None:
        return self.verdict

    def await_ready(self, run_id, incarnation, nnodes, timeout_s):
        self.asked.append((run_id, incarnation, nnodes, timeout_s))
        return {
            n: AgentReady(
                run_id=run_id,
                ts_ns=1,
                command_id="c1",
                incarnation=incarnation,
                node_rank=n,
                nnodes=nnodes,
                host="10.0.0.1" if n == 0 else f"host{n}",
                stacks=self.stacks.get(n, ()),
            )
            for n in self.ready_nodes
        }


def _restart_with(tmp_path, node: int, peers: HeardPeers, **topology):
    sup, published, ends = _node(tmp_path, node, SLEEPER, peers=peers, **topology)
    sup.launch(None)
    try:
        _envs(sup)
        sup.execute(
            msgspec.structs.replace(COMMAND, world_size=None, cause_kind="hang"),
            time.monotonic(),
        )
        envs = _envs(sup) if sup.record.status == "running" else []
    finally:
        sup.launcher.gang.stop(0.0, kill_now=True)
    return sup, published, ends, envs


def test_a_lost_node_1_leaves_node_0_alone_when_min_nnodes_allows(tmp_path):
    peers = HeardPeers(ready_nodes=(0,))
    sup, published, ends, envs = _restart_with(tmp_path, 0, peers, min_nnodes=1)
    assert peers.asked == [("r", 1, 2, 60.0)]
    (ready,) = [e for e in published if isinstance(e, AgentReady)]
    assert (ready.incarnation, ready.node_rank, ready.nnodes) == (1, 0, 2)
    (done,) = [e for e in published if isinstance(e, RestartCompleted)]
    assert done.world_size == 2
    assert ends == [(0, "stopped")]
    rec = sup.record
    assert (rec.incarnation, rec.world_size, rec.topology.nnodes, rec.topology.node_rank) == (
        1,
        2,
        1,
        0,
    )
    assert rec.backend == ELASTIC
    assert [(e["RANK"], e["GROUP_RANK"], e["WORLD_SIZE"]) for e in envs] == [
        ("0", "0", "2"),
        ("1", "0", "2"),
    ]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("10.0.0.1", "30001")}


def test_node_1_becomes_node_0_and_serves_the_store_when_node_0_is_lost(tmp_path):
    sup, published, ends, envs = _restart_with(tmp_path, 1, HeardPeers((1,)), min_nnodes=1)
    assert [(e["RANK"], e["GROUP_RANK"], e["WORLD_SIZE"]) for e in envs] == [
        ("0", "0", "2"),
        ("1", "0", "2"),
    ]
    assert {e["MASTER_ADDR"] for e in envs} == {"host1"}
    assert (sup.record.topology.node_rank, sup.record.topology.master_addr) == (0, "host1")
    # It is node 0 now: it speaks for the gang.
    assert [type(e).__name__ for e in published] == ["AgentReady", "RestartCompleted"]
    assert ends == [(0, "stopped")]


def test_a_lost_node_fails_the_run_by_default_saying_why(tmp_path):
    sup, published, ends, envs = _restart_with(tmp_path, 0, HeardPeers((0,)), min_nnodes=2)
    (failed,) = [e for e in published if isinstance(e, RestartFailed)]
    assert failed.reason == (
        "node 1 of 2 lost (no agent ready within 60s); --min-nnodes 2 (default: --nnodes) "
        "forbids shrinking"
    )
    assert not any(isinstance(e, RestartCompleted) for e in published)
    assert ends == [(0, "failed")] and sup.record.status == "failed"
    assert sup.launcher.running() == [] and envs == []


def test_a_backend_that_cannot_reshard_is_not_shrunk(tmp_path):
    peers = HeardPeers((0,), declared=BackendDeclaration(name="megatron"))
    sup, published, _, _ = _restart_with(tmp_path, 0, peers, min_nnodes=1)
    (failed,) = [e for e in published if isinstance(e, RestartFailed)]
    assert failed.reason.endswith("backend megatron does not declare reshardable_checkpoint")
    assert sup.record.status == "failed"


def test_every_node_ready_restarts_at_full_size(tmp_path):
    sup, published, ends, envs = _restart_with(tmp_path, 1, HeardPeers((0, 1)), min_nnodes=1)
    assert sup.record.topology.nnodes == 2 and sup.record.world_size == 4
    assert [e["RANK"] for e in envs] == ["2", "3"]
    assert [type(e).__name__ for e in published] == ["AgentReady"] and ends == []


def _verdict(rank: int) -> AnomalyDetected:
    return AnomalyDetected(
        run_id="r", ts_ns=1, verdict_id="v1", kind="dead_rank", step=3, rank=rank
    )


def _restart_failing(tmp_path, node: int, peers: HeardPeers, counts, **topology):
    """`_restart_with`, the gang record already holding per-node failure ``counts``."""
    sup, published, ends = _node(tmp_path, node, SLEEPER, peers=peers, counts=counts, **topology)
    sup.launch(None)
    try:
        _envs(sup)
        sup.execute(msgspec.structs.replace(COMMAND, world_size=None), time.monotonic())
        envs = _envs(sup) if sup.record.status == "running" else []
    finally:
        sup.launcher.gang.stop(0.0, kill_now=True)
    return sup, published, ends, envs


def test_a_failure_charged_to_node_1_within_budget_restarts_both_at_full_size(tmp_path):
    peers = HeardPeers((0, 1), verdict=_verdict(3))  # rank 3: node 1 of 2 ranks per node
    sup, _published, _ends, envs = _restart_failing(tmp_path, 1, peers, (0, 1), min_nnodes=1)
    assert sup.record.node_failure_counts == (0, 2)  # persisted, the same on every agent
    assert (sup.record.incarnation, sup.record.world_size) == (1, 4)
    assert [e["RANK"] for e in envs] == ["2", "3"]


def test_node_1_over_its_failure_budget_is_dropped_and_its_agent_stops(tmp_path):
    peers = HeardPeers((0, 1), verdict=_verdict(2))
    sup, published, ends, envs = _restart_failing(tmp_path, 1, peers, (0, 2), min_nnodes=1)
    assert sup.record.status == "dropped" and sup.finished
    assert sup.record.node_failure_counts == (0, 3)  # its own view, not renumbered
    assert sup.record.incarnation == 0 and envs == [] and sup.launcher.running() == []
    # It announced itself, then said nothing more: the run is not its to end or report.
    assert [type(e).__name__ for e in published] == ["AgentReady"] and ends == []


def test_node_0_goes_on_alone_when_node_1_is_over_its_failure_budget(tmp_path):
    peers = HeardPeers((0, 1), verdict=_verdict(2))
    sup, published, ends, envs = _restart_failing(tmp_path, 0, peers, (0, 2), min_nnodes=1)
    rec = sup.record
    assert (rec.status, rec.incarnation, rec.world_size, rec.topology.nnodes) == (
        "running",
        1,
        2,
        1,
    )
    assert rec.node_failure_counts == (0,)
    (done,) = [e for e in published if isinstance(e, RestartCompleted)]
    assert done.world_size == 2 and ends == [(0, "stopped")]
    assert [(e["RANK"], e["WORLD_SIZE"]) for e in envs] == [("0", "2"), ("1", "2")]


def test_a_failing_node_that_may_not_be_dropped_is_kept_at_full_size(tmp_path):
    peers = HeardPeers((0, 1), verdict=_verdict(2))
    sup, _published, _ends, envs = _restart_failing(tmp_path, 1, peers, (0, 2), min_nnodes=2)
    assert (sup.record.status, sup.record.incarnation, sup.record.world_size) == ("running", 1, 4)
    assert sup.record.node_failure_counts == (0, 3)
    assert [e["RANK"] for e in envs] == ["2", "3"]


def test_node_0_lists_every_nodes_stacks_in_restart_completed(tmp_path):
    theirs = (
        RankStack(rank=2, host="host1", where="before_step (examples/faults.py:140)"),
        RankStack(rank=3, host="host1", where="allreduce (x.py:1)"),
    )
    peers = HeardPeers((0, 1), stacks={1: theirs})
    _sup, published, _, _ = _restart_with(tmp_path, 0, peers)
    (ready,) = [e for e in published if isinstance(e, AgentReady)]
    (done,) = [e for e in published if isinstance(e, RestartCompleted)]
    assert [s.rank for s in ready.stacks] == [0, 1]  # this node's own, announced
    assert [s.rank for s in done.stacks] == [0, 1, 2, 3]
    assert done.stacks[2:] == theirs and done.stacks[:2] == ready.stacks
