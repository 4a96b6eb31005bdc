"""Ranks running on after the gang finished training: the rules of `controller.teardown`,
then the agent with real processes (a rank that says it finished and then never exits)."""

from __future__ import annotations

import logging
import signal
import sys
import time

import pytest

from runwatch.controller.gang import RUNNING
from runwatch.controller.state import ControllerState
from runwatch.controller.teardown import (
    STOPPED,
    TEARDOWN_WARN_S,
    TeardownAction,
    TeardownClock,
    teardown_step,
)
from runwatch.schemas.events import Event, RankExited
from tests.unit.controller.builders import spec, supervisor

WAIT, WARN, STOP, KILL = (
    TeardownAction.WAIT, TeardownAction.WARN, TeardownAction.STOP, TeardownAction.KILL
)  # fmt: skip


@pytest.mark.parametrize(
    ("clock", "every_done", "running", "now_s", "timeout_s", "expected"),
    [
        (TeardownClock(5.0), False, 1, 100.0, 1.0, (STOPPED, WAIT)),
        (TeardownClock(5.0), True, 0, 100.0, 1.0, (STOPPED, WAIT)),
        (STOPPED, True, 1, 100.0, 30.0, (TeardownClock(100.0), WAIT)),
        (TeardownClock(100.0), True, 1, 130.0, 30.0, (TeardownClock(100.0, None, 130.0), STOP)),
        (TeardownClock(100.0), True, 1, 129.9, 30.0, (TeardownClock(100.0), WAIT)),
        (TeardownClock(100.0, None, 130.0), True, 1, 131.0, 30.0,
         (TeardownClock(100.0, None, 130.0), WAIT)),
        (TeardownClock(100.0, None, 130.0), True, 1, 130.0 + TEARDOWN_WARN_S, 30.0,
         (TeardownClock(100.0, 130.0 + TEARDOWN_WARN_S, 130.0), KILL)),
        (TeardownClock(100.0, 190.0, 130.0), True, 1, 249.0, 30.0,
         (TeardownClock(100.0, 190.0, 130.0), WAIT)),
        (TeardownClock(100.0, 190.0, 130.0), True, 1, 250.0, 30.0,
         (TeardownClock(100.0, 250.0, 130.0), KILL)),
        (TeardownClock(100.0, 160.0, 400.0), True, 1, 401.0, 300.0,
         (TeardownClock(100.0, 160.0, 400.0), WAIT)),
        (TeardownClock(100.0, None, 130.0), True, 0, 1e6, 30.0, (STOPPED, WAIT)),
        (TeardownClock(100.0), True, 2, 100.0 + TEARDOWN_WARN_S, None,
         (TeardownClock(100.0, 100.0 + TEARDOWN_WARN_S), WARN)),
        (TeardownClock(100.0, 160.0), True, 2, 219.0, None, (TeardownClock(100.0, 160.0), WAIT)),
        (TeardownClock(100.0, 160.0), True, 2, 220.0, None, (TeardownClock(100.0, 220.0), WARN)),
        (TeardownClock(100.0, 160.0), True, 2, 1e6, None, (TeardownClock(100.0, 1e6), WARN)),
        (TeardownClock(100.0, 160.0), True, 2, 400.0, 300.0,
         (TeardownClock(100.0, 160.0, 400.0), STOP)),
    ],
    ids=[
        "1-a-rank-still-training", "1-none-running", "2-the-clock-starts", "4-timeout-passed",
        "6-just-before-the-timeout", "3-stopped-never-stopped-twice", "3-outlived-the-stop",
        "3-between-kills", "3-next-kill", "3-a-warning-before-the-stop-does-not-count",
        "1-the-survivor-died", "5-first-warning", "6-between-warnings", "5-next-warning",
        "5-no-timeout-never-stops", "4-stop-before-a-warning",
    ],
)  # fmt: skip
def test_the_rules(clock, every_done, running, now_s, timeout_s, expected):
    got = teardown_step(
        clock, every_done=every_done, running=running, now_s=now_s, timeout_s=timeout_s
    )
    assert got == expected


PY = sys.executable
# Both ranks say their training finished; rank 1 then hangs as in an NCCL destructor
# waiting for a peer that left (``hang``), or trains on (``training``: rank 0 said it
# finished, rank 1 has not).
HANGING = (
    "import os, sys, time\n"
    "from runwatch.producers import mark_training_done\n"
    "rank = os.environ['RANK']\n"
    "if rank == '0' or sys.argv[1] == 'hang':\n"
    "    assert mark_training_done(20) is not None\n"
    "if rank == '1':\n"
    "    time.sleep(600)\n"
)


def _gang_in_teardown(tmp_path, how: str, timeout_s: float | None):
    """The gang launched, rank 0 exited and rank 1 still running (its word said or not)."""
    state = ControllerState(tmp_path / "state")
    launched = spec(
        argv=(PY, "-c", HANGING, how),
        bootstrap="127.0.0.1:1",
        grace_s=5.0,
        teardown_timeout_s=timeout_s,
    )
    published: list[Event] = []
    sup = supervisor(state, launched, publish=published.append)
    sup.launch(None)
    deadline = time.monotonic() + 60
    word = state.done_path(0, 1)
    while sup.launcher.status(0) == RUNNING or (how == "hang" and not word.is_file()):
        assert time.monotonic() < deadline, "rank 0 did not exit, or rank 1 said nothing"
        sup.launcher.gang.wait(0.05, poll_s=0.01)
    assert sup.launcher.status(1) == RUNNING
    return sup, published


def test_a_rank_hung_after_the_gang_finished_is_stopped_and_the_run_completes(tmp_path):
    sup, published = _gang_in_teardown(tmp_path, "hang", timeout_s=30.0)
    try:
        t0 = time.monotonic()
        sup.observe(t0)  # the clock starts
        assert sup.launcher.status(1) == RUNNING
        sup.observe(t0 + 29.0)
        assert sup.launcher.status(1) == RUNNING
        sup.observe(t0 + 30.0)  # the timeout: rank 1 is stopped (SIGTERM)
        assert sup.launcher.status(1) != RUNNING
        sup.observe(t0 + 31.0)  # its exit: killed after its word, so finished
        assert sup.state.load_gang().record.status == "completed"
        exits = {e.rank: e for e in published if isinstance(e, RankExited)}
        assert (exits[1].signal, exits[1].finished) == (signal.SIGTERM, True)
        assert sup.dead_since_s is None
    finally:
        sup.launcher.gang.stop(0.0, kill_now=True)


def test_without_a_timeout_the_agent_warns_and_never_stops(tmp_path, caplog):
    sup, _ = _gang_in_teardown(tmp_path, "hang", timeout_s=None)
    try:
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="runwatch.controller.supervisor"):
            sup.observe(t0)
            sup.observe(t0 + TEARDOWN_WARN_S)
            sup.observe(t0 + 100 * TEARDOWN_WARN_S)
        warnings = [r.getMessage() for r in caplog.records if "still running" in r.getMessage()]
        assert len(warnings) == 2
        assert "ranks [1] still running 60s after every local rank finished" in warnings[0]
        assert "--teardown-timeout" in warnings[0]
        assert sup.launcher.status(1) == RUNNING
        assert sup.state.load_gang().record.status == "running"
    finally:
        sup.launcher.gang.stop(0.0, kill_now=True)


def test_a_rank_that_outlives_the_stop_is_killed_again_each_minute_never_stopped_twice(
    tmp_path, caplog, monkeypatch
):
    # A rank in uninterruptible sleep outlives SIGKILL; no test can make one, so the
    # launcher's stop is recorded and does nothing (the rank runs on, as such a rank does).
    sup, _ = _gang_in_teardown(tmp_path, "hang", timeout_s=30.0)
    stops: list[tuple[float, bool]] = []
    monkeypatch.setattr(
        sup.launcher, "stop", lambda scope, *, grace_s, kill_now: stops.append((grace_s, kill_now))
    )
    try:
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="runwatch.controller.supervisor"):
            sup.observe(t0)
            sup.observe(t0 + 30.0)  # the timeout: stacks, then the long stop
            assert stops == [(5.0, False)]
            for k in range(1, 6):
                sup.observe(t0 + 30.0 + k * TEARDOWN_WARN_S / 6)  # within the minute
            assert stops == [(5.0, False)]
            sup.observe(t0 + 30.0 + TEARDOWN_WARN_S)  # a minute on: SIGKILL again
            sup.observe(t0 + 30.0 + 1.5 * TEARDOWN_WARN_S)
            sup.observe(t0 + 30.0 + 2 * TEARDOWN_WARN_S)
        assert stops == [(5.0, False), (0.0, True), (0.0, True)]
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 2
        assert "ranks [1] outlived SIGKILL 60s ago" in errors[0]
        assert len([r for r in caplog.records if "stopping ranks" in r.getMessage()]) == 1
        assert sup.state.load_gang().record.status == "running"
    finally:
        sup.launcher.gang.stop(0.0, kill_now=True)


def test_a_rank_that_has_not_finished_is_never_stopped(tmp_path, caplog):
    # Rank 0 said it finished and left; rank 1 trains on (or hangs before its word): not a
    # teardown, whatever the timeout (liveness and the exit rules own that case).
    sup, _ = _gang_in_teardown(tmp_path, "training", timeout_s=1.0)
    try:
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="runwatch.controller.supervisor"):
            for k in range(5):
                sup.observe(t0 + k * 1000.0)
        assert sup.launcher.status(1) == RUNNING
        assert not [r for r in caplog.records if "still running" in r.getMessage()]
        assert sup.teardown == STOPPED
    finally:
        sup.launcher.gang.stop(0.0, kill_now=True)


@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_a_teardown_timeout_that_is_not_positive_is_a_one_line_usage_error(value, capsys, tmp_path):
    from runwatch.cli import main

    base = ["launch", "--nproc", "1", "--state-dir", str(tmp_path), "--bootstrap", "127.0.0.1:1"]
    code = main([*base, "--teardown-timeout", value, "--", "python", "train.py"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--teardown-timeout must be > 0" in err and len(err.strip().splitlines()) == 1
