"""Hang diagnostics: each live rank's Python stacks, taken before its gang is stopped.

The agent's side of the protocol in `producers.stackdump`: a rank started by the agent
dumps every thread's stack to its ``RUNWATCH_STACK_FILE`` on ``SIGUSR1``. Here:

* `python_process` finds the process to ask: the rank slot's pid is the shell wrapper of
  `controller.gang`, the training process is a descendant that *catches* ``SIGUSR1``
  (``SigCgt``), and it is asked only if it wrote its `producers.stackdump.installed_line`
  to its stack file (the default action of ``SIGUSR1`` is to terminate, and a program's
  own handler may do anything).
* `capture` signals every such process at once, waits (with a deadline) until each file
  stops growing, and returns what each appended.
* `where` reads faulthandler's text and names the innermost frame of the main thread:
  the line a hung rank is stuck on.

The summary goes into `schemas.events.RestartCompleted.stacks`; the full text stays in
the rank's stack file in the controller's state directory
(`controller.state.ControllerState.stack_path`).
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from runwatch.producers.stackdump import STACK_SIGNAL_NAME, installed_line

_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")


@dataclass(frozen=True)
class TakenStack:
    """What one rank answered.

    Attributes:
        rank: The rank.
        pid: The process asked (None: none could be asked).
        text: The stacks it wrote (empty if none).
        where: Its main thread's innermost frame, ``function (file:line)``.
        note: Why there is no stack, or empty.
    """

    rank: int
    pid: int | None
    text: str
    where: str
    note: str = ""


def where(text: str) -> str:
    """The innermost frame of the main thread in a faulthandler dump, or "".

    faulthandler lists threads newest first, so the main thread (the oldest) is the last
    block; each block lists frames innermost first.

    Args:
        text: One dump, as `faulthandler.dump_traceback(all_threads=True)` writes it.

    Returns:
        ``function (file:line)`` with the file's last two path parts, or "" if the text
        holds no frame.
    """
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if _THREAD.match(line) or (line.startswith("Stack (most recent") and not blocks):
            blocks.append([])
        elif (frame := _FRAME.match(line)) and blocks:
            short = "/".join(Path(frame["file"]).parts[-2:])
            blocks[-1].append(f"{frame['func']} ({short}:{frame['line']})")
    for block in reversed(blocks):
        if block:
            return block[0]
    return ""


def _mask_has(status: str, field: str, signum: int) -> bool:
    found = re.search(rf"^{field}:\s*([0-9a-fA-F]+)$", status, re.MULTILINE)
    if found is None:
        return False
    return bool(int(found.group(1), 16) >> (signum - 1) & 1)


def _catches(pid: int, signum: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return _mask_has(status, "SigCgt", signum)


def _blocking_tasks(pid: int, signum: int) -> set[int] | None:
    """Threads of ``pid`` that block ``signum`` now; None once it holds it pending.

    faulthandler's handler runs with its signal blocked in the thread running it (it is
    registered without ``SA_NODEFER``), so a dump is complete once the signal is neither
    pending nor blocked in a thread that did not block it before it was sent.
    """
    try:
        if _mask_has(Path(f"/proc/{pid}/status").read_text(), "ShdPnd", signum):
            return None
        tasks = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return set()
    blocking = set()
    for tid in tasks:
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue  # the thread ended
        if _mask_has(status, "SigPnd", signum):
            return None
        if _mask_has(status, "SigBlk", signum):
            blocking.add(tid)
    return blocking


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def python_process(slot_pid: int, signum: int) -> int | None:
    """The first process (breadth first from ``slot_pid``) that catches ``signum``."""
    queue = [slot_pid]
    while queue:
        pid = queue.pop(0)
        if _catches(pid, signum):
            return pid
        queue.extend(_children(pid))
    return None


def _registered(path: Path, pid: int) -> bool:
    """True if process ``pid`` wrote `producers.stackdump.installed_line` to ``path``."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            return installed_line(pid) in f.read()
    except OSError:
        return False


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def capture(
    slots: Mapping[int, tuple[int, Path]], *, timeout_s: float = 3.0, poll_s: float = 0.02
) -> dict[int, TakenStack]:
    """Ask every rank for its stacks at once and collect the answers.

    Args:
        slots: Rank -> (pid of its slot, its stack file).
        timeout_s: Longest to wait for all answers.
        poll_s: How often the processes and files are looked at. A dump is complete
            when the file grew and the signal is no longer pending or being handled
            (`_blocking_tasks`).

    Returns:
        Rank -> what it answered (a note where it did not).
    """
    signum = int(getattr(signal, STACK_SIGNAL_NAME, 0))
    asked: dict[int, tuple[int, Path, int, set[int]]] = {}
    out: dict[int, TakenStack] = {}
    for rank, (slot_pid, path) in sorted(slots.items()):
        pid = python_process(slot_pid, signum) if signum else None
        if pid is None:
            out[rank] = TakenStack(rank, None, "", "", "no process catching SIGUSR1")
            continue
        if not _registered(path, pid):
            out[rank] = TakenStack(rank, pid, "", "", "no stack handler installed")
            continue
        before = _size(path)
        blocked_before = _blocking_tasks(pid, signum) or set()
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            out[rank] = TakenStack(rank, pid, "", "", "exited before it was asked")
            continue
        asked[rank] = (pid, path, before, blocked_before)
    deadline = time.monotonic() + timeout_s
    sizes = {rank: (before, 0) for rank, (_, _, before, _) in asked.items()}
    while asked:
        for rank, (pid, path, before, blocked_before) in list(asked.items()):
            state = _state(pid)
            handling = _blocking_tasks(pid, signum)
            size = _size(path)  # after: a finished handler has written all of it
            last, still = sizes[rank]
            sizes[rank] = (size, still + 1 if size == last else 0)
            # Done when the handler has finished: the signal is no longer pending and no
            # thread blocks it that did not before; or, where a thread started meanwhile
            # (C++ libraries start threads with every signal blocked), when the file has
            # stopped growing. A process that exits while asked answers with what it wrote.
            settled = handling is not None and (
                handling <= blocked_before or sizes[rank][1] >= _SETTLED_POLLS
            )
            if size > before and (settled or state in _ENDED):
                text = _read_from(path, before, size)
                out[rank] = TakenStack(rank, pid, text, where(text))
                del asked[rank]
            elif state in _ENDED:
                out[rank] = TakenStack(rank, pid, "", "", "exited while asked")
                del asked[rank]
        if not asked:
            break
        if time.monotonic() > deadline:
            for rank, (pid, _, _, _) in asked.items():
                pending = _blocking_tasks(pid, signum) is None
                out[rank] = TakenStack(
                    rank,
                    pid,
                    "",
                    "",
                    f"no answer within {timeout_s:g} s (process state {_state(pid) or '?'}"
                    f"{', signal still pending' if pending else ''})",
                )
            break
        time.sleep(poll_s)  # polling files another process writes, with a deadline
    return dict(sorted(out.items()))


_ENDED = ("", "Z", "X")
"""Process states of a process that will never answer: gone, zombie, dead."""

_SETTLED_POLLS = 3
"""Polls with an unchanged file after which a dump counts as complete."""


def _state(pid: int) -> str:
    """The one-letter state of ``pid`` (``R``, ``S``, ``D``, ``Z``...), "" if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0] if fields else ""


def _read_from(path: Path, start: int, end: int) -> str:
    with path.open("rb") as f:
        f.seek(start)
        return f.read(end - start).decode("utf-8", "replace")


__all__ = ["TakenStack", "capture", "python_process", "where"]
