"""What the supervisor logs: one INFO line per restart step, WARNING for trouble, nothing per poll.

Real processes (plain Python, no torch), no Kafka: what would be published is collected.
"""

from __future__ import annotations

import logging
import sys
import time

from runwatch.controller.state import ControllerState
from runwatch.schemas.events import Event, RestartCompleted
from tests.unit.controller.builders import command, spec, supervisor

PY = sys.executable
# Rank 1 SIGKILLs itself; rank 0 blocks (as a DDP peer does on its dead peer).
SCRIPT = (
    "import os, signal, time\n"
    "if os.environ['RANK'] == '1' and os.environ['RUNWATCH_INCARNATION'] == '0':\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "time.sleep(600)\n"
)


def _lines(caplog, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("runwatch.controller") and r.levelno == level
    ]


def test_a_restart_is_info_step_by_step_and_only_the_dead_rank_is_a_warning(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="runwatch")
    published: list[Event] = []
    launched = spec(argv=(PY, "-c", SCRIPT), bootstrap="127.0.0.1:1", grace_s=0.2)
    sup = supervisor(ControllerState(tmp_path / "state"), launched, publish=published.append)
    sup.launch(None)
    try:
        deadline = time.monotonic() + 60
        while 1 not in sup.exits:  # awaiting rank 1's exit, as the controller loop does
            assert time.monotonic() < deadline, "rank 1 did not exit"
            sup.launcher.gang.wait(0.05, poll_s=0.01)
            sup.observe(time.monotonic())
        before = len(caplog.records)
        for _ in range(50):  # the loop looks at the gang every 100 ms: nothing new, no line
            sup.observe(time.monotonic())
        assert len(caplog.records) == before
        sup.execute(command(cause_kind="nonfinite_loss", action="rollback"), time.monotonic())
        assert any(isinstance(e, RestartCompleted) for e in published)
    finally:
        sup.launcher.gang.stop(0.0, kill_now=True)
    warnings = _lines(caplog, logging.WARNING)
    assert len(warnings) == 1, warnings
    assert "rank 1 " in warnings[0] and "was killed by signal 9 (SIGKILL)" in warnings[0]
    info = _lines(caplog, logging.INFO)
    assert [line.split(": ", 1)[-1].split(" ")[0] for line in info] == [
        "node",  # incarnation 0: node 0/1 started ranks ...
        "failure",  # failure charged to ranks [1]
        "stopping",  # stopping incarnation 0 (SIGKILL)
        "node",  # incarnation 1: node 0/1 started ranks ...
        "rollback",  # rollback completed in ...
    ], info
