"""Per-replica-group fault tolerance on torchft: only the lost group restarts.

Real processes, gloo on CPU, torchft 0.2.0 and its Lighthouse: two replica groups of one
rank each of `examples/train_ft.py` under `controller.torchft_launcher.TorchFTLauncher`.
The rank of group 1 is SIGKILLed; group 0 keeps its process and keeps stepping alone; the
launcher restarts group 1 alone (the scope a ``respawn_group`` plan names) and it heals
from group 0 (torchft's checkpoint transport: there is no checkpoint directory at all);
both end on the same step with the same weights.

Waiting is a read of the ranks' output with a deadline, never a sleep.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runwatch.controller.launcher import RUNNING, WHOLE_NODE, Incarnation, Scope
from runwatch.controller.state import GANG_FILE, ControllerState, LaunchSpec, read_gang_file
from runwatch.controller.topology import NodeTopology, RunBinding
from runwatch.schemas.events import AnomalyDetected, RestartCompleted, RestartRequested

if importlib.util.find_spec("torchft") is None:  # the `ft` extra
    pytest.skip("torchft is not installed (the ft extra)", allow_module_level=True)

from runwatch.controller.torchft_compat import (
    LighthouseProcess,
    LighthouseSettings,
    start_lighthouse,
)
from runwatch.controller.torchft_launcher import ReplicaLayout, TorchFTLauncher

pytestmark = [pytest.mark.torch]

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "examples" / "train_ft.py"
WAIT_S = 150.0
HEAL = re.compile(r"healing is required step=0, max_step=(\d+), recover_src_replica_rank=0")
STEP = re.compile(r"^group (\d+) step (\d+) loss \S+ dt \S+ participants \[([\d, ]*)\]$")


def steps(log: Path) -> list[tuple[int, tuple[int, ...]]]:
    """``(step, participants)`` of every step line a group's rank printed, in order."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m = STEP.match(line)
        if m:
            out.append((int(m[2]), tuple(int(g) for g in m[3].split(",") if g.strip())))
    return out


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)  # polling the ranks' output files, the event itself


def python_child(wrapper_pid: int) -> int:
    """The rank's Python process under its ``sh`` wrapper."""
    children = Path(f"/proc/{wrapper_pid}/task/{wrapper_pid}/children").read_text().split()
    assert children, f"wrapper {wrapper_pid} has no child"
    return int(children[0])


@pytest.fixture
def lighthouse() -> Iterator[LighthouseProcess]:
    lh = start_lighthouse(LighthouseSettings(min_replicas=1, groups=2))
    yield lh
    lh.stop()


def test_a_killed_group_is_restarted_alone_and_heals_from_its_live_peer(
    tmp_path: Path, lighthouse: LighthouseProcess
) -> None:
    stop_file, sums = tmp_path / "stop", tmp_path / "sums"
    spec = LaunchSpec(
        run=RunBinding(run_id="ft-test", bootstrap="", prefix="runwatch"),
        argv=(
            sys.executable,
            "-u",
            str(SCRIPT),
            "--no-emit",
            "--steps",
            "100000",
            "--step-delay-s",
            "0.05",
            "--timeout-s",
            "20",
            "--stop-file",
            str(stop_file),
            "--checksum-dir",
            str(sums),
        ),
        env={"PYTHONPATH": str(REPO)},
    )
    state = ControllerState(tmp_path / "state")
    launcher = TorchFTLauncher(state, spec, ReplicaLayout(groups=2), lighthouse)
    topology = NodeTopology(nproc_per_node=2)
    log0, log1 = state.log_path(0, 0), state.log_path(0, 1)
    try:
        launcher.start(Incarnation(0, topology), WHOLE_NODE)
        group0 = launcher.pids(0)
        wait_for("both groups stepping together", lambda: any(p == (0, 1) for _, p in steps(log1)))

        killed = python_child(launcher.pids(1)[0])
        os.kill(killed, signal.SIGKILL)
        wait_for("group 1's exit", lambda: launcher.status(1) != RUNNING)
        assert launcher.status(0) == RUNNING
        at_kill = steps(log0)[-1][0]
        wait_for(
            "group 0 stepping alone during the outage",
            lambda: sum(1 for s, p in steps(log0) if s > at_kill and p == (0,)) >= 5,
        )

        launcher.stop(Scope(groups=(1,)), grace_s=1.0, kill_now=True)
        before = len(steps(log1))
        started = launcher.start(Incarnation(0, topology), Scope(groups=(1,)))
        assert [p.rank for p in started.ranks] == [0, 1]
        assert launcher.pids(0) == group0  # the survivor was never touched
        wait_for(
            "group 1 back in the quorum",
            lambda: any(p == (0, 1) for _, p in steps(log1)[before:]),
        )
        # torchft's manager says where the new group healed from: replica rank 0's state
        # at the live step (from a peer: the run has no checkpoint directory at all)
        heals = [int(m) for m in HEAL.findall(log1.read_text(errors="replace"))]
        assert heals and heals[-1] > at_kill, heals
        rejoined = steps(log1)[before:]
        assert rejoined[0][0] > at_kill  # it resumed where the live peer was, not at step 1

        last = max(steps(log0)[-1][0], steps(log1)[-1][0]) + 10
        (tmp_path / "stop.tmp").write_text(str(last))
        (tmp_path / "stop.tmp").rename(stop_file)
        wait_for("the run to end", lambda: not launcher.running())
        assert launcher.status(0) == 0 and launcher.status(1) == 0
        assert launcher.pids(0) == group0
        s0 = (sums / "group0.rank0.txt").read_text().split()
        s1 = (sums / "group1.rank0.txt").read_text().split()
        assert s0 == s1 == [str(last), s0[1]], "the groups ended on different weights"
    finally:
        launcher.stop(WHOLE_NODE, grace_s=1.0, kill_now=True)
        launcher.close()


def kill_ranks(state_dir: Path) -> None:
    """SIGKILL every rank the gang record names (each leads a session of its own)."""
    gang = read_gang_file(state_dir / GANG_FILE) if (state_dir / GANG_FILE).exists() else None
    for rank in gang.record.ranks if gang is not None else ():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(rank.pid, signal.SIGKILL)


@pytest.mark.integration
def test_runwatch_launch_restarts_only_the_killed_group_through_the_closed_loop(
    loop: Any, tmp_path: Path
) -> None:
    """`runwatch launch --fault-tolerance torchft`, the processors and Kafka, all real.

    SIGKILL group 1's rank: the exit evidence makes the dead_rank verdict and the policy's
    respawn; the controller reads the backend's per-step fault tolerance and restarts
    group 1 alone (same incarnation, group 0's pid unchanged); the steps' participants give
    replica_lost and replica_rejoined; the run completes with equal weights; audit agrees.
    """
    from tests.integration.controller.conftest import (
        Proc,
        audit_cli,
        of_run,
        rank_env,
        wait_events,
    )

    run_id = "ft-loop"
    anomalies = loop.reader(loop.topics.anomalies)
    commands = loop.reader(loop.topics.commands)
    controller = loop.reader(loop.topics.controller)
    base = tmp_path / run_id
    state_dir, stop_file, sums = base / "state", base / "stop", base / "sums"
    base.mkdir()
    args = ["launch", "--bootstrap", loop.bootstrap, "--prefix", loop.prefix]
    args += ["--run-id", run_id, "--state-dir", str(state_dir), "--grace-s", "2"]
    args += ["--fault-tolerance", "torchft", "--replica-groups", "2", "--"]
    args += [sys.executable, "-u", str(SCRIPT), "--steps", "100000", "--step-delay-s", "0.05"]
    args += ["--timeout-s", "20", "--stop-file", str(stop_file), "--checksum-dir", str(sums)]
    launcher = Proc(args, base / "launcher.log", rank_env() | {"PYTHONPATH": str(REPO)})
    log0, log1 = state_dir / "logs" / "inc0.rank0.log", state_dir / "logs" / "inc0.rank1.log"
    try:
        wait_for("both groups stepping together", lambda: any(p == (0, 1) for _, p in steps(log1)))
        gang = read_gang_file(state_dir / GANG_FILE)
        assert gang is not None and gang.spec.fault_tolerance is not None
        pids = {p.rank: p.pid for p in gang.record.ranks}
        os.kill(python_child(pids[1]), signal.SIGKILL)

        (command,) = wait_events(commands, of_run(run_id, RestartRequested))
        assert (command.action, command.cause_kind, command.incarnation) == (
            "respawn",
            "dead_rank",
            0,
        )
        (done,) = wait_events(controller, of_run(run_id, RestartCompleted))
        assert done.command_id == command.command_id and done.checkpoint_step is None, (
            [e for e in commands.events if e.run_id == run_id],
            [e for e in controller.events if e.run_id == run_id],
            [e for e in anomalies.events if e.run_id == run_id],
        )
        record = read_gang_file(state_dir / GANG_FILE).record  # type: ignore[union-attr]
        after = {p.rank: p.pid for p in record.ranks}
        assert record.incarnation == 0 and after[0] == pids[0] and after[1] != pids[1]

        before = len(steps(log1))
        wait_for("group 1 back", lambda: any(p == (0, 1) for _, p in steps(log1)[before:]))
        assert any(p == (0,) for _, p in steps(log0)), "group 0 never stepped alone"
        last = max(steps(log0)[-1][0], steps(log1)[-1][0]) + 10
        (base / "stop.tmp").write_text(str(last))
        (base / "stop.tmp").rename(stop_file)
        assert launcher.wait() == 0, launcher.log()
        s0 = (sums / "group0.rank0.txt").read_text().split()
        s1 = (sums / "group1.rank0.txt").read_text().split()
        assert s0 == s1 and s0[0] == str(last)

        kinds = wait_events(
            anomalies,
            lambda e: of_run(run_id, AnomalyDetected)(e) and e.kind == "replica_rejoined",
        )
        assert kinds[0].replica_group == 1
        seen = [
            (e.kind, e.replica_group)
            for e in anomalies.events
            if of_run(run_id, AnomalyDetected)(e)
        ]
        assert ("replica_lost", 1) in seen and ("dead_rank", None) in seen
        # one restart for one failure: the replica_lost came after the gang command
        assert len([e for e in commands.events if of_run(run_id, RestartRequested)(e)]) == 1
        audit = audit_cli(loop, run_id)
        assert audit.returncode == 0, (audit.stdout, audit.stderr)
    finally:
        launcher.close()
        kill_ranks(state_dir)  # a failed wait must not leave ranks stepping into later tests
