"""A hung replica group (alive, not stepping) is restarted alone, through the closed loop.

`runwatch launch --fault-tolerance torchft`, the processors and Kafka, all real; three
replica groups of one rank of `examples/train_ft.py`, gloo on CPU, torchft's Lighthouse.
Group 1's rank stops stepping (``--hang-file``: a sleep in its training loop; its process
and torchft's own threads stay alive, heartbeating to the Lighthouse). Groups 0 and 2 step
on without it (the Lighthouse forms a quorum without a heartbeating group that does not
join, after its join timeout, when more than half of the heartbeating groups joined: with
two groups, a hung one would stall the quorum), so the steps' participants give
``replica_lost`` for group 1; the policy asks ``respawn_group``; the controller takes
group 1's stacks (they show where it hung), stops it and starts it again alone, and it
heals from a live peer. Groups 0 and 2 are never restarted; the run completes with equal
weights; the audit agrees.

The run announces a silence timeout of 60 s (``dead_rank_timeout_s``, as in production:
300 s by default): the loop's fast one (`conftest.SETS`) would make a silent rank's
``dead_rank`` race the quorum's verdict, and a ``respawn`` with no rank exited and no group
healing takes the gang path (group plan rule 5).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from runwatch.controller.state import GANG_FILE, read_gang_file
from runwatch.schemas.events import (
    AnomalyDetected,
    RestartCompleted,
    RestartFailed,
    RestartRequested,
)

from .test_fault_tolerance import REPO, SCRIPT, kill_ranks, steps, wait_for

pytestmark = [pytest.mark.torch, pytest.mark.integration]


def test_a_hung_group_is_restarted_alone_through_the_closed_loop(loop: Any, tmp_path: Path) -> None:
    from tests.integration.controller.conftest import Proc, audit_cli, of_run, rank_env, wait_events

    run_id = "ft-hang"
    anomalies = loop.reader(loop.topics.anomalies)
    commands = loop.reader(loop.topics.commands)
    controller = loop.reader(loop.topics.controller)
    base = tmp_path / run_id
    state_dir, stop_file, sums, hang = base / "state", base / "stop", base / "sums", base / "hang"
    base.mkdir()
    args = ["launch", "--bootstrap", loop.bootstrap, "--prefix", loop.prefix]
    args += ["--run-id", run_id, "--state-dir", str(state_dir), "--grace-s", "2"]
    args += ["--fault-tolerance", "torchft", "--replica-groups", "3", "--"]
    args += [sys.executable, "-u", str(SCRIPT), "--steps", "100000", "--step-delay-s", "0.05"]
    args += ["--timeout-s", "20", "--stop-file", str(stop_file), "--checksum-dir", str(sums)]
    args += ["--hang-file", str(hang), "--threshold", "dead_rank_timeout_s=60"]
    launcher = Proc(args, base / "launcher.log", rank_env() | {"PYTHONPATH": str(REPO)})
    log0, log1 = state_dir / "logs" / "inc0.rank0.log", state_dir / "logs" / "inc0.rank1.log"
    every = (0, 1, 2)
    try:
        wait_for("every group stepping together", lambda: any(p == every for _, p in steps(log1)))
        gang = read_gang_file(state_dir / GANG_FILE)
        assert gang is not None
        pids = {p.rank: p.pid for p in gang.record.ranks}
        (base / "hang.tmp").write_text("1")
        (base / "hang.tmp").rename(hang)

        first = wait_events(commands, of_run(run_id, RestartRequested))[0]
        assert (first.action, first.replica_group, first.cause_kind, first.incarnation) == (
            "respawn_group",
            1,
            "replica_lost",
            0,
        )
        done = wait_events(controller, of_run(run_id, RestartCompleted))[0]
        assert done.command_id == first.command_id and done.checkpoint_step is None
        # where the hung rank was, taken before the stop
        (where,) = [s.where for s in done.stacks if s.rank == 1]
        assert "_hang_if_asked" in where, done.stacks
        record = read_gang_file(state_dir / GANG_FILE).record  # type: ignore[union-attr]
        after = {p.rank: p.pid for p in record.ranks}
        assert record.incarnation == 0 and after[1] != pids[1]
        assert (after[0], after[2]) == (pids[0], pids[2])
        assert "hanging (--hang-file)" in log1.read_text(errors="replace")

        before = len(steps(log1))
        wait_for("group 1 back", lambda: any(p == every for _, p in steps(log1)[before:]))
        assert any(p == (0, 2) for _, p in steps(log0)), "groups 0 and 2 never stepped without 1"
        last = max(steps(log0)[-1][0], steps(log1)[-1][0]) + 10
        (base / "stop.tmp").write_text(str(last))
        (base / "stop.tmp").rename(stop_file)
        assert launcher.wait() == 0, launcher.log()
        sums_by_group = [(sums / f"group{g}.rank0.txt").read_text().split() for g in every]
        assert sums_by_group == [sums_by_group[0]] * 3 and sums_by_group[0][0] == str(last)
        final = read_gang_file(state_dir / GANG_FILE).record  # type: ignore[union-attr]
        final_pids = {p.rank: p.pid for p in final.ranks}
        assert (final_pids[0], final_pids[2]) == (pids[0], pids[2])  # never restarted

        rejoined = wait_events(
            anomalies,
            lambda e: of_run(run_id, AnomalyDetected)(e) and e.kind == "replica_rejoined",
        )
        assert rejoined[0].replica_group == 1
        seen = [(e.kind, e.replica_group) for e in anomalies.events if of_run(run_id)(e)]
        assert ("replica_lost", 1) in seen
        # one restart for one failure: any later command (a silent rank while it healed)
        # was refused, never a second restart
        completed = [e for e in controller.events if of_run(run_id, RestartCompleted)(e)]
        assert [c.command_id for c in completed] == [first.command_id]
        later = {c.command_id for c in commands.events if of_run(run_id, RestartRequested)(c)}
        failed = {e.command_id for e in controller.events if of_run(run_id, RestartFailed)(e)}
        assert later - {first.command_id} <= failed
        audit = audit_cli(loop, run_id)
        assert audit.returncode == 0, (audit.stdout, audit.stderr)
    finally:
        launcher.close()
        kill_ranks(state_dir)
