"""Warm spares in the closed loop: a killed rank's gang restarts in preloaded processes.

`runwatch launch --warm-spares --nproc 2 -- python examples/train_ddp.py`, real gloo, real
DCP, the session broker and one processors worker. Once both spares are preloaded (their
ready files) the test SIGKILLs rank 1; the verdict, the command and the restart follow,
and incarnation 1 must run in those very spares and reproduce an uninterrupted gang's
losses bit for bit. When the run ends, no spare may be left running.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from runwatch.schemas.events import RestartCompleted, StepCompleted

from .conftest import WAIT_S, of_run, reference_losses, wait_events

pytestmark = [pytest.mark.integration, pytest.mark.torch]

STEPS = 40
ARGS = ["--steps", str(STEPS), "--seed", "3", "--step-delay-s", "0.5"]


def _ready_spares(state_dir: Path, count: int, run_done, timeout_s: float = WAIT_S) -> set[str]:
    """Names of the spares once ``count`` of them are preloaded (their ready files)."""
    deadline = time.monotonic() + timeout_s
    while True:
        ready = {p.stem for p in (state_dir / "spares").glob("*.ready")}
        if len(ready) >= count:
            return ready
        assert not run_done(), "the run ended before its spares were ready"
        assert time.monotonic() < deadline, f"spares not ready: {ready}"
        time.sleep(0.1)  # polling files the spares write, with a deadline


def _spare_processes(state_dir: Path) -> list[int]:
    """Live processes whose command line names this run's spares directory."""
    marker = str(state_dir / "spares").encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue  # it ended meanwhile
    return found


def test_a_restart_runs_in_the_warm_spares_and_resumes_exactly(loop, launch, tmp_path):
    steps = loop.reader(loop.topics.steps)
    controller = loop.reader(loop.topics.controller)
    run = launch("warm", ARGS, extra=["--warm-spares"])
    (tmp_path / "ref").mkdir()
    reference = reference_losses(tmp_path / "ref", ["--steps", str(STEPS), "--seed", "3"])
    wait_events(steps, lambda e: of_run("warm", StepCompleted)(e) and e.step >= 6)
    spares = _ready_spares(run.state_dir, 2, lambda: run.launcher.proc.poll() is not None)
    (rank_1,) = [r.pid for r in run.gang_record().ranks if r.rank == 1]
    os.killpg(rank_1, signal.SIGKILL)

    (done,) = wait_events(controller, of_run("warm"))
    assert isinstance(done, RestartCompleted) and done.world_size == 2
    assert run.launcher.wait() == 0, run.launcher.log() + run.rank_logs()
    assert "2 in warm spares" in run.launcher.log()
    # Each rank of incarnation 1 ran in one of the spares that were ready before the kill:
    # its exit status was written where that spare's wrapper writes it.
    used = {
        (run.state_dir / "exit" / f"inc1.rank{r}").resolve().name.removesuffix(".exit")
        for r in (0, 1)
    }
    assert used == spares, (used, spares)
    resumed = run.losses()  # the resumed incarnation's trace
    assert run.metrics()["incarnation"] == 1
    assert sorted(resumed) == list(range(done.checkpoint_step + 1, STEPS + 1))
    assert resumed == {s: reference[s] for s in resumed}  # bit for bit, step for step
    assert run.gang_record().status == "completed"
    assert _spare_processes(run.state_dir) == []  # the refilled spares went with the agent
