"""Issue 19's findings 3-5 and 9-12, each as an attacker would try them, on a real broker.

The attacker writes raw records with plain kafka-python (hand-written JSON, no runwatch
code) to topics that trainers write, or talks raw HTTP / raw socket frames to the edges.
Every test then shows the process it aimed at is still up and still does its work on a
good record sent after the bad ones.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from kafka import KafkaProducer

from runwatch import admin
from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import CommandRejected, Event, RestartCompleted, RestartRequested
from runwatch.schemas.signing import CommandKey, sign
from runwatch.schemas.topics import TopicNames, names
from tests.integration.processors.harness import COMMAND_KEY, Reader

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
WAIT_S = 90.0
WAITER = (
    "import pathlib, sys, time\nwhile not pathlib.Path(sys.argv[1]).exists(): time.sleep(0.05)\n"
)
"""A rank that runs until a file exists (no torch: the controller is what is under test)."""


@pytest.fixture
def prefix(kafka_bootstrap: str) -> str:
    """A fresh prefix with the whole catalogue on the session broker."""
    name = f"x{uuid.uuid4().hex[:10]}"
    admin.create_topics(kafka_bootstrap, admin.catalogue(name, 2))
    return name


@pytest.fixture
def topics(prefix: str) -> TopicNames:
    """The fresh prefix's topic names."""
    return names(prefix)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWATCH_")}
    env.update(RUNWATCH_COMMAND_KEY=COMMAND_KEY, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(REPO)
    return env


class Proc:
    """A `runwatch` subcommand as a subprocess in its own session, its output in a file."""

    def __init__(self, args: Sequence[str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runwatch.cli", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=_env(),
            cwd=REPO,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout_s: float = WAIT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout_s}s:\n{self.log()}") from None

    def kill(self) -> None:
        """SIGKILL this process only (a gang's ranks are in sessions of their own)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        self.kill()
        self._log.close()


@pytest.fixture
def procs() -> Iterator[Callable[[Sequence[str], Path], Proc]]:
    made: list[Proc] = []

    def start(args: Sequence[str], log_path: Path) -> Proc:
        made.append(Proc(args, log_path))
        return made[-1]

    yield start
    for proc in made:
        proc.close()


def _raw_producer(bootstrap: str) -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=bootstrap, acks="all")


def _wait_file(path: Path, proc: Proc, timeout_s: float = WAIT_S) -> None:
    """Wait for ``path`` to exist while ``proc`` runs (its state file: it is reading)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.alive(), proc.log()
        assert time.monotonic() < deadline, f"no {path}:\n{proc.log()}"
        time.sleep(0.05)  # a file has no event to await; polled with a deadline


def _of(run_id: str, kind: type[Event], command_id: str) -> Callable[[list[Event]], bool]:
    return lambda events: any(
        isinstance(e, kind) and e.run_id == run_id and e.command_id == command_id  # type: ignore[attr-defined]
        for e in events
    )


# ---------------------------------------------------------------- finding 3


def _forged_command(run_id: str, command_id: str, signature: str, key_id: str) -> bytes:
    """The attacker's command: hand-written JSON, a public key id, a non-ASCII signature."""
    return json.dumps(
        {
            "type": "restart_requested.v1",
            "run_id": run_id,
            "ts_ns": 1,
            "command_id": command_id,
            "action": "respawn",
            "cause_verdict_id": "v",
            "cause_kind": "loss_spike",
            "incarnation": 0,
            "signature": signature,
            "key_id": key_id,
        },
        ensure_ascii=False,
    ).encode()


def test_a_non_ascii_signature_neither_kills_the_launcher_nor_its_adoption(
    kafka_bootstrap: str, prefix: str, topics: TopicNames, procs, tmp_path: Path
) -> None:
    """Finding 3: forged commands with non-ASCII signatures are rejected with a reason.

    `runwatch launch` rejects one and stays up; SIGKILLed, its successor `runwatch
    controller` reads that one again and another, rejects both, and executes the valid
    signed command that follows.
    """
    run_id = "victim3"
    key = CommandKey.from_secret(COMMAND_KEY.encode())
    state_dir, go = tmp_path / "state", tmp_path / "go"
    launcher = procs(
        [
            "launch",
            *("--bootstrap", kafka_bootstrap, "--prefix", prefix),
            *("--nproc", "1", "--run-id", run_id, "--state-dir", str(state_dir)),
            *("--grace-s", "1", "--command-timeout", "60", "--"),
            *(sys.executable, "-c", WAITER, str(go)),
        ],
        tmp_path / "launch.log",
    )
    controller = Reader(kafka_bootstrap, topics.controller)
    producer = _raw_producer(kafka_bootstrap)
    try:
        _wait_file(state_dir / "gang.json", launcher)
        for cid, sig in (("forged-1", "é" * 64), ("forged-2", "Ω" * 64)):
            value = _forged_command(run_id, cid, sig, key.key_id)
            if cid == "forged-2":
                launcher.kill()  # the adoption must get past both
            producer.send(topics.commands, key=run_id.encode(), value=value).get(30)
            if cid == "forged-1":
                controller.wait_for(_of(run_id, CommandRejected, cid))
                assert launcher.alive(), launcher.log()
        successor = procs(["controller", "--state-dir", str(state_dir)], tmp_path / "ctl.log")
        controller.wait_for(_of(run_id, CommandRejected, "forged-2"))
        valid = sign(
            RestartRequested(
                run_id=run_id,
                ts_ns=2,
                command_id="genuine",
                action="respawn",
                cause_verdict_id="v",
                cause_kind="loss_spike",
            ),
            key,
        )
        producer.send(topics.commands, key=encode_key(run_id), value=encode(valid)).get(30)
        controller.wait_for(_of(run_id, RestartCompleted, "genuine"))
        go.touch()
        assert successor.wait() == 0, successor.log()
    finally:
        go.touch()
        producer.close()
        controller.close()
    reasons = [
        e.reason
        for e in controller.events
        if isinstance(e, CommandRejected) and e.command_id.startswith("forged")
    ]
    assert reasons and all("malformed signature" in r for r in reasons), reasons
    assert "Traceback" not in launcher.log() + successor.log()
