"""The agent's exit evidence: every rank exit it notices becomes a RankExited, culprit first."""

from __future__ import annotations

import signal
import sys
import time

import pytest

from runwatch.controller.elastic import RankExit, culprits
from runwatch.controller.state import ControllerState
from runwatch.controller.supervisor import HOST, RunSupervisor
from runwatch.schemas.events import Event, RankExited, RestartCompleted, RestartRequested
from tests.unit.controller.builders import record, spec, supervisor

PY = sys.executable
# Rank 1 SIGKILLs itself; rank 0 fails a moment later (as a DDP peer does in its next
# collective).
SCRIPT = (
    "import os, signal, sys, time\n"
    "if os.environ['RANK'] == '1':\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "time.sleep(0.5)\n"
    "sys.exit(1)\n"
)


@pytest.mark.parametrize(
    ("code", "fields"),
    [(0, (0, None)), (3, (3, None)), (-9, (None, 9)), (137, (None, 9)), (None, (None, None))],
)
def test_exit_fields(code, fields):
    gone = RankExit(0, code, 0.0)
    assert (gone.exit_code, gone.signal) == fields


def test_report_order_puts_signals_first():
    exits = [RankExit(0, 1, 0.0), RankExit(1, 137, 0.0), RankExit(2, 0, 0.0), RankExit(3, 2, 0.0)]
    assert [e.rank for e in sorted(exits, key=RankExit.report_order)] == [1, 0, 3, 2]


def test_every_exit_is_published_once_culprit_first(tmp_path):
    state = ControllerState(tmp_path / "state")
    launched = spec(argv=(PY, "-c", SCRIPT), bootstrap="127.0.0.1:1")
    published: list[Event] = []
    sup = supervisor(state, launched, record(launched, incarnation=3), publish=published.append)
    sup.launch(None)
    assert sup.launcher.gang.wait(60.0), "the ranks did not exit"
    sup.observe(time.monotonic())  # both exits in one sweep: rank 0 is looked at first
    sup.observe(time.monotonic())  # nothing new: nothing published again
    exits = [e for e in published if isinstance(e, RankExited)]
    assert [(e.rank, e.exit_code, e.signal) for e in exits] == [
        (1, None, signal.SIGKILL),
        (0, 1, None),
    ]
    pids = {p.rank: p.pid for p in sup.record.ranks}
    assert all(e.incarnation == 3 and e.host == HOST and e.pid == pids[e.rank] for e in exits)
    assert exits[0].ts_ns <= exits[1].ts_ns


def test_a_command_before_the_peers_die_still_charges_the_culprit(tmp_path):
    # Exit evidence brings the command while rank 0 still runs (blocked on its dead peer):
    # the failure is charged to rank 1 all the same, so a budget of 0 shrinks the gang.
    blocked = "import os, signal, time\nif os.environ['RANK'] == '1':\n"
    blocked += "    os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(600)\n"
    state = ControllerState(tmp_path / "state")
    launched = spec(
        argv=(PY, "-c", blocked), bootstrap="127.0.0.1:1", grace_s=0.2, rank_failure_budget=0
    )
    published: list[Event] = []
    sup = supervisor(state, launched, publish=published.append)
    sup.launch(None)
    try:
        deadline = time.monotonic() + 60
        while 1 not in sup.exits:  # awaiting rank 1's exit, as the controller loop does
            assert time.monotonic() < deadline, "rank 1 did not exit"
            sup.launcher.gang.wait(0.05, poll_s=0.01)
            sup.observe(time.monotonic())
        assert sup.launcher.running() == [0]
        command = RestartRequested(
            run_id="r",
            ts_ns=1,
            command_id="c1",
            action="respawn",
            cause_verdict_id="v1",
            cause_kind="dead_rank",
        )
        sup.execute(command, time.monotonic())
        (done,) = [e for e in published if isinstance(e, RestartCompleted)]
        assert done.world_size == 1 and sup.record.world_size == 1
        # rank 0's exit was caused by the stop: it was never published as evidence
        assert [e.rank for e in published if isinstance(e, RankExited)] == [1]
    finally:
        sup.launcher.gang.stop(0.0, kill_now=True)


# Rank 1 writes an error file the way torch's @record does (the real decorator is
# exercised in tests/unit/torch/test_record_error_file.py), then exits 1; rank 0 exits 1
# without one, as a peer failing its collective.
RECORDING = (
    "import json, os, sys\n"
    "if os.environ['RANK'] == '1':\n"
    "    message = {'message': 'ValueError: batch 7 has\\n  no tokens',\n"
    "               'extraInfo': {'py_callstack': 'Traceback ...', 'timestamp': '1'}}\n"
    "    with open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w') as f:\n"
    "        json.dump({'message': message}, f)\n"
    "sys.exit(1)\n"
)


def test_the_exit_evidence_carries_the_root_cause_the_rank_recorded(tmp_path):
    state = ControllerState(tmp_path / "state")
    launched = spec(argv=(PY, "-c", RECORDING), bootstrap="127.0.0.1:1")
    published: list[Event] = []
    sup = supervisor(state, launched, record(launched, incarnation=2), publish=published.append)
    sup.launch(None)
    assert sup.launcher.gang.wait(60.0), "the ranks did not exit"
    sup.observe(time.monotonic())
    causes = {e.rank: e.root_cause for e in published if isinstance(e, RankExited)}
    assert causes == {0: "", 1: "ValueError: batch 7 has no tokens"}
    assert state.error_path(2, 1).is_file()  # left where it was: nothing is deleted


def test_a_stale_error_file_is_not_read_as_a_new_ranks_root_cause(tmp_path):
    state = ControllerState(tmp_path / "state")
    stale = state.error_path(0, 0)
    stale.write_text('{"message": {"message": "OldError: from an earlier gang"}}')
    launched = spec(argv=(PY, "-c", "raise SystemExit(2)"), bootstrap="127.0.0.1:1", nproc=1)
    published: list[Event] = []
    sup = supervisor(state, launched, publish=published.append)
    sup.launch(None)
    assert sup.launcher.gang.wait(60.0), "the rank did not exit"
    sup.observe(time.monotonic())
    (gone,) = [e for e in published if isinstance(e, RankExited)]
    assert (gone.exit_code, gone.root_cause) == (2, "")


# Both ranks finish; rank 1 then dies in its interpreter's teardown (SIGABRT, as gloo's
# threads freed at exit do), having said first that its training finished, or not.
TEARDOWN = (
    "import os, sys\n"
    "from runwatch.producers import mark_training_done\n"
    "if os.environ['RANK'] == '1':\n"
    "    if sys.argv[1] != 'silent':\n"
    "        assert mark_training_done(20) is not None\n"
    "    if sys.argv[1] == 'raised':\n"
    "        sys.exit(1)  # after training: a final save that failed\n"
    "    os.abort()\n"
    "sys.exit(0)\n"
)


def _finish_gang(tmp_path, said: str) -> tuple[RunSupervisor, list[Event]]:
    state = ControllerState(tmp_path / "state")
    launched = spec(argv=(PY, "-c", TEARDOWN, said), bootstrap="127.0.0.1:1")
    published: list[Event] = []
    sup = supervisor(state, launched, publish=published.append)
    sup.launch(None)
    assert sup.launcher.gang.wait(60.0), "the ranks did not exit"
    sup.observe(time.monotonic())
    return sup, published


def test_an_abort_after_the_rank_finished_completes_the_run(tmp_path):
    sup, published = _finish_gang(tmp_path, "said")
    assert sup.state.load_gang().record.status == "completed"
    exits = {e.rank: e for e in published if isinstance(e, RankExited)}
    assert (exits[1].signal, exits[1].finished) == (signal.SIGABRT, True)
    assert (exits[0].exit_code, exits[0].finished) == (0, False)
    assert sup.dead_since_s is None


def test_the_same_abort_unannounced_is_a_dead_gang(tmp_path):
    sup, published = _finish_gang(tmp_path, "silent")
    assert sup.state.load_gang().record.status != "completed"
    assert sup.dead_since_s is not None, "waiting for a command"
    exits = {e.rank: e for e in published if isinstance(e, RankExited)}
    assert (exits[1].signal, exits[1].finished) == (signal.SIGABRT, False)


def test_an_exit_code_after_the_rank_finished_is_still_a_failure(tmp_path):
    sup, published = _finish_gang(tmp_path, "raised")
    assert sup.dead_since_s is not None
    exits = {e.rank: e for e in published if isinstance(e, RankExited)}
    assert (exits[1].exit_code, exits[1].finished) == (1, False)


def test_a_done_file_of_an_earlier_launch_is_not_taken_for_this_ones(tmp_path):
    # A relaunch of the run id over the same state directory: the old gang's word is gone.
    state = ControllerState(tmp_path / "state")
    stale = state.done_path(0, 1)
    stale.write_text('{"final_step": 20}\n')
    sup, _ = _finish_gang(tmp_path, "silent")
    assert not stale.exists()
    assert sup.dead_since_s is not None


@pytest.mark.parametrize(
    ("code", "finished", "abnormal"),
    [(0, False, False), (-6, False, True), (-6, True, False), (134, True, False)],
    ids=["clean", "abort", "abort-after-done", "shell-abort-after-done"],
)
def test_a_finished_rank_is_never_a_culprit(code, finished, abnormal):
    gone = RankExit(1, code, 0.0, finished)
    assert gone.abnormal is abnormal
    assert culprits([RankExit(0, 1, 0.1), gone]) == ((1,) if abnormal else (0,))
