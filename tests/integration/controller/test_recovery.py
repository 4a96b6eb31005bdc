"""The closed loop on real processes: a fault, a verdict, a signed command, a respawn.

Each test launches `runwatch launch --nproc 2 -- python examples/train_ddp.py ...` against
the session broker with one `runwatch processors` worker; the example's tiny model, 40 steps
at most, a checkpoint every 5 steps.
"""

from __future__ import annotations

import math
import re
import socket
import time
from pathlib import Path

import pytest

from runwatch.common.checkpoint_layout import (
    checkpoint_step,
    is_complete_checkpoint,
    list_set_aside,
)
from runwatch.processors.fleet import latest_states
from runwatch.schemas.events import AnomalyDetected, RankExited, RestartCompleted, RestartRequested

from .conftest import WAIT_S, audit_cli, ended_liveness, of_run, reference_losses, wait_events

pytestmark = [pytest.mark.integration, pytest.mark.torch]

STEPS = 40
KILL_AT = 19
KILL_ARGS = ["--steps", str(STEPS), "--seed", "2", "--inject", f"kill@{KILL_AT}:rank=1"]


def _continuity(loop, run_id: str, timeout_s: float = WAIT_S):
    """The run's latest restart record once its continuity verdict is no longer pending."""
    deadline = time.monotonic() + timeout_s
    while True:
        view = latest_states(loop.bootstrap, loop.app_id).get(run_id)
        restarts = view.steps.restarts if view and view.steps else ()
        if restarts and restarts[-1].verdict != "pending":
            return view.steps, restarts[-1]
        assert time.monotonic() < deadline, f"no continuity verdict for {run_id}: {view}"
        time.sleep(0.2)  # polling a changelog, not synchronising on time


def test_killed_rank_is_respawned_and_resumes_exactly(loop, launch, tmp_path):
    heartbeats = loop.reader(loop.topics.heartbeats)
    anomalies = loop.reader(loop.topics.anomalies)
    commands = loop.reader(loop.topics.commands)
    controller = loop.reader(loop.topics.controller)
    run = launch("kill", KILL_ARGS)
    # The reference runs while the launched gang does: same seed, same world size.
    (tmp_path / "ref").mkdir()
    reference = reference_losses(tmp_path / "ref", ["--steps", str(STEPS), "--seed", "2"])
    assert run.launcher.wait() == 0, run.launcher.log() + run.rank_logs()

    # Exit evidence: the launcher saw rank 1 die and said so on the heartbeats topic.
    (exit_1,) = wait_events(
        heartbeats, lambda e: of_run("kill", RankExited)(e) and e.rank == 1 and e.signal
    )
    assert (exit_1.incarnation, exit_1.signal, exit_1.host) == (0, 9, socket.gethostname())
    (dead,) = wait_events(anomalies, of_run("kill", AnomalyDetected))
    assert (dead.kind, dead.incarnation, dead.rank) == ("dead_rank", 0, 1)
    assert f"rank 1 on {socket.gethostname()} exited (signal 9 (SIGKILL)" in dead.detail
    assert dead.source.topic == loop.topics.heartbeats  # raised on the RankExited record
    (command,) = wait_events(commands, of_run("kill", RestartRequested))
    assert (command.action, command.incarnation, command.cause_kind) == ("respawn", 0, "dead_rank")
    (done,) = wait_events(controller, of_run("kill"))
    assert isinstance(done, RestartCompleted) and done.command_id == command.command_id
    assert done.world_size == 2 and done.checkpoint_step in (10, 15)
    assert done.checkpoint_path.endswith(f"step_{done.checkpoint_step:06d}")

    metrics = run.metrics()  # the resumed incarnation's trace
    assert (metrics["incarnation"], metrics["resumed_from"]) == (1, done.checkpoint_step)
    resumed = run.losses()
    assert sorted(resumed) == list(range(done.checkpoint_step + 1, STEPS + 1))
    assert resumed == {s: reference[s] for s in resumed}  # bit for bit, step for step

    steps, record = _continuity(loop, "kill")
    assert (record.from_step, record.incarnation, record.verdict) == (done.checkpoint_step, 1, "ok")
    assert steps.continuity_ok
    assert steps.anomaly_counts.get("restart_discontinuity", 0) == 0
    assert run.gang_record().status == "completed"
    # Exactly one verdict for the kill: rank 0, blocked on its dead peer, is not reported.
    liveness = ended_liveness(loop, "kill", incarnation=1)
    assert liveness.anomaly_counts == {"dead_rank": 1}, liveness.anomaly_counts
    # The exit verdict replays: `runwatch audit` folds the RankExited like any input record.
    audit = audit_cli(loop, "kill")
    assert audit.returncode == 0, (audit.stdout, audit.stderr)
    assert "every verdict reproduced" in audit.stdout, audit.stdout


def test_a_resume_that_drops_optimizer_state_is_a_discontinuity(loop, launch):
    # At lr 3e-2 the fresh Adam moments make the first updates after the resume sign steps
    # of full size: the loss jumps, as in a real run that lost its optimizer state. The kill
    # comes late so the resumed checkpoint (20 or 25) sits on the loss plateau.
    args = ["--steps", str(STEPS), "--seed", "2", "--inject", "kill@29:rank=1"]
    args += ["--lr", "3e-2", "--drop-optimizer-state"]
    anomalies = loop.reader(loop.topics.anomalies)
    run = launch("no-optim", args)
    assert run.launcher.wait() == 0, run.launcher.log() + run.rank_logs()
    found = wait_events(
        anomalies,
        lambda e: of_run("no-optim", AnomalyDetected)(e) and e.kind == "restart_discontinuity",
    )
    assert found[0].incarnation == 1
    steps, record = _continuity(loop, "no-optim")
    assert record.verdict == "broken" and not steps.continuity_ok


def test_nan_rolls_back_to_the_last_good_checkpoint(loop, launch):
    nan_at = 13
    anomalies = loop.reader(loop.topics.anomalies)
    commands = loop.reader(loop.topics.commands)
    controller = loop.reader(loop.topics.controller)
    # A step delay keeps the poisoned gang running until the rollback arrives.
    args = ["--steps", "30", "--inject", f"nan@{nan_at}", "--step-delay-s", "0.2"]
    run = launch("nan", args)
    (command,) = wait_events(commands, of_run("nan", RestartRequested))
    assert command.action == "rollback" and command.max_checkpoint_step == nan_at - 1
    (done,) = wait_events(controller, of_run("nan"))
    # Step 10's checkpoint is committed unless its write was still in flight when the
    # rollback SIGKILLed the gang (seconds later); never one of the poisoned ones (15, ...).
    assert isinstance(done, RestartCompleted) and done.checkpoint_step in (5, 10)
    assert run.launcher.wait() == 0, run.launcher.log() + run.rank_logs()
    nonfinite = wait_events(anomalies, of_run("nan", AnomalyDetected))
    assert {(a.kind, a.step, a.incarnation) for a in nonfinite if "nonfinite" in a.kind} >= {
        ("nonfinite_loss", nan_at, 0)
    }
    assert all(a.incarnation == 0 for a in nonfinite if a.kind != "restart_discontinuity")
    losses = run.losses()  # the resumed incarnation: finite, from the checkpoint to the end
    assert min(losses) == done.checkpoint_step + 1 and max(losses) == 30
    assert all(math.isfinite(v) for v in losses.values())
    assert f"resumed from {done.checkpoint_path} at step {done.checkpoint_step}" in run.rank_logs()
    # The rollback deleted nothing: what lay past its checkpoint was moved aside, whole.
    log = (run.state_dir / "logs" / "inc1.rank0.log").read_text()
    for name, where in re.findall(r"moved (step_\d+) aside to (\S+) ", log):
        assert checkpoint_step(name) > done.checkpoint_step  # type: ignore[operator]
        assert is_complete_checkpoint(Path(where) / name), f"{where}/{name} lost"
    for aside in list_set_aside(run.checkpoint_dir):
        assert aside.name.startswith("inc1-")


def test_a_rank_past_its_failure_budget_shrinks_the_gang(loop, launch):
    controller = loop.reader(loop.topics.controller)
    args = ["--steps", "25", "--inject", "kill@12:rank=1"]
    run = launch("elastic", args, extra=["--rank-failure-budget", "0"])
    assert run.launcher.wait() == 0, run.launcher.log() + run.rank_logs()
    (done,) = wait_events(controller, of_run("elastic"))
    assert isinstance(done, RestartCompleted) and done.world_size == 1
    # The write of step 10 may still be in flight at the kill (2 steps later, on a busy
    # machine): then 5 is the latest committed checkpoint, and the right one to resume.
    assert done.checkpoint_step in (5, 10)
    record = run.gang_record()
    assert (record.world_size, record.incarnation, len(record.ranks)) == (1, 1, 1)
    assert run.metrics()["world_size"] == 1
    assert "saved by 2 ranks, now 1" in run.rank_logs()
    assert "elastic: rank 1 failed 1 times" in run.launcher.log()
