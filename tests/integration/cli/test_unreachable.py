"""Every command that talks to Kafka says "cannot reach Kafka" in one line and exits 4.

No broker is needed: the addresses are a closed port, a listener that hangs up, and one
that never answers. Each is a real socket; the commands are the real CLI in a subprocess.
"""

from __future__ import annotations

import argparse
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from runwatch.cli import build_parser
from runwatch.controller.state import ControllerState, GangFile, LaunchSpec
from runwatch.controller.topology import RunBinding
from tests.integration.cli.cli import env_without_broker, runwatch

DEAD = "127.0.0.1:1"


def _kafka_commands() -> list[tuple[str, ...]]:
    """Every (sub)command whose parser has --bootstrap, e.g. ("topics", "list")."""
    found: list[tuple[str, ...]] = []

    def walk(path: tuple[str, ...], parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if "--bootstrap" in action.option_strings:
                found.append(path)
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk((*path, name), child)

    walk((), build_parser())
    return found


KAFKA_COMMANDS = _kafka_commands()


def _gang_dir(tmp_path: Path, bootstrap: str) -> Path:
    """A state directory recording a running gang (no ranks) of a broker at ``bootstrap``."""
    root = tmp_path / "controller" / "r"
    root.mkdir(parents=True)
    spec = LaunchSpec(
        run=RunBinding(run_id="r", bootstrap=bootstrap, prefix="runwatch"), argv=("true",)
    )
    ControllerState(root).save_gang(GangFile(spec=spec, record=spec.first_record()))
    return root


def _extra(command: tuple[str, ...], tmp_path: Path) -> list[str]:
    """Arguments a command needs besides --bootstrap to get as far as Kafka."""
    log = tmp_path / "train.log"
    log.write_text("step: 1, loss: 3.0, dt: 0.25\n")
    return {
        ("tail-log",): [str(log), "--run-id", "r"],
        ("audit",): ["--run", "r"],
        ("replay",): ["--run", "r"],
        ("sinks",): ["--alerts", "--state-dir", str(tmp_path / "sinks")],
        ("launch",): ["--nproc", "1", "--", "true"],
        ("controller",): ["--state-dir", str(_gang_dir(tmp_path, "127.0.0.1:9"))],
    }.get(command, [])


def _assert_one_line(result: object, command: str, bootstrap: str) -> str:
    import subprocess

    assert isinstance(result, subprocess.CompletedProcess)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"runwatch {command}: cannot reach Kafka at {bootstrap} ("), lines
    assert "`runwatch broker start`" in lines[0] and "RUNWATCH_BOOTSTRAP" in lines[0]
    assert result.returncode == 4, result
    return lines[0]


def test_every_kafka_command_is_covered() -> None:
    names = {c[0] for c in KAFKA_COMMANDS}
    assert {"status", "audit", "replay", "sinks", "topics", "processors", "tail-log"} <= names
    assert {"launch", "controller", "demo"} <= names


@pytest.mark.parametrize("command", KAFKA_COMMANDS, ids=" ".join)
def test_unreachable_broker_is_one_line(command: tuple[str, ...], tmp_path: Path) -> None:
    extra = _extra(command, tmp_path)
    split = extra.index("--") if "--" in extra else len(extra)  # launch: options before --
    argv = [*command, *extra[:split], "--bootstrap", DEAD, *extra[split:]]
    result = runwatch(*argv, env=env_without_broker(tmp_path))
    line = _assert_one_line(result, command[0], DEAD)
    assert "(connection refused)" in line


def test_unreachable_broker_from_the_environment(tmp_path: Path) -> None:
    result = runwatch("status", env=env_without_broker(tmp_path, RUNWATCH_BOOTSTRAP=DEAD))
    _assert_one_line(result, "status", DEAD)


def test_controller_checks_the_broker_of_its_records(tmp_path: Path) -> None:
    state = _gang_dir(tmp_path, DEAD)
    result = runwatch("controller", "--state-dir", str(state), env=env_without_broker(tmp_path))
    _assert_one_line(result, "controller", DEAD)


@contextmanager
def _listener(answer: bool) -> Iterator[str]:
    """A TCP listener that hangs up on every connection, or keeps it open and says nothing."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            if answer:
                conn.close()
            else:
                held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        server.close()
        for conn in held:
            conn.close()
        thread.join(timeout=10)


def test_a_listener_that_is_no_broker(tmp_path: Path) -> None:
    with _listener(answer=True) as address:
        result = runwatch("status", "--bootstrap", address, env=env_without_broker(tmp_path))
    line = _assert_one_line(result, "status", address)
    assert "does not answer as a Kafka broker" in line


def test_a_listener_that_never_answers_is_given_up_on(tmp_path: Path) -> None:
    env = env_without_broker(tmp_path, RUNWATCH_CONNECT_TIMEOUT_S="1")
    with _listener(answer=False) as address:
        result = runwatch("audit", "--run", "r", "--bootstrap", address, env=env)
    line = _assert_one_line(result, "audit", address)
    assert "sent no answer in 1 s" in line


def test_a_bad_argument_still_comes_first(tmp_path: Path) -> None:
    result = runwatch(
        "sinks",
        "--alerts",
        "--group-wait-s",
        "-1",
        "--bootstrap",
        DEAD,
        env=env_without_broker(tmp_path),
    )
    assert result.returncode == 2 and "--group-wait-s" in result.stderr


def test_audit_from_an_archive_needs_no_broker(tmp_path: Path) -> None:
    (tmp_path / "archive").mkdir()
    env = env_without_broker(tmp_path, RUNWATCH_BOOTSTRAP=DEAD)
    result = runwatch("audit", "--run", "r", "--from-archive", str(tmp_path / "archive"), env=env)
    assert "cannot reach Kafka" not in result.stderr and "Traceback" not in result.stderr
    assert "no events for run 'r'" in result.stderr
