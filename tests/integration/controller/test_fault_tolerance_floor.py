"""The min-replicas time bound on real processes: too long below the floor restarts the gang.

`runwatch launch --fault-tolerance torchft --replica-groups 3 --min-replicas 2
--min-replicas-bound-s S`, the processors and Kafka, all real; three replica groups of one
rank of `examples/train_ft.py`, gloo on CPU, torchft's Lighthouse, DCP checkpoints every 5
steps. The ranks of groups 1 and 2 are stopped (SIGSTOP: their torchft threads stop
heartbeating too, so the Lighthouse drops them after its heartbeat timeout and group 0
steps alone, one group below the floor of two). The steps' participants give
``replica_lost`` for groups 1 and 2, the policy asks ``respawn_group`` for each, and the
controller restarts them alone, one after the other (stacks, SIGTERM, ``--grace-s``,
SIGKILL: a stopped rank answers neither the stack request nor SIGTERM). Then:

* **S = 1 s**: group 0 steps alone for more than S s of log time before either group can
  be back (a restart alone takes longer than the grace), so the step reducer raises
  ``replicas_below_min`` once; the policy asks a gang ``respawn``; the controller restarts
  every group (new pids for all, the survivor's included) in incarnation 1 from the last
  committed DCP checkpoint; the run completes with equal weights; the audit agrees.
* **S = 300 s** (the twin): groups 1 and 2 heal from group 0 long before S, the stretch
  below the floor ends at the first step with two groups back in the quorum, and nothing
  escalates: no ``replicas_below_min``, no gang restart, group 0 keeps its pid,
  incarnation 0 to the end.

The run announces silence timeouts of 120 s (``dead_rank_timeout_s``, ``hang_timeout_s``;
300 s by default): a stopped peer stalls group 0's all-reduce for the collective timeout
(``--timeout-s``) before the quorum drops it, and the loop's fast timeouts
(`conftest.SETS`) would turn that silence into a ``dead_rank`` or ``hang`` and a gang
restart of their own.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runwatch.controller.state import GANG_FILE, GangRecord, read_gang_file
from runwatch.schemas.events import (
    AnomalyDetected,
    RestartCompleted,
    RestartFailed,
    RestartRequested,
)

from .test_fault_tolerance import REPO, SCRIPT, kill_ranks, python_child, steps, wait_for

pytestmark = [pytest.mark.torch, pytest.mark.integration]

CHECKPOINT = re.compile(r"^checkpoint step (\d+) committed", re.MULTILINE)
SILENCE = ("dead_rank_timeout_s=120", "hang_timeout_s=120")
GROUPS = (0, 1, 2)
STOPPED = (1, 2)


@dataclass
class FloorRun:
    """One launched run below its floor: the launcher, its directories, its first pids."""

    run_id: str
    launcher: Any
    base: Path
    state_dir: Path
    pids: dict[int, int]

    def log(self, incarnation: int, rank: int) -> Path:
        return self.state_dir / "logs" / f"inc{incarnation}.rank{rank}.log"

    def record(self) -> GangRecord:
        gang = read_gang_file(self.state_dir / GANG_FILE)
        assert gang is not None
        return gang.record

    def finish(self, incarnation: int) -> str:
        """Stop every group 10 steps ahead; return the weights they all ended on."""
        last = max(steps(self.log(incarnation, r))[-1][0] for r in GROUPS) + 10
        (self.base / "stop.tmp").write_text(str(last))
        (self.base / "stop.tmp").rename(self.base / "stop")
        assert self.launcher.wait() == 0, self.launcher.log()
        sums = [(self.base / "sums" / f"group{g}.rank0.txt").read_text().split() for g in GROUPS]
        assert sums == [sums[0]] * len(GROUPS) and sums[0][0] == str(last), sums
        return sums[0][1]


def start_below_floor(loop: Any, tmp_path: Path, run_id: str, bound_s: int) -> FloorRun:
    """Launch three groups with a floor of two, wait for a checkpoint, SIGSTOP groups 1, 2."""
    from tests.integration.controller.conftest import Proc, rank_env

    base = tmp_path / run_id
    state_dir = base / "state"
    base.mkdir()
    args = ["launch", "--bootstrap", loop.bootstrap, "--prefix", loop.prefix]
    args += ["--run-id", run_id, "--state-dir", str(state_dir), "--grace-s", "2"]
    args += ["--checkpoint-dir", str(base / "ckpt")]
    args += ["--fault-tolerance", "torchft", "--replica-groups", "3"]
    args += ["--min-replicas", "2", "--min-replicas-bound-s", str(bound_s), "--"]
    args += [sys.executable, "-u", str(SCRIPT), "--steps", "100000", "--step-delay-s", "0.05"]
    args += ["--timeout-s", "20", "--stop-file", str(base / "stop")]
    args += ["--checksum-dir", str(base / "sums"), "--checkpoint-every", "5"]
    for pair in SILENCE:
        args += ["--threshold", pair]
    launcher = Proc(args, base / "launcher.log", rank_env() | {"PYTHONPATH": str(REPO)})
    run = FloorRun(run_id, launcher, base, state_dir, {})
    log0, log1 = run.log(0, 0), run.log(0, 1)
    wait_for("every group stepping together", lambda: any(p == GROUPS for _, p in steps(log1)))
    wait_for(
        "a committed checkpoint",
        lambda: any(CHECKPOINT.search(p.read_text(errors="replace")) for p in (log0, log1)),
    )
    run.pids = {p.rank: p.pid for p in run.record().ranks}
    for group in STOPPED:
        os.kill(python_child(run.pids[group]), signal.SIGSTOP)
    return run


def commands_of(reader: Any, run_id: str) -> list[RestartRequested]:
    return [e for e in reader.events if e.run_id == run_id and isinstance(e, RestartRequested)]


def drain(reader: Any) -> None:
    """Read ``reader``'s topic up to its end offsets as of now."""
    consumer = reader.consumer
    ends = consumer.end_offsets(list(consumer.assignment()))
    reader.wait_for(lambda _: all(consumer.position(tp) >= n for tp, n in ends.items()))


def below_verdicts(loop: Any, run_id: str) -> int:
    """``replicas_below_min`` verdicts of the run once the processors read every step."""
    from runwatch.processors.fleet import latest_states, wait_until_processed

    wait_until_processed(loop.bootstrap, loop.app_id, [loop.topics.steps], timeout_s=120)
    view = latest_states(loop.bootstrap, loop.app_id)[run_id]
    assert view.steps is not None
    assert view.steps.replicas.degraded_steps > 0, "no step was ever below the floor"
    return view.steps.replicas.below_verdicts


def test_a_survivor_alone_past_the_bound_restarts_every_group_from_dcp(
    loop: Any, tmp_path: Path
) -> None:
    from tests.integration.controller.conftest import audit_cli, of_run, wait_events

    run_id = "ft-floor-over"
    anomalies = loop.reader(loop.topics.anomalies)
    commands = loop.reader(loop.topics.commands)
    controller = loop.reader(loop.topics.controller)
    run = start_below_floor(loop, tmp_path, run_id, bound_s=1)
    try:
        (below,) = wait_events(
            anomalies,
            lambda e: of_run(run_id, AnomalyDetected)(e) and e.kind == "replicas_below_min",
        )
        assert below.incarnation == 0 and below.replica_group is None, below
        gang = wait_events(
            commands,
            lambda e: of_run(run_id, RestartRequested)(e) and e.cause_kind == below.kind,
        )[0]
        assert (gang.action, gang.incarnation) == ("respawn", 0)
        assert gang.cause_verdict_id == below.verdict_id
        # before it: the lost groups' own restarts, asked from their replica_lost
        asked = [(c.action, c.replica_group, c.cause_kind) for c in commands_of(commands, run_id)]
        assert asked[:2] == [("respawn_group", g, "replica_lost") for g in STOPPED], asked
        done = wait_events(
            controller,
            lambda e: of_run(run_id, RestartCompleted)(e) and e.command_id == gang.command_id,
        )[0]
        assert done.checkpoint_step is not None and done.checkpoint_step >= 5, done

        record = run.record()
        after = {p.rank: p.pid for p in record.ranks}
        assert record.incarnation == 1
        assert all(after[g] != run.pids[g] for g in GROUPS), (run.pids, after)
        assert any(p == (0,) for _, p in steps(run.log(0, 0))), "group 0 never stepped alone"
        # in every group's own log: one group's line for a step of all three can come
        # before another group has printed any step of incarnation 1 (seen under load)
        wait_for(
            "every group stepping together again",
            lambda: all(any(p == GROUPS for _, p in steps(run.log(1, g))) for g in GROUPS),
        )
        resumed = re.compile(rf"^group \d: resumed from \S+ at step {done.checkpoint_step}$", re.M)
        for rank in GROUPS:  # from DCP: no group healed from a peer
            assert resumed.search(run.log(1, rank).read_text(errors="replace")), rank
        run.finish(incarnation=1)

        assert below_verdicts(loop, run_id) == 1
        assert len([c for c in commands_of(commands, run_id) if c.cause_kind == below.kind]) == 1
        audit = audit_cli(loop, run_id)
        assert audit.returncode == 0, (audit.stdout, audit.stderr)
    finally:
        run.launcher.close()
        kill_ranks(run.state_dir)


def test_a_group_that_heals_within_the_bound_restarts_nothing_else(
    loop: Any, tmp_path: Path
) -> None:
    from tests.integration.controller.conftest import audit_cli, of_run, wait_events

    run_id = "ft-floor-within"
    anomalies = loop.reader(loop.topics.anomalies)
    commands = loop.reader(loop.topics.commands)
    controller = loop.reader(loop.topics.controller)
    run = start_below_floor(loop, tmp_path, run_id, bound_s=300)
    try:
        asked = wait_events(commands, of_run(run_id, RestartRequested), count=2)
        assert [(c.action, c.replica_group, c.cause_kind) for c in asked] == [
            ("respawn_group", g, "replica_lost") for g in STOPPED
        ]
        done = wait_events(controller, of_run(run_id, RestartCompleted), count=2)
        assert [d.command_id for d in done] == [c.command_id for c in asked]
        assert all(d.checkpoint_step is None for d in done), done  # healed, not from DCP
        record = run.record()
        after = {p.rank: p.pid for p in record.ranks}
        assert record.incarnation == 0 and after[0] == run.pids[0]
        assert all(after[g] != run.pids[g] for g in STOPPED), (run.pids, after)

        rejoined = wait_events(
            anomalies,
            lambda e: of_run(run_id, AnomalyDetected)(e) and e.kind == "replica_rejoined",
            count=2,
        )
        assert sorted((e.replica_group, e.incarnation) for e in rejoined) == [(1, 0), (2, 0)]
        assert any(p == (0,) for _, p in steps(run.log(0, 0))), "group 0 never stepped alone"
        run.finish(incarnation=0)

        assert below_verdicts(loop, run_id) == 0
        final = run.record()  # no gang restart: the survivor's process ran to the end
        assert final.incarnation == 0 and {p.rank: p.pid for p in final.ranks}[0] == run.pids[0]
        drain(commands)
        drain(controller)
        assert not [
            c for c in commands_of(commands, run_id) if c.cause_kind == "replicas_below_min"
        ]
        completed = [e for e in controller.events if of_run(run_id, RestartCompleted)(e)]
        assert [c.command_id for c in completed] == [c.command_id for c in asked]
        # any other command (a silent rank's dead_rank while the groups healed) was refused
        # as covered by the group restarts, never carried out
        others = {c.command_id for c in commands_of(commands, run_id)} - {
            c.command_id for c in asked
        }
        covered = {
            e.command_id
            for e in controller.events
            if of_run(run_id, RestartFailed)(e) and e.covered
        }
        assert others <= covered, (others, covered)
        audit = audit_cli(loop, run_id)
        assert audit.returncode == 0, (audit.stdout, audit.stderr)
    finally:
        run.launcher.close()
        kill_ranks(run.state_dir)
