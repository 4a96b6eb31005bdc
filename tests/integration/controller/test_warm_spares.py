"""Warm spares in the closed loop: a killed rank's gang restarts in preloaded processes.

`runwatch launch --warm-spares --nproc 2 -- python examples/train_ddp.py`, real gloo, real
DCP, the session broker and one processors worker. The uninterrupted reference run comes
first, so nothing competes with the gang for the CPUs. The gang is held at step 6
(``--hold-after-step 6 --hold-file F``: every rank waits while F exists; the run's own
liveness thresholds are raised so the silent hold is no verdict) until both spares are
preloaded (their ready files) and the checkpoint of step 5 is complete on disk; then rank
1, alive because held, is SIGKILLed and F removed. The verdict, the command and the
restart follow; incarnation 1 (which never holds) must run in those very spares and
reproduce the reference's losses bit for bit. When the run ends, no spare may be left.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from runwatch.common.checkpoint_layout import latest_complete_checkpoint
from runwatch.schemas.events import RestartCompleted, StepCompleted

from .conftest import WAIT_S, of_run, reference_losses, wait_events

pytestmark = [pytest.mark.integration, pytest.mark.torch]

STEPS = 40
HOLD_STEP = 6
CHECKPOINT_STEP = 5  # --checkpoint-every 5 (the launch fixture's)
QUIET = ["--threshold", "dead_rank_timeout_s=600", "--threshold", "hang_timeout_s=600"]
"""The hold is silent: the run's liveness thresholds outlast any wait for the spares."""


def _await(what: str, ready: Callable[[], bool], run_done: Callable[[], bool]) -> None:
    """Poll ``ready`` (a file the gang or its spares write) until true, with a deadline."""
    deadline = time.monotonic() + WAIT_S
    while not ready():
        assert not run_done(), f"the run ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {WAIT_S}s"
        time.sleep(0.1)  # polling files, with a deadline


def _ready_spares(state_dir: Path) -> set[str]:
    """Names of the spares preloaded so far (their ready files)."""
    return {p.stem for p in (state_dir / "spares").glob("*.ready")}


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
    (tmp_path / "ref").mkdir()
    reference = reference_losses(tmp_path / "ref", ["--steps", str(STEPS), "--seed", "3"])
    steps = loop.reader(loop.topics.steps)
    controller = loop.reader(loop.topics.controller)
    hold = tmp_path / "hold"
    hold.touch()
    args = ["--steps", str(STEPS), "--seed", "3", *QUIET]
    args += ["--hold-after-step", str(HOLD_STEP), "--hold-file", str(hold)]
    run = launch("warm", args, extra=["--warm-spares"])
    run_done = lambda: run.launcher.proc.poll() is not None  # noqa: E731
    wait_events(steps, lambda e: of_run("warm", StepCompleted)(e) and e.step == HOLD_STEP)
    _await("2 ready spares", lambda: len(_ready_spares(run.state_dir)) >= 2, run_done)
    found = lambda: latest_complete_checkpoint(run.checkpoint_dir)  # noqa: E731
    _await(f"checkpoint {CHECKPOINT_STEP}", lambda: found() is not None, run_done)
    spares = _ready_spares(run.state_dir)
    (rank_1,) = [r.pid for r in run.gang_record().ranks if r.rank == 1]
    os.killpg(rank_1, signal.SIGKILL)  # held at step 6: it is alive
    hold.unlink()  # rank 0 goes on, and fails in its next collective

    (done,) = wait_events(controller, of_run("warm"))
    assert isinstance(done, RestartCompleted) and done.world_size == 2
    assert done.checkpoint_step == CHECKPOINT_STEP  # the gang never got past step 6
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
    assert sorted(resumed) == list(range(CHECKPOINT_STEP + 1, STEPS + 1))
    assert resumed == {s: reference[s] for s in resumed}  # bit for bit, step for step
    assert run.gang_record().status == "completed"
    assert _spare_processes(run.state_dir) == []  # the refilled spares went with the agent
