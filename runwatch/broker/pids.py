"""The broker's JVM as an OS process: is a pid a live broker, waiting for it, reaping it."""

from __future__ import annotations

import contextlib
import os
import select
import time
from pathlib import Path

from runwatch.broker.config import MAIN_CLASS


def _proc_state(pid: int) -> str | None:
    """The state letter from /proc/<pid>/stat (R, S, Z, ...), None when unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]


def is_broker_process(pid: int) -> bool:
    """True if ``pid`` is alive (not a zombie) and, where /proc tells, runs ``kafka.Kafka``."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if _proc_state(pid) == "Z":
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True  # no /proc (macOS): trust the pid
    return MAIN_CLASS.encode() in cmdline


def reap(pid: int) -> None:
    """Collect ``pid``'s exit status if it is our child, so it leaves no zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def wait_pid_exit(pid: int, timeout_s: float) -> bool:
    """Wait until ``pid`` exits (an event on Linux via pidfd); True if it did in time."""
    if not is_broker_process(pid):
        return True
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is not None:
        try:
            fd = pidfd_open(pid)
        except ProcessLookupError:
            return True
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                return bool(poller.poll(max(0.0, timeout_s) * 1000))
            finally:
                os.close(fd)
    deadline = time.monotonic() + timeout_s  # no pidfd: poll the pid
    while time.monotonic() < deadline:
        if not is_broker_process(pid):
            return True
        time.sleep(0.1)
    return not is_broker_process(pid)
