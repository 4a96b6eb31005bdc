"""Whole runs under least privilege: every component with its own role's credential.

The secure session broker checks ACLs; each process logs in as its role and gets only the
roles' grants for this test's prefix:

* a real ``runwatch processors`` worker as ``processors``;
* a scripted gang's `RunEmitter`s as ``trainer``;
* the policy's signed command read, and controller-side events written, as
  ``controller`` (through the controller's own Kafka code: `EventPublisher`,
  `commands_end_offsets`, `PeerWatch`);
* ``runwatch audit`` as ``sinks``;
* and a real ``runwatch launch --log-format`` gang as ``controller``, respawned by the
  processors' command.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from runwatch.producers import RunEmitter
from runwatch.schemas.events import (
    AnomalyDetected,
    CommandRejected,
    RankExited,
    RestartCompleted,
    RestartRequested,
    RunEnded,
)
from runwatch.schemas.signing import CommandKey, verify
from runwatch.schemas.topics import names
from tests.integration.processors.harness import COMMAND_KEY, workers

from .conftest import SecureKafka, SecureReader

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
SETS = ("hang_timeout_s=3", "dead_rank_timeout_s=3")
NAN_AT = 25


def _loss(step: int) -> float:
    return 4.0 - 0.01 * step + 0.02 * math.sin(step)


def _gang(kafka: SecureKafka, prefix: str, run: str) -> list[RunEmitter]:
    return [
        RunEmitter(
            run,
            bootstrap=kafka.bootstrap,
            topic_prefix=prefix,
            rank=rank,
            world_size=2,
            incarnation=0,
            client_config=kafka.config("trainer"),
        )
        for rank in range(2)
    ]


def _train(gang: list[RunEmitter]) -> None:
    """Steps 1..NAN_AT, a NaN loss at NAN_AT, a checkpoint every 10 steps."""
    gang[0].run_started(vocab_size=256, peak_flops_per_s=1e12)
    for step in range(1, NAN_AT + 1):
        loss = float("nan") if step == NAN_AT else _loss(step)
        gang[0].step(step, loss=loss, step_time_s=0.05, grad_norm=1.0, tokens=4096)
        for emitter in gang:
            emitter.heartbeat(step, step_time_s=0.05)
        if step % 10 == 0:
            gang[0].checkpoint_committed(step, f"/ckpt/step_{step}")
        for emitter in gang:
            assert emitter.flush(30.0), "a trainer's events were not delivered"


def _as(kafka: SecureKafka, user: str) -> dict[str, str]:
    """The environment of a process that logs in as ``user`` (no other RUNWATCH_* setting)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWATCH_")}
    return {**env, **kafka.environ(user), "PYTHONUNBUFFERED": "1"}


def test_a_run_is_judged_commanded_and_audited_with_a_credential_per_role(
    secure_kafka: SecureKafka,
    secure_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prefix, run = secure_prefix, "run-acl"
    scope = secure_kafka.grant(prefix, f"{prefix}-app")
    topics = names(prefix)
    with workers(secure_kafka.bootstrap, prefix, tmp_path, partitions=2, sets=SETS) as start:
        worker = start(env=_as(secure_kafka, "processors"))
        gang = _gang(secure_kafka, prefix, run)
        try:
            _train(gang)
        finally:
            for emitter in gang:
                emitter.close(30.0)
        command = _the_command(secure_kafka, topics.commands, run)
        key = CommandKey.from_secret(COMMAND_KEY.encode())
        verify(command, {key.key_id: key})  # signed by the processors, as the controller checks
        _as_the_controller(secure_kafka, prefix, command, monkeypatch)
        audit = _audit(secure_kafka, prefix, scope.app_id, run)
        assert "no ACLs" not in worker.log_tail(200)  # it found the authorizer
        views = _states_as_the_sinks(secure_kafka, scope.app_id, run, monkeypatch)
    steps = views[run].steps
    assert steps is not None and steps.steps_observed == NAN_AT, views[run]
    assert views[run].policy is not None and views[run].policy.commands == 1
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "verdict: every verdict reproduced" in audit.stdout, audit.stdout


def _the_command(kafka: SecureKafka, topic: str, run: str) -> RestartRequested:
    """The run's one command, read with the controller's credential."""
    commands = SecureReader(kafka, "controller", topic)
    try:
        events = commands.wait_for(lambda ev: any(e.run_id == run for e in ev))
    finally:
        commands.close()
    (command,) = [e for e in events if e.run_id == run]
    assert isinstance(command, RestartRequested)
    assert (command.action, command.cause_kind, command.max_checkpoint_step) == (
        "rollback",
        "nonfinite_loss",
        NAN_AT - 1,
    )
    return command


def _as_the_controller(
    kafka: SecureKafka, prefix: str, command: RestartRequested, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller's own Kafka code, as the controller: launch offsets, the peers' view
    (runs, controller topic, the verdict a command names), and its events."""
    from runwatch.controller.loop import EventPublisher, PeerWatch, commands_end_offsets

    for name, value in kafka.environ("controller").items():
        monkeypatch.setenv(name, value)
    assert sum(commands_end_offsets(kafka.bootstrap, prefix).values()) >= 1
    peers = PeerWatch(kafka.bootstrap, prefix, [command.run_id], check_ready=lambda ready: "")
    try:
        cause = peers.cause(command, timeout_s=30.0)
    finally:
        peers.close()
    assert isinstance(cause, AnomalyDetected) and cause.kind == "nonfinite_loss"
    publisher = EventPublisher(kafka.bootstrap, prefix, {})
    now_ns = time.time_ns()
    try:
        publisher.publish(RankExited(run_id=command.run_id, ts_ns=now_ns, rank=1, exit_code=-9))
        publisher.publish(
            CommandRejected(
                run_id=command.run_id, ts_ns=now_ns, command_id=command.command_id, reason="t"
            )
        )
    finally:
        publisher.close()


def _states_as_the_sinks(
    kafka: SecureKafka, app_id: str, run: str, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """The processors' states from their changelogs, as the web view and ``runwatch status``
    read them: with the sinks' read-only credential (Read on the ``<app id>-`` topics)."""
    from runwatch.processors.fleet import latest_states

    for name, value in kafka.environ("sinks").items():
        monkeypatch.setenv(name, value)
    deadline = time.monotonic() + 90.0
    while True:  # the states flush a moment after the verdicts: wait for the run's
        views = latest_states(kafka.bootstrap, app_id)
        if (run in views and views[run].policy is not None) or time.monotonic() > deadline:
            return views


def _audit(
    kafka: SecureKafka, prefix: str, app_id: str, run: str
) -> subprocess.CompletedProcess[str]:
    """``runwatch audit`` as the sinks' read-only credential: it reads the log and the
    processors' progress (their group's offsets)."""
    return subprocess.run(
        [sys.executable, "-m", "runwatch.cli", "audit", "--bootstrap", kafka.bootstrap]
        + ["--prefix", prefix, "--app-id", app_id, "--run", run, "--wait", "90"]
        + [arg for pair in SETS for arg in ("--set", pair)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_as(kafka, "sinks"),
        cwd=REPO,
    )


def test_a_launched_gang_is_respawned_with_a_controller_credential(
    secure_kafka: SecureKafka, secure_prefix: str, tmp_path: Path
) -> None:
    """``runwatch launch`` as the controller: the launcher sends the run's events from its
    rank 0's lines, its exit evidence and RunEnded, reads the signed command, respawns."""
    prefix, run = secure_prefix, "launched"
    secure_kafka.grant(prefix, f"{prefix}-app")
    topics = names(prefix)
    script = REPO / "tests" / "integration" / "controller" / "print_nanogpt.py"
    # The controller's login carries the trainer's, for its ranks (`broker env controller`).
    env = {**_as(secure_kafka, "controller"), "RUNWATCH_COMMAND_KEY": COMMAND_KEY}
    assert env["RUNWATCH_TRAINER_SASL_USERNAME"] == "trainer"
    args = [sys.executable, "-m", "runwatch.cli", "launch"]
    args += ["--bootstrap", secure_kafka.bootstrap, "--prefix", prefix, "--nproc", "2"]
    args += ["--run-id", run, "--state-dir", str(tmp_path / "state"), "--grace-s", "5"]
    args += ["--command-timeout", "60", "--log-format", "nanogpt", "--tokens-per-step", "4096"]
    args += ["--", sys.executable, str(script), "--steps", "30", "--die-at", "10"]
    with workers(secure_kafka.bootstrap, prefix, tmp_path, partitions=2, sets=SETS) as start:
        start(env=_as(secure_kafka, "processors"))
        log = tmp_path / "launcher.log"
        with log.open("wb") as out:
            launcher = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO
            )
        try:
            assert launcher.wait(timeout=240) == 0, log.read_text()
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
    done = SecureReader(secure_kafka, "sinks", topics.controller)
    completed = [
        e
        for e in done.wait_for(lambda ev: any(isinstance(e, RestartCompleted) for e in ev))
        if isinstance(e, RestartCompleted) and e.run_id == run
    ]
    done.close()
    assert len(completed) == 1 and completed[0].checkpoint_step is None
    runs = SecureReader(secure_kafka, "sinks", topics.runs)
    ended = runs.wait_for(
        lambda ev: any(isinstance(e, RunEnded) and e.status == "completed" for e in ev)
    )
    runs.close()
    assert [e.status for e in ended if isinstance(e, RunEnded) and e.run_id == run] == [
        "stopped",
        "completed",
    ]
    said = log.read_text()
    assert "no ACLs" not in said and "launcher's own credential" not in said
