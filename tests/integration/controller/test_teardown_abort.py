"""A rank that dies, or stays stuck, in its teardown after it finished does not fail the run.

The transformers Trainer, accelerate and Lightning leave their process groups to be freed
at exit, and gloo's threads freed in the wrong order abort the process ("terminate called
without an active exception"): the suite saw it on rank 1 of a finished 2-rank Trainer
gang. Before the rank's word (`producers.rank_done`), its agent reported the run failed,
and an exit that reached the processors before rank 0's RunEnded paged ``dead_rank``.

Here rank 1 of a real gloo gang of `examples/train_ddp.py` under `runwatch launch`
finishes every step, says so, shuts its group down and aborts (``abort@0:rank=1``). The
launcher exits 0 with the run completed; the agent's RankExited says SIGABRT and
``finished``; the processors, once they folded that exit, raised nothing for the run and
no command names it. The contrast (the same abort without the rank's word) is the unit
tests' (`tests/unit/controller/test_exit_evidence_agent.py`,
`tests/unit/core/test_exit_evidence.py`, both orders of the exit and RunEnded).

A rank stuck in its teardown (``stuck@0:rank=1``: it said it finished, then does not exit,
as one whose NCCL destructor waits on a peer that left) is stopped by its agent under
``runwatch launch --teardown-timeout`` (`controller.teardown`), and the run completes; the
warnings without a timeout are the unit tests' (`tests/unit/controller/test_teardown.py`).
"""

from __future__ import annotations

import re
import signal
import time

import pytest

from runwatch.processors.fleet import latest_states
from runwatch.schemas.events import AnomalyDetected, RankExited, RestartRequested, RunEnded

from .conftest import WAIT_S, of_run, wait_events

pytestmark = [pytest.mark.integration, pytest.mark.torch]

RUN = "teardown-abort"
LIVENESS = ("dead_rank", "hang")


def _liveness_past(loop, offset: int) -> object:
    """The run's liveness state once the processors folded the heartbeats record at ``offset``."""
    deadline = time.monotonic() + WAIT_S
    while True:
        view = latest_states(loop.bootstrap, loop.app_id).get(RUN)
        state = view.liveness if view else None
        if state is not None and state.last_offset >= offset and not state.live:
            return state
        assert time.monotonic() < deadline, f"the exit at {offset} not folded: {state}"
        time.sleep(0.2)  # polling a changelog, not synchronising on time


def _read_to_end(reader) -> list:
    """Every event the topic holds now (the processors published the exit's outputs first)."""
    tps = list(reader.consumer.assignment())
    ends = reader.consumer.end_offsets(tps)
    return reader.wait_for(lambda _: all(reader.consumer.position(tp) >= ends[tp] for tp in tps))


def test_a_rank_aborting_in_its_teardown_after_it_finished_leaves_the_run_completed(loop, launch):
    heartbeats = loop.reader(loop.topics.heartbeats)
    run = launch(RUN, ["--steps", "8", "--inject", "abort@0:rank=1"])
    assert run.launcher.wait() == 0, run.launcher.log() + run.rank_logs()
    assert run.gang_record().status == "completed"
    assert "aborts in its teardown" in (run.state_dir / "logs" / "inc0.rank1.log").read_text()

    events = wait_events(heartbeats, of_run(RUN, RankExited), count=2)
    by_rank = {e.rank: e for e in events}
    assert (by_rank[1].signal, by_rank[1].finished) == (signal.SIGABRT, True)
    assert (by_rank[0].exit_code, by_rank[0].finished) == (0, False)
    ended = [e for e in heartbeats.events if of_run(RUN, RunEnded)(e)]
    assert [e.status for e in ended] == ["completed"], "the agent announced no failure"

    last_exit = max(
        raw.offset
        for raw, event in zip(heartbeats.raw, heartbeats.events, strict=True)
        if of_run(RUN, RankExited)(event)
    )
    liveness = _liveness_past(loop, last_exit)
    assert liveness.exit_rank == -1 and "dead_rank" not in liveness.anomaly_counts
    anomalies = _read_to_end(loop.reader(loop.topics.anomalies))
    commands = _read_to_end(loop.reader(loop.topics.commands))
    liveness_verdicts = [
        e for e in anomalies if of_run(RUN, AnomalyDetected)(e) and e.kind in LIVENESS
    ]
    assert not liveness_verdicts
    assert not [e for e in commands if of_run(RUN, RestartRequested)(e)]


def test_a_rank_stuck_in_its_teardown_is_stopped_and_the_run_completes(loop, launch):
    # Rank 1 finishes, says so, shuts its group down and then does not exit (as an NCCL
    # destructor waiting on a peer that left): without --teardown-timeout its launcher never
    # returned. With it, the agent stops the rank and the run completes.
    run_id = "teardown-stuck"
    heartbeats = loop.reader(loop.topics.heartbeats)
    run = launch(
        run_id,
        ["--steps", "8", "--inject", "stuck@0:rank=1:secs=600"],
        extra=["--teardown-timeout", "3"],
    )
    assert run.launcher.wait() == 0, run.launcher.log() + run.rank_logs()
    assert run.gang_record().status == "completed"
    assert "stuck 600s in its teardown" in (run.state_dir / "logs" / "inc0.rank1.log").read_text()
    log = run.launcher.log()
    stop = re.search(r"stopping ranks \[([0-9, ]+)\], still running", log)
    assert stop is not None and "--teardown-timeout 3" in log, log
    # Rank 0 exits once its producer has flushed RunEnded: on a busy box that took longer
    # than the 3 s timeout once, and a rank still running then is stopped with rank 1 (both
    # said they finished). Either way rank 1 is stopped and the run completes.
    stopped = {int(rank) for rank in stop.group(1).split(",")}
    assert stopped in ({1}, {0, 1}), log
    events = wait_events(heartbeats, of_run(run_id, RankExited), count=2)
    by_rank = {e.rank: e for e in events}
    # SIGTERM only sets the script's stop flag (train_ddp.StopFlag), so the grace ends
    # in SIGKILL: a signal after the rank's word all the same, so finished.
    assert (by_rank[1].signal, by_rank[1].finished) == (signal.SIGKILL, True)
    rank0 = by_rank[0]
    if stopped == {1}:
        assert rank0.exit_code == 0
    else:  # it may still have exited by itself within the grace
        assert rank0.exit_code == 0 or (rank0.signal is not None and rank0.finished)
