"""Launching a Kafka JVM: its command line, the spawned process, a tool run, termination.

Shared by the single broker (`runwatch.broker.lifecycle`) and, through it, every node of a
cluster (`runwatch.broker.cluster`); it knows nothing of either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from runwatch.broker.config import ASSEMBLY_DIR
from runwatch.broker.jars import last_meaningful_line, require_java
from runwatch.broker.pids import reap, wait_pid_exit
from runwatch.common.errors import RunwatchError

logger = logging.getLogger("runwatch.broker")  # the package's logger, as before the split


@dataclasses.dataclass(frozen=True)
class Launched:
    """A broker JVM just spawned, not yet answering.

    Attributes:
        proc: The JVM's process.
        port: Its client port.
        controller_port: Its KRaft controller port.
        auto: True when the client port was picked automatically.
        started: `time.monotonic()` at the spawn.
    """

    proc: subprocess.Popen[bytes]
    port: int
    controller_port: int
    auto: bool
    started: float


def java_command(
    libs: Path, main: str, *args: str, jvm_opts: Sequence[str], logs_dir: Path
) -> list[str]:
    """The command line running ``main`` from the jars in ``libs``.

    Args:
        libs: The jar directory (`runwatch.broker.jars.ensure_jars`).
        main: The main class.
        *args: Its arguments.
        jvm_opts: Options for the JVM (heap, GC).
        logs_dir: Kafka's ``kafka.logs.dir`` (where log4j2 writes ``server.log``).

    Raises:
        RunwatchError: no ``java`` on PATH.
    """
    cmd = [require_java(), *jvm_opts]
    log4j = ASSEMBLY_DIR / "log4j2.xml"
    if log4j.is_file():
        cmd.append(f"-Dlog4j2.configurationFile={log4j}")
    cmd += [f"-Dkafka.logs.dir={logs_dir}", "-cp", f"{libs}/*", main, *args]
    return cmd


def run_tool(cmd: Sequence[str], what: str, *, timeout_s: float = 120.0) -> None:
    """Run a short-lived Kafka tool (the storage format) and wait for it.

    Args:
        cmd: Its command line (`java_command`).
        what: What it does, for the error message ("formatting the broker's storage").
        timeout_s: Longest it may take.

    Raises:
        RunwatchError: it failed; the message carries its last meaningful line.
    """
    done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        line = last_meaningful_line(done.stdout + "\n" + done.stderr)
        raise RunwatchError(f"{what} failed: {line}")


def spawn(cmd: Sequence[str], *, out_file: Path, cwd: Path, banner: str) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in a session of its own, its output appended to ``out_file``.

    The process outlives the Python process that starts it.

    Args:
        cmd: The command line (`java_command`).
        out_file: Where its stdout and stderr go (appended), after ``banner``.
        cwd: Its working directory.
        banner: A line written to ``out_file`` first.
    """
    with out_file.open("ab") as out:
        out.write(f"--- runwatch: {banner}\n".encode())
        out.flush()
        return subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
        )


def terminate(pid: int, *, timeout_s: float, proc: subprocess.Popen[bytes] | None) -> None:
    """Stop ``pid``: SIGTERM, wait up to ``timeout_s``, SIGKILL as the last resort; reap it.

    Args:
        pid: The process.
        timeout_s: Longest to wait for a clean exit.
        proc: Its `subprocess.Popen` when this process started it (waited on), else None
            (reaped if it is a child anyway).
    """
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not wait_pid_exit(pid, timeout_s):
        logger.warning("broker pid %d ignored SIGTERM for %.0f s; killing it", pid, timeout_s)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_pid_exit(pid, 10.0)
    if proc is not None and proc.pid == pid:
        proc.wait(timeout=10.0)
    else:
        reap(pid)
