"""Gangs of plain processes: exit codes through the wrapper, stop, adoption by pid."""

from __future__ import annotations

import os
import signal
import sys
import time

from runwatch.controller.gang import RUNNING, Gang

PY = sys.executable


def _gang(tmp_path, *argvs):
    n = len(argvs)
    logs = [tmp_path / f"r{r}.log" for r in range(n)]
    exits = [tmp_path / f"r{r}.exit" for r in range(n)]
    gangs = [
        Gang.launch(argv, [dict(os.environ)], [logs[r]], [exits[r]]) for r, argv in enumerate(argvs)
    ]
    return gangs, exits


def test_exit_codes_are_recorded_for_children_and_adopters(tmp_path):
    (ok, bad, killed), exits = _gang(
        tmp_path,
        [PY, "-c", "print('hi')"],
        [PY, "-c", "raise SystemExit(3)"],
        [PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
    )
    for gang in (ok, bad, killed):
        assert gang.wait(30)
    assert [g.status(0) for g in (ok, bad, killed)] == [0, 3, 128 + signal.SIGKILL]
    assert [e.read_text().strip() for e in exits] == ["0", "3", "137"]
    adopted = Gang.adopt(bad.ranks, [exits[1]])
    assert adopted.status(0) == 3 and adopted.running() == []
    assert (tmp_path / "r0.log").read_text() == "hi\n"


def test_stop_sends_sigterm_to_the_group_then_sigkill(tmp_path):
    handles_term = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    ignores_term = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    (polite, stubborn), exits = _gang(tmp_path, [PY, "-c", handles_term], [PY, "-c", ignores_term])
    deadline = time.monotonic() + 30
    for r in (0, 1):  # wait until the handlers are installed: the rank says so in its log
        while "ready" not in (tmp_path / f"r{r}.log").read_text():
            assert (polite if r == 0 else stubborn).status(0) == RUNNING
            assert time.monotonic() < deadline
            time.sleep(0.01)  # polling a file the rank writes, not timing the rank
    adopted = Gang.adopt(polite.ranks, [exits[0]])
    assert adopted.running() == [0]
    polite.stop(grace_s=10)
    assert polite.status(0) == 7  # clean SIGTERM exit, recorded by the wrapper
    assert adopted.status(0) == 7 and adopted.running() == []
    stubborn.stop(grace_s=0.3)
    assert stubborn.status(0) == -signal.SIGKILL and not exits[1].exists()
