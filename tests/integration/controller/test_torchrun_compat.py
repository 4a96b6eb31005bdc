"""The same command lines through ``torchrun`` and ``runwatch launch``: the same rank contract.

Each case runs one command line twice, once with torch's real ``torchrun`` and once with
``torchrun`` replaced by ``runwatch launch`` (runwatch's own flags added: broker, state
directory), over `dump_env.py`, which writes what each rank was started with. The ranks'
torchrun variables are then compared name by name: the same names, the same values where
they mean the same thing, and for the values that are legitimately different (a port, a
run id, a path) the same shape. Where runwatch differs on purpose, `DIFFERENT` says why.

A last test shows the other half of the contract: a rank whose ``@record`` entry point
raises hands its exception to ``runwatch launch`` through ``TORCHELASTIC_ERROR_FILE``, and
the ``dead_rank`` verdict carries it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from runwatch.controller.gang import free_port
from runwatch.schemas.events import AnomalyDetected, RankExited

from .conftest import WAIT_S, Proc, of_run, rank_env, wait_events

pytestmark = [pytest.mark.integration, pytest.mark.torch]

HERE = Path(__file__).resolve().parent
DUMP = HERE / "dump_env.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")

AGENT_ONLY = {"TORCHELASTIC_SIGNALS_TO_HANDLE"}
"""What torchrun's agent sets in its own environment for itself (which signals it forwards)
and its workers inherit; no worker code reads it, and runwatch's agent forwards none."""


def _port(value: str) -> bool:
    return value.isdigit() and 1 <= int(value) <= 65535


def _loopback(value: str) -> bool:
    return ipaddress.ip_address(socket.gethostbyname(value)).is_loopback


def _error_file(value: str) -> bool:
    path = Path(value)
    return path.is_absolute() and path.suffix == ".json" and path.parent.is_dir()


DIFFERENT: dict[str, tuple[Callable[[str], bool], str]] = {
    "MASTER_PORT": (_port, "a free port per launch (runwatch: per incarnation)"),
    "TORCHELASTIC_RUN_ID": (bool, "torchrun makes a uuid up on one host; runwatch's run id"),
    "TORCHELASTIC_ERROR_FILE": (_error_file, "each launcher's own directory"),
    "TORCHELASTIC_USE_AGENT_STORE": (
        lambda v: v in ("True", "False"),
        "torchrun's agent serves the TCP store; runwatch has no agent store, rank 0 serves "
        "it (False, asserted below)",
    ),
}
"""Variables whose values legitimately differ: the shape both must have, and why."""

ONE_HOST_ADDR = (_loopback, "torchrun says localhost, runwatch 127.0.0.1: both loopback")


def _added(seen: dict[str, Any], base: dict[str, str]) -> dict[str, str]:
    """The variables a launcher gave the rank: what differs from the launcher's own."""
    env: dict[str, str] = seen["env"]
    return {
        k: v
        for k, v in env.items()
        if base.get(k) != v and not k.startswith("RUNWATCH_") and k not in AGENT_ONLY
    }


def _ranks(out: Path, world_size: int) -> list[dict[str, Any]]:
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(world_size)]


def _torchrun(lines: Sequence[Sequence[str]], out: Path, env: dict[str, str]) -> None:
    """Run each line (one per node) with torch's torchrun; they must all exit 0."""
    procs = []
    for node, line in enumerate(lines):
        log = (out.parent / f"torchrun{node}.log").open("wb")
        argv = [str(TORCHRUN), *line, str(DUMP), str(out)]
        procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
    codes = [p.wait(timeout=WAIT_S) for p in procs]
    logs = [(out.parent / f"torchrun{n}.log").read_text() for n in range(len(lines))]
    assert codes == [0] * len(lines), logs


def _runwatch(loop, lines: Sequence[Sequence[str]], out: Path, env: dict[str, str]) -> None:
    """Run each line with `torchrun` replaced by `runwatch launch` (+ broker, state dir)."""
    agents = []
    for node, line in enumerate(lines):
        own = ["--bootstrap", loop.bootstrap, "--prefix", loop.prefix]
        own += ["--state-dir", str(out.parent / f"state{node}")]
        argv = ["launch", *own, *line, str(DUMP), str(out)]
        agents.append(Proc(argv, out.parent / f"runwatch{node}.log", env))
    try:
        for agent in agents:
            assert agent.wait() == 0, agent.log()
    finally:
        for agent in agents:
            agent.close()


def _compare(theirs: list[dict[str, Any]], ours: list[dict[str, Any]], env, one_host: bool):
    different = DIFFERENT | ({"MASTER_ADDR": ONE_HOST_ADDR} if one_host else {})
    for rank, (t, o) in enumerate(zip(theirs, ours, strict=True)):
        t_env, o_env = _added(t, env), _added(o, env)
        assert sorted(o_env) == sorted(t_env), f"rank {rank}: names differ"
        for name, value in t_env.items():
            if name in different:
                shape, why = different[name]
                assert shape(value) and shape(o_env[name]), (rank, name, why)
            else:
                assert o_env[name] == value, (rank, name, o_env[name], value)
        assert o_env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        # the same script and arguments (each launcher's own OUT), the same interpreter (by
        # any path to it) with the same flags (-u)
        o_argv, t_argv = o["argv"], t["argv"]
        assert (o_argv[0], Path(o_argv[1]).name, o_argv[2:]) == (t_argv[0], "out", t_argv[2:])
        assert o["interpreter_argv"][:-1] == t["interpreter_argv"][:-1]  # ... SCRIPT OUT
        assert Path(o["executable"]).resolve() == Path(t["executable"]).resolve()
    for launch in (theirs, ours):  # one rendezvous and one run per launch
        for name in ("MASTER_PORT", "TORCHELASTIC_RUN_ID"):
            assert len({r["env"][name] for r in launch}) == 1, name
        assert len({r["env"]["TORCHELASTIC_ERROR_FILE"] for r in launch}) == len(launch)


@pytest.fixture
def base_env() -> dict[str, str]:
    """The launchers' environment: no OMP_NUM_THREADS, so torchrun's default shows."""
    env = rank_env()
    env.pop("OMP_NUM_THREADS", None)
    return env


def test_one_host_two_ranks_get_torchruns_environment(loop, tmp_path, base_env):
    line = ["--nproc_per_node=2", "--max-restarts=3"]
    (tmp_path / "torchrun").mkdir()
    (tmp_path / "runwatch").mkdir()
    _torchrun([line], tmp_path / "torchrun" / "out", base_env)
    _runwatch(loop, [line], tmp_path / "runwatch" / "out", base_env)
    theirs = _ranks(tmp_path / "torchrun" / "out", 2)
    ours = _ranks(tmp_path / "runwatch" / "out", 2)
    _compare(theirs, ours, base_env, one_host=True)
    assert _added(ours[1], base_env)["OMP_NUM_THREADS"] == "1"  # torchrun's default, shown
    assert _added(ours[1], base_env)["TORCHELASTIC_MAX_RESTARTS"] == "3"


def test_two_nodes_on_loopback_get_torchruns_environment(loop, tmp_path, base_env):
    def lines(port: int) -> list[list[str]]:
        common = ["--nnodes", "2", "--nproc-per-node", "1", "--master-addr", "127.0.0.1"]
        common += ["--master-port", str(port), "--rdzv-id", f"job{port}", "--max_restarts=2"]
        return [[*common, "--node-rank", str(node)] for node in (0, 1)]

    (tmp_path / "torchrun").mkdir()
    (tmp_path / "runwatch").mkdir()
    _torchrun(lines(free_port()), tmp_path / "torchrun" / "out", base_env)
    _runwatch(loop, lines(free_port()), tmp_path / "runwatch" / "out", base_env)
    theirs = _ranks(tmp_path / "torchrun" / "out", 2)
    ours = _ranks(tmp_path / "runwatch" / "out", 2)
    _compare(theirs, ours, base_env, one_host=False)
    # the run id is --rdzv-id on both sides: equal in shape, and each its own line's
    for launch in (theirs, ours):
        assert launch[0]["env"]["TORCHELASTIC_RUN_ID"] == f"job{launch[0]['env']['MASTER_PORT']}"
    assert [r["env"]["GROUP_RANK"] for r in ours] == ["0", "1"]


def test_a_recorded_exception_is_the_dead_rank_verdicts_root_cause(loop, tmp_path):
    run_id = "recorded"
    heartbeats = loop.reader(loop.topics.heartbeats)
    anomalies = loop.reader(loop.topics.anomalies)
    state = tmp_path / "state"
    argv = ["launch", "--bootstrap", loop.bootstrap, "--prefix", loop.prefix]
    argv += ["--state-dir", str(state), "--run-id", run_id, "--max-restarts", "0"]
    argv += ["--log-format", "seed", "--nproc_per_node=2"]
    argv += [str(DUMP), str(tmp_path / "out"), "--raise-on-rank", "1"]
    agent = Proc(argv, tmp_path / "agent.log", rank_env())
    try:
        evidence = wait_events(heartbeats, lambda e: of_run(run_id, RankExited)(e) and e.rank == 1)
        (verdict,) = wait_events(anomalies, of_run(run_id, AnomalyDetected))
        # the agent gives up at once (--max-restarts 0): exit status 1, nothing respawned
        assert agent.wait() == 1, agent.log()
    finally:
        agent.close()
    cause = "ValueError: rank 1 found batch 7 empty"
    assert [(e.exit_code, e.root_cause) for e in evidence] == [(1, cause)]
    assert verdict.kind == "dead_rank" and verdict.rank == 1
    assert verdict.detail.endswith(f"root cause: {cause}"), verdict.detail
    assert f"rank 1 (pid {evidence[0].pid}) exited with code 1: {cause}" in agent.log()
    assert os.path.isfile(state / "errors" / "inc0.rank1.json")  # kept, not deleted
