"""Where a rank is, on request: its Python stacks written to a file when its agent asks.

The protocol between a rank and the agent that launched it (`controller.stacks` is the
other side):

1. The agent names a file per rank and incarnation in ``RUNWATCH_STACK_FILE``
   (`common.launch_env.LaunchEnv.stack_file`).
2. The rank installs `faulthandler` on ``SIGUSR1`` writing every thread's stack to that
   file (`install_stack_dump`; a `producers.RunEmitter` does it when it is created, so an
   instrumented script needs nothing more). faulthandler's handler is C code that runs at
   signal time: it answers while the main thread is stuck in a collective, in a C
   extension or holding the GIL elsewhere, which is exactly when a stack is wanted.
3. Having registered, the rank writes `installed_line` (its pid) to the file. Before it
   stops a hung or dead gang, the agent looks for a descendant of the rank's slot that
   catches ``SIGUSR1`` (``SigCgt`` in ``/proc/PID/status``) and whose line is in the
   file, sends it the signal, and reads what was appended. A process without that line is
   never signalled: the default action of ``SIGUSR1`` kills, and a program's own handler
   may do anything.

Stdlib only; a no-op where the variable is unset or the platform has no ``SIGUSR1``.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
from pathlib import Path
from typing import IO

from runwatch.producers.settings import EmitterEnv

STACK_SIGNAL_NAME = "SIGUSR1"
"""The signal an agent sends for a stack dump (the name: Windows has no such signal)."""

_lock = threading.Lock()


def installed_line(pid: int) -> str:
    """The line a process writes to its stack file once faulthandler answers SIGUSR1 there.

    The agent signals a process only when its line is in the file: a process that catches
    ``SIGUSR1`` for reasons of its own is never sent it.
    """
    return f"# runwatch: stacks of pid {pid} on {STACK_SIGNAL_NAME}\n"


_installed: tuple[Path, IO[str]] | None = None


def install_stack_dump(path: str | os.PathLike[str] | None = None) -> Path | None:
    """Dump every thread's stack to ``path`` whenever this process gets ``SIGUSR1``.

    Idempotent: the first call that names a file wins, later calls return it. A program
    that installed its own ``SIGUSR1`` handler keeps it (no stacks are taken then).

    Args:
        path: The file (appended to); None reads ``RUNWATCH_STACK_FILE``.

    Returns:
        The file stacks go to, or None when none is configured (or on Windows).
    """
    global _installed
    sig = getattr(signal, STACK_SIGNAL_NAME, None)
    with _lock:
        if _installed is not None:
            return _installed[0]
        target = path if path is not None else EmitterEnv.from_env().stack_file
        if not target or sig is None:
            return None
        if callable(signal.getsignal(sig)):  # the program handles SIGUSR1 itself: leave it
            return None
        file_path = Path(target)
        file_path.parent.mkdir(parents=True, exist_ok=True)
        handle = file_path.open("a", encoding="utf-8")  # open for the process's lifetime
        faulthandler.register(sig, file=handle, all_threads=True, chain=False)
        handle.write(installed_line(os.getpid()))
        handle.flush()
        _installed = (file_path, handle)
        return file_path


__all__ = ["STACK_SIGNAL_NAME", "install_stack_dump", "installed_line"]
