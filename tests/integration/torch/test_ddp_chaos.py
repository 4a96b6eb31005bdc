"""A rank SIGKILLs itself mid-run; the survivor fails fast; a restarted gang resumes.

The kill fires only in incarnation 0, so the restarted gang (``RUNWATCH_INCARNATION=1``)
runs through; it resumes from the newest checkpoint that was complete on disk when the gang
died, never from the ``.tmp`` directory a write in flight left behind.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from runwatch.common.checkpoint_layout import is_complete_checkpoint, latest_complete_checkpoint

pytestmark = pytest.mark.torch

KILL_AT = 9
COMMON = ["--steps", "12", "--checkpoint-every", "2", "--keep-checkpoints", "2", "--seed", "1"]


@pytest.fixture(scope="module")
def runs(gang_runner, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("ckpt")
    args = [*COMMON, "--checkpoint-dir", str(ckpt), "--inject", f"kill@{KILL_AT}:rank=1"]
    crashed = gang_runner(2, args, "crashed")
    latest = latest_complete_checkpoint(ckpt)
    restarted = gang_runner(2, [*args, "--resume"], "restarted", env={"RUNWATCH_INCARNATION": "1"})
    return crashed, latest, restarted


def test_killed_rank_dies_and_the_survivor_fails(runs):
    crashed, _, _ = runs
    assert crashed.returncodes == [1, -9], "\n".join(crashed.logs)
    # A peer failure ends the rank, not the run: no RunEnded (it would suspend liveness
    # checks, and the dead_rank verdict that gets the gang respawned would never come).
    assert crashed.events(0, "run_ended") == []
    assert f"rank 0 failed after step {KILL_AT - 1} (a peer failed" in crashed.logs[0]
    assert "Connection" in crashed.logs[0] or "gloo" in crashed.logs[0].lower()
    assert crashed.events(0, "step")[-1]["step"] == KILL_AT - 1
    beats = crashed.events(1, "heartbeat")
    assert beats[-1]["step"] == KILL_AT - 1


def test_only_complete_checkpoints_are_reported_and_resumed(runs):
    crashed, latest, _ = runs
    assert latest is not None and latest[0] <= KILL_AT - 1
    committed = crashed.events(0, "checkpoint_committed")
    assert committed and committed[-1]["step"] == latest[0]
    assert all(not c["path"].endswith(".tmp") for c in committed)


def test_restart_resumes_from_the_latest_complete_checkpoint(runs):
    _, latest, restarted = runs
    assert restarted.returncodes == [0, 0], "\n".join(restarted.logs)
    steps = restarted.events(0, "step")
    assert steps[0]["step"] == latest[0] + 1
    assert steps[0]["restart_from_step"] == latest[0]
    assert steps[-1]["step"] == 12
    assert restarted.events(0, "run_ended")[0]["status"] == "completed"
    final = Path(restarted.events(0, "checkpoint_committed")[-1]["path"])
    assert is_complete_checkpoint(final) and final.name == "step_000012"


def test_sigterm_stops_the_gang_with_a_checkpoint(tmp_path, gang_control):
    start_gang, wait_gang = gang_control
    ckpt, trace = tmp_path / "ckpt", tmp_path / "trace"
    procs = start_gang(
        2, ["--steps", "100000", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1000"], trace
    )
    beats = trace / "events.rank1.jsonl"
    deadline = time.monotonic() + 300
    # A rank installs its SIGTERM handler before its first step: three heartbeats mean
    # both are past it (rank 1 steps in lockstep with rank 0). On a loaded box start-up
    # alone can take a minute; signalled before the handler, a rank just dies (-15).
    while not beats.exists() or beats.read_text().count('"heartbeat"') < 3:
        assert time.monotonic() < deadline, "no three heartbeats of rank 1 within 300 s"
        assert all(p.poll() is None for p in procs), "a rank ended before its third step"
        time.sleep(0.05)  # polling a file the rank appends to, with a deadline
    for p in procs:
        p.send_signal(signal.SIGTERM)
    gang = wait_gang(procs, trace, timeout_s=60)
    assert gang.returncodes == [0, 0], "\n".join(gang.logs)
    (ended,) = gang.events(0, "run_ended")
    assert ended["status"] == "stopped" and ended["final_step"] >= 3
    assert latest_complete_checkpoint(ckpt)[0] == ended["final_step"]
    # Both ranks stopped after the same step: they agree through the per-step all-reduce.
    assert gang.events(1, "heartbeat")[-1]["step"] == ended["final_step"]
