"""Zero-code monitoring: an unmodified script that only prints nanoGPT lines, under
`runwatch launch --log-format nanogpt`, with a real `runwatch processors` worker.

The script has no runwatch code. The launcher turns rank 0's lines into steps, sends
RunStarted and its live ranks' heartbeats; the processors flag the loss spike the script
prints; rank 1 SIGKILLs itself, its heartbeats stop, the processors flag it and command a
respawn, the launcher respawns the gang (marking the first step with restart_from_step) and
the second incarnation runs to a clean end.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from runwatch.schemas.events import (
    AnomalyDetected,
    Event,
    Heartbeat,
    RestartCompleted,
    RestartRequested,
    RunEnded,
    RunStarted,
    StepCompleted,
)
from runwatch.schemas.topics import names
from tests.integration.processors.harness import Reader

from .conftest import REPO, Proc, of_run, rank_env, wait_events

pytestmark = [pytest.mark.integration]

SCRIPT = REPO / "tests" / "integration" / "controller" / "print_nanogpt.py"
RUN = "printed"
STEPS, SPIKE_AT, DIE_AT = 60, 15, 20
LINE = re.compile(r"^iter (\d+): loss (\S+), time")


def _printed(log: Path) -> list[tuple[int, float]]:
    return [
        (int(m[1]), float(m[2]))
        for m in (LINE.match(line) for line in log.read_text().splitlines())
        if m
    ]


def _incarnations(events: list[Event]) -> dict[int, list[Event]]:
    """A run's events on one topic, split at each RunStarted (in log order)."""
    out: dict[int, list[Event]] = {}
    current = None
    for e in events:
        if isinstance(e, RunStarted):
            current = e.incarnation
            out[current] = []
        elif current is not None:
            out[current].append(e)
    return out


def test_a_script_that_only_prints_is_watched_and_respawned(loop, tmp_path):
    state_dir = tmp_path / "state"
    args = [
        "launch",
        *("--bootstrap", loop.bootstrap, "--prefix", loop.prefix),
        *("--nproc", "2", "--run-id", RUN, "--state-dir", str(state_dir)),
        *("--grace-s", "5", "--command-timeout", "60"),
        *("--log-format", "nanogpt", "--tokens-per-step", "4096"),
        "--",
        sys.executable,
        str(SCRIPT),
        *("--steps", str(STEPS), "--spike-at", str(SPIKE_AT), "--die-at", str(DIE_AT)),
    ]
    anomalies = loop.reader(loop.topics.anomalies)
    launcher = Proc(args, tmp_path / "launcher.log", rank_env())
    try:
        (command,) = wait_events(loop.reader(loop.topics.commands), of_run(RUN, RestartRequested))
        assert command.action == "respawn" and command.incarnation == 0
        (done,) = wait_events(loop.reader(loop.topics.controller), of_run(RUN, RestartCompleted))
        assert done.command_id == command.command_id and done.checkpoint_step is None
        assert launcher.wait() == 0, launcher.log()
    finally:
        launcher.close()
    logs = state_dir / "logs"
    assert "events from rank 0's nanogpt log lines" in launcher.log()

    # The spike the script printed is flagged (an alert, not a restart), and so is rank 1.
    flagged = wait_events(anomalies, of_run(RUN, AnomalyDetected), count=2)
    kinds = {(a.kind, a.incarnation) for a in flagged}
    assert ("loss_spike", 0) in kinds
    (spike,) = [a for a in flagged if a.kind == "loss_spike" and a.incarnation == 0]
    assert spike.step == SPIKE_AT
    liveness = [a for a in flagged if a.kind in ("dead_rank", "hang") and a.incarnation == 0]
    assert any(a.rank == 1 for a in liveness) or any(a.kind == "hang" for a in liveness)
    assert command.cause_verdict_id in {a.verdict_id for a in liveness}

    # RunStarted from the launcher per incarnation; the controller ends the first, the
    # launcher reports the clean end of the second.
    runs = [
        e
        for e in loop.reader(loop.topics.runs).wait_for(
            lambda ev: any(of_run(RUN, RunEnded)(e) and e.status == "completed" for e in ev)
        )
        if e.run_id == RUN
    ]
    assert [
        (type(e).__name__, getattr(e, "status", getattr(e, "incarnation", None))) for e in runs
    ] == [
        ("RunStarted", 0),
        ("RunEnded", "stopped"),
        ("RunStarted", 1),
        ("RunEnded", "completed"),
    ]
    assert all(e.world_size == 2 and e.tags["log_format"] == "nanogpt" for e in runs[::2])
    assert runs[-1].final_step == STEPS

    # Steps: exactly what rank 0 printed, in order; the respawn's first step is marked.
    steps_topic = [
        e
        for e in loop.reader(loop.topics.steps).wait_for(
            lambda ev: any(of_run(RUN, RunEnded)(e) and e.status == "completed" for e in ev)
        )
        if e.run_id == RUN
    ]
    by_inc = _incarnations(steps_topic)
    first = [e for e in by_inc[0] if isinstance(e, StepCompleted)]
    second = [e for e in by_inc[1] if isinstance(e, StepCompleted)]
    printed0 = _printed(logs / "inc0.rank0.log")
    assert [(s.step, s.loss) for s in first] == printed0[: len(first)]
    assert len(first) > SPIKE_AT and first[SPIKE_AT - 1].loss > 3 * first[SPIKE_AT - 2].loss
    assert [(s.step, s.loss) for s in second] == _printed(logs / "inc1.rank0.log")
    assert [s.step for s in second] == list(range(1, STEPS + 1))
    assert second[0].restart_from_step == 0 and all(s.restart_from_step is None for s in second[1:])
    assert all(s.tokens == 4096 and s.step_time_s > 0 for s in first + second)

    # Heartbeats: the launcher's view of its processes. Rank 1 stops at its death; both
    # ranks of the respawned gang heartbeat together at every step while they live.
    beats = _incarnations(
        [
            e
            for e in loop.reader(loop.topics.heartbeats).wait_for(
                lambda ev: any(of_run(RUN, RunEnded)(e) and e.status == "completed" for e in ev)
            )
            if e.run_id == RUN
        ]
    )
    hb0 = [e for e in beats[0] if isinstance(e, Heartbeat)]
    hb1 = [e for e in beats[1] if isinstance(e, Heartbeat)]
    last0 = {r: max(b.step for b in hb0 if b.rank == r) for r in (0, 1)}
    assert last0[1] < last0[0], last0  # rank 1 went silent while rank 0 printed on
    # A line read after a rank exited (the last poll's) gets no heartbeat from that rank.
    per_rank = [[b.step for b in hb1 if b.rank == r] for r in (0, 1)]
    assert per_rank[1], "no heartbeat in the second incarnation"
    for steps in per_rank:
        assert steps == list(range(1, len(steps) + 1))
    assert all(b.pid > 0 for b in hb0 + hb1)
    record = (state_dir / "gang.json").read_text()
    assert '"incarnation": 1' in record and '"status": "completed"' in record


def test_an_adopting_controller_goes_on_reading_the_log(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path
):
    """The launcher dies mid-run; `runwatch controller` adopts the gang and keeps speaking
    for the script: no second RunStarted, steps from where it took over, the clean end.
    (No processors here: the silence while nobody watched must not cost a respawn.)"""
    make_topics(topic_prefix)
    topics = names(topic_prefix)
    run_id, state_dir = "adopted-printer", tmp_path / "state"
    args = [
        "launch",
        *("--bootstrap", kafka_bootstrap, "--prefix", topic_prefix),
        *("--nproc", "1", "--run-id", run_id, "--state-dir", str(state_dir)),
        *("--log-format", "nanogpt"),
        "--",
        sys.executable,
        str(SCRIPT),
        *("--steps", str(STEPS), "--step-delay-s", "0.1"),
    ]
    steps = Reader(kafka_bootstrap, topics.steps)
    launcher = Proc(args, tmp_path / "launcher.log", rank_env())
    try:
        wait_events(steps, of_run(run_id, StepCompleted), count=5)
        launcher.kill()
    finally:
        launcher.close()
    successor = Proc(
        ["controller", "--state-dir", str(state_dir)], tmp_path / "controller.log", rank_env()
    )
    try:
        assert successor.wait() == 0, successor.log()
    finally:
        successor.close()
    events = [
        e
        for e in steps.wait_for(lambda ev: any(of_run(run_id, RunEnded)(e) for e in ev))
        if e.run_id == run_id
    ]
    assert sum(isinstance(e, RunStarted) for e in events) == 1
    assert isinstance(events[-1], RunEnded) and events[-1].status == "completed"
    assert events[-1].final_step == STEPS
    numbers = [e.step for e in events if isinstance(e, StepCompleted)]
    assert numbers == sorted(set(numbers)) and numbers[-1] == STEPS
    printed = dict(_printed(state_dir / "logs" / "inc0.rank0.log"))
    assert all(printed[e.step] == e.loss for e in events if isinstance(e, StepCompleted))
