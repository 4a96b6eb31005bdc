"""Hang diagnostics on a real gang: before a hung gang is stopped, each rank says where it is.

`runwatch launch --nproc 2` runs `examples/train_ddp.py` with rank 1 hanging in a sleep at
step 8; rank 0 blocks in the next collective. The processors raise a liveness verdict, the
controller executes the signed respawn and, before stopping the gang, asks both ranks for
their Python stacks (SIGUSR1, `producers.stackdump`). RestartCompleted carries where each
was; the full stacks stay in the controller's state directory.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from runwatch.schemas.events import RestartCompleted, RestartRequested

from .conftest import of_run, wait_events

pytestmark = [pytest.mark.integration, pytest.mark.torch]


def test_a_hung_gang_says_where_each_rank_was(loop, launch, capsys):
    commands = loop.reader(loop.topics.commands)
    controller = loop.reader(loop.topics.controller)
    run = launch("hang", ["--steps", "16", "--inject", "hang@8:rank=1:secs=600"])
    (command,) = wait_events(commands, of_run("hang", RestartRequested))
    assert command.action == "respawn" and command.cause_kind in ("hang", "dead_rank")
    (done,) = wait_events(controller, of_run("hang"))
    assert isinstance(done, RestartCompleted) and done.command_id == command.command_id

    where = {s.rank: s for s in done.stacks}
    assert sorted(where) == [0, 1] and {s.host for s in done.stacks} == {socket.gethostname()}
    assert where[1].where.startswith("before_step (examples/faults.py:"), where[1]
    assert where[0].where and where[0].note == "", where[0]  # blocked in the collective
    assert "faults.py" not in where[0].where
    full = Path(done.stacks_dir, "inc0.rank1.txt").read_text()
    assert "in before_step" in full and "in main" in full
    assert run.launcher.wait() == 0, run.launcher.log() + run.rank_logs()
    assert "rank 1 was in before_step (examples/faults.py:" in run.launcher.log()

    from runwatch.cli import main

    argv = ["--bootstrap", loop.bootstrap, "--prefix", loop.prefix, "--app-id", loop.app_id]
    assert main(["status", *argv, "--run", "hang"]) == 0
    out = capsys.readouterr().out
    assert "hang: where the ranks were before the last restart" in out, out
    assert any(
        line.split()[:2] == ["rank", "1"] and "before_step (examples/faults.py:" in line
        for line in out.splitlines()
    ), out
