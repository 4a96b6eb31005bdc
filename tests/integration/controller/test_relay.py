"""`runwatch launch --relay`: the ranks hand their events to the agent, no Kafka client in them.

A gang of 2 gloo ranks of `examples/train_ddp.py` under the relay, with the package's real
processors worker: the run completes, its heartbeats arrive as pack.v1 records, the
processors applied every heartbeat and step exactly once, the audit reproduces every
verdict, and neither rank ever imported kafka-python.
"""

from __future__ import annotations

import json
import time

import pytest

from runwatch.processors.fleet import latest_states
from runwatch.schemas.codec import decode
from runwatch.schemas.events import EventPack, Heartbeat, RunEnded, RunStarted
from tests.integration.producers.conftest import consume_records

from .conftest import WAIT_S, audit_cli

pytestmark = [pytest.mark.integration, pytest.mark.torch]

STEPS = 12


def _counts(loop, run_id: str, heartbeats: int, steps: int):
    """The processors' liveness and step states once they applied what the run sent."""
    deadline = time.monotonic() + WAIT_S
    while True:
        view = latest_states(loop.bootstrap, loop.app_id).get(run_id)
        live, step = (view.liveness, view.steps) if view else (None, None)
        if live and step and live.heartbeats >= heartbeats and step.steps_observed >= steps:
            return live, step
        assert time.monotonic() < deadline, (
            f"processors never caught up on {run_id}: heartbeats "
            f"{live.heartbeats if live else None}/{heartbeats}, steps "
            f"{step.steps_observed if step else None}/{steps}, liveness {live}"
        )
        time.sleep(0.2)  # polling a changelog, not synchronising on time


def test_a_relayed_gang_runs_without_kafka_clients_and_is_counted_exactly(loop, launch):
    run = launch("relayed", ["--steps", str(STEPS)], extra=["--relay"])
    assert run.launcher.wait() == 0, run.launcher.log() + run.rank_logs()
    assert (run.gang().spec.run.relay_socket or "").endswith(".sock")

    # No training process ran a Kafka client.
    for rank in (0, 1):
        process = json.loads((run.trace_dir / f"process.rank{rank}.json").read_text())
        assert process == {"kafka_loaded": False}, rank

    # What the ranks emitted, from their traces.
    sent = {"heartbeat": 0, "step": 0}
    for rank in (0, 1):
        for line in (run.trace_dir / f"events.rank{rank}.jsonl").read_text().splitlines():
            call = json.loads(line)["call"]
            if call in sent:
                sent[call] += 1
    assert sent["heartbeat"] >= 2 * STEPS and sent["step"] == STEPS

    # The heartbeats topic holds the run's heartbeats, packed.
    records = consume_records(loop.bootstrap, [loop.topics.heartbeats], 10**9, timeout_s=10)
    events = [decode(r.value) for r in records if r.key == b"relayed"]
    packs = [e for e in events if isinstance(e, EventPack)]
    assert packs, [type(e).__name__ for e in events]
    flat = [x for e in events for x in (e.events if isinstance(e, EventPack) else (e,))]
    beats = [b for b in flat if isinstance(b, Heartbeat)]
    assert len(beats) == sent["heartbeat"]
    for rank in (0, 1):
        seqs = [b.seq for b in beats if b.rank == rank]
        assert seqs == sorted(seqs)  # each rank's order survived the relay
    # Rank 1's heartbeats may reach the log before rank 0's RunStarted or after its
    # RunEnded (separate processes; direct emitters race the same way): the processors
    # apply the ones in between, the incarnation's window.
    window, rank0_inside, inside = 0, 0, False
    for event in flat:
        if isinstance(event, RunStarted | RunEnded):
            inside = isinstance(event, RunStarted)
        elif isinstance(event, Heartbeat) and inside:
            window += 1
            rank0_inside += event.rank == 0
    # Rank 0's own heartbeats sit between its own markers: one connection keeps its order.
    assert rank0_inside == sum(1 for b in beats if b.rank == 0) >= STEPS

    # The processors applied every heartbeat of the window and every step, once each.
    live, steps = _counts(loop, "relayed", window, sent["step"])
    assert live.heartbeats == window
    assert steps.steps_observed == sent["step"]
    assert live.anomaly_counts == {} and steps.anomaly_counts == {}

    audit = audit_cli(loop, "relayed")
    assert audit.returncode == 0, (audit.stdout, audit.stderr)
    assert "every verdict reproduced" in audit.stdout, audit.stdout


def test_a_killed_relayed_rank_is_named_by_its_exit(loop, launch):
    from runwatch.schemas.events import AnomalyDetected, RestartCompleted

    from .conftest import of_run, wait_events

    anomalies = loop.reader(loop.topics.anomalies)
    controller = loop.reader(loop.topics.controller)
    args = ["--steps", "25", "--seed", "2", "--inject", "kill@14:rank=1"]
    run = launch("relay-kill", args, extra=["--relay"])
    assert run.launcher.wait() == 0, run.launcher.log() + run.rank_logs()
    found = wait_events(anomalies, of_run("relay-kill", AnomalyDetected))
    dead_ranks = [a for a in found if a.kind == "dead_rank"]
    assert len(dead_ranks) == 1, [(a.kind, a.rank, a.incarnation, a.detail) for a in found]
    (dead,) = dead_ranks
    assert (dead.kind, dead.incarnation, dead.rank) == ("dead_rank", 0, 1)
    assert "exited (signal 9 (SIGKILL)" in dead.detail
    (done,) = wait_events(controller, of_run("relay-kill"))
    assert isinstance(done, RestartCompleted)
    assert run.gang_record().status == "completed"
