"""Warm spares: rank processes an agent keeps ready, torch imported, for the next incarnation.

``runwatch launch --warm-spares`` keeps one spare per local rank slot. A spare is a process
of the training command's own interpreter running `controller.warm_start` (the spare's
side of the protocol is written down there): it imports the preload modules, says it is
ready, and waits on a pipe. On a restart `controller.gang.Gang.launch` hands each rank of
the next incarnation to a spare (`SparePool.take`, then `Spare.assign`) instead of starting
a cold interpreter, so the respawn does not wait for torch to import again.

Rules:

* Only a Python command can start warm: ``python [flags] script.py ...`` or ``python
  [flags] -m module ...`` (`split_python`). Anything else starts cold, and says so once.
* A spare runs under the same exit-status wrapper as every rank, in its own session, so
  once assigned it *is* the rank: the agent watches, signals and stops it like any other.
  Its exit file lives with the spare; the rank's usual exit path is a symlink to it, so a
  controller that adopts the gang later reads the status where it always does.
* Spares are (re)started `SparePool.fill` ``delay_s`` after a gang was launched, not with
  it (`SparePool.tick`): their imports would compete with the new ranks' start for the
  node's CPUs.
* A spare that died while waiting is discarded when taken; with no live spare a rank
  starts cold. Closing the pool (the run ended, the agent stops) kills the waiting spares:
  they have run nothing. An agent that dies closes their pipes, and a spare whose input
  ends exits without running anything, so spares never outlive their agent for long.
* A run without ``--warm-spares`` gets `NoSpares`: the same `Spares` interface, never a
  spare (every rank starts cold), so the launcher never asks whether there is a pool.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from runwatch.controller import warm_start
from runwatch.controller.gang import start_wrapped
from runwatch.controller.state import DEFAULT_SPARE_PRELOAD

log = logging.getLogger(__name__)


_PYTHON = re.compile(r"^python[0-9.]*$")
_FLAGS_WITH_VALUE = frozenset({"-X", "-W", "-Q"})
_FLAGS = frozenset("bBdEhiIOqsSuvR")


def split_python(argv: Sequence[str]) -> tuple[list[str], list[str]] | None:
    """Split a training command into its interpreter (with flags) and what the spare runs.

    Args:
        argv: The command, e.g. ``["python", "-u", "train.py", "--lr", "3e-4"]``.

    Returns:
        ``(["python", "-u"], ["train.py", "--lr", "3e-4"])``, or for ``-m``
        ``(["python"], ["-m", "pkg.train", ...])``; None when the command is not a
        Python interpreter running a script or module (``-c``, a shell script, ``torchrun``).
    """
    if not argv or not _PYTHON.match(Path(argv[0]).name):
        return None
    interpreter = [argv[0]]
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return (interpreter, list(argv[i:])) if i + 1 < len(argv) else None
        if arg in _FLAGS_WITH_VALUE:
            if i + 1 >= len(argv):
                return None
            interpreter += [arg, argv[i + 1]]
            i += 2
            continue
        if arg.startswith("-") and len(arg) > 1:
            if not set(arg[1:]) <= _FLAGS:
                return None  # -c, --check-hash-based-pycs, a combined flag we do not know
            interpreter.append(arg)
            i += 1
            continue
        return interpreter, list(argv[i:])  # the script
    return None


@dataclass
class Spare:
    """One waiting spare.

    Attributes:
        name: Its name in the pool's directory.
        proc: Its wrapper process (the rank's slot once assigned).
        exit_file: Where its wrapper writes the exit status.
        ready_file: Written with the spare's pid once its preload is done.
    """

    name: str
    proc: subprocess.Popen[bytes]
    exit_file: Path
    ready_file: Path

    @property
    def ready(self) -> bool:
        """True once the preload is done (the spare is waiting for its assignment)."""
        return self.ready_file.is_file()

    def assign(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: str) -> None:
        """Hand this spare its rank: the command after the interpreter, env, log, cwd.

        Raises:
            OSError: The spare is gone (its pipe is closed).
        """
        line = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd, "log": str(log_path)})
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.close()

    def release(self) -> None:
        """Tell the spare it is not needed (end of input): it exits without running."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()


class Spares(Protocol):
    """What a launcher asks of the warm spares of one run on its node."""

    @property
    def taken(self) -> int:
        """How many ranks started in a spare so far."""
        ...

    def resize(self, size: int) -> None:
        """Keep ``size`` spares from now on (the node's rank slots of the next launch)."""
        ...

    def start_rank(
        self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, exit_file: Path
    ) -> subprocess.Popen[bytes] | None:
        """`controller.gang.WarmStart`: run one rank in a spare; None: start it cold."""
        ...

    def launched(self, now_s: float) -> None:
        """A gang was just launched (monotonic seconds): refill only after a delay."""
        ...

    def tick(self, now_s: float) -> None:
        """Refill if it is time (called after every look at the gang)."""
        ...

    def close(self) -> None:
        """End every waiting spare."""
        ...


class NoSpares:
    """`Spares` of a run without ``--warm-spares``: never a spare, every rank starts cold."""

    taken = 0

    def resize(self, size: int) -> None:
        """Nothing to keep."""

    def start_rank(
        self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, exit_file: Path
    ) -> subprocess.Popen[bytes] | None:
        """No spare: the rank starts cold."""
        return None

    def launched(self, now_s: float) -> None:
        """Nothing to refill."""

    def tick(self, now_s: float) -> None:
        """Nothing to refill."""

    def close(self) -> None:
        """Nothing to end."""


@dataclass
class SparePool:
    """The spares of one run on this node.

    Attributes:
        root: Where spares keep their exit, ready and log files.
        interpreter: The training command's interpreter and flags (`split_python`).
        target: What the ranks run after them (``["train.py", ...]``, ``["-m", "pkg"]``):
            the spare preloads the script's own imports too.
        env: The spares' environment (the agent's, with the run's extras, scrubbed).
        preload: The modules a spare imports while it waits.
        size: How many spares to keep (the node's rank slots).
        delay_s: How long after a gang's launch the pool is refilled.
        spares: The spares waiting now.
        taken: How many ranks started in a spare so far.
        launched_s: When a gang was last launched (monotonic); None: not yet.
    """

    root: Path
    interpreter: tuple[str, ...]
    target: tuple[str, ...]
    env: Mapping[str, str]
    preload: tuple[str, ...] = DEFAULT_SPARE_PRELOAD
    size: int = 1
    delay_s: float = 3.0
    spares: list[Spare] = field(default_factory=list)
    taken: int = 0
    launched_s: float | None = None

    def fill(self) -> None:
        """Start spares until `size` are waiting (each starts importing at once)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.spares = [s for s in self.spares if s.proc.poll() is None]
        started = []
        while len(self.spares) < self.size:
            spare = self._start()
            self.spares.append(spare)
            started.append(spare)
        if started:
            log.info(
                "%d warm spare(s) started (pids %s), preloading %s",
                len(started),
                [s.proc.pid for s in started],
                ",".join(self.preload),
            )

    def resize(self, size: int) -> None:
        """Keep ``size`` spares from now on (fewer once the gang shrank)."""
        self.size = size

    def launched(self, now_s: float) -> None:
        """A gang was just launched: the next refill is `delay_s` after ``now_s``."""
        self.launched_s = now_s

    def tick(self, now_s: float) -> None:
        """Refill `delay_s` after the last launch, when fewer than `size` are kept."""
        if self.launched_s is None or now_s - self.launched_s < self.delay_s:
            return
        if len(self.spares) < self.size:
            self.fill()

    def _start(self) -> Spare:
        name = f"spare-{time.time_ns()}-{uuid.uuid4().hex[:6]}"
        exit_file = self.root / f"{name}.exit"
        ready_file = self.root / f"{name}.ready"
        argv = [
            *self.interpreter,
            warm_start.__file__,
            "--preload",
            ",".join(self.preload),
            "--ready-file",
            str(ready_file),
            *(
                ["--module", self.target[1]]
                if self.target[0] == "-m"
                else ["--script", self.target[0]]
            ),
        ]
        fd = os.open(self.root / f"{name}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "ab") as out:
            proc = start_wrapped(argv, self.env, exit_file, stdout=out, stdin=subprocess.PIPE)
        log.debug("warm spare %s started (pid %d)", name, proc.pid)
        return Spare(name, proc, exit_file, ready_file)

    def take(self) -> Spare | None:
        """A live spare for the next rank (ready ones first), or None: start it cold."""
        self.spares = [s for s in self.spares if s.proc.poll() is None]
        if not self.spares:
            return None
        self.spares.sort(key=lambda s: not s.ready)
        return self.spares.pop(0)

    def start_rank(
        self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, exit_file: Path
    ) -> subprocess.Popen[bytes] | None:
        """`controller.gang.WarmStart`: run one rank of ``argv`` in a spare, None if none.

        The rank's exit file becomes a symlink to the spare's, which its wrapper writes.
        """
        split = split_python(argv)
        if split is None or tuple(split[0]) != self.interpreter:
            return None
        while (spare := self.take()) is not None:
            warm = spare.ready
            try:
                spare.assign(split[1], env, log_path, os.getcwd())
            except OSError:  # it died between the check and the write: try the next
                continue
            exit_file.unlink(missing_ok=True)
            exit_file.symlink_to(spare.exit_file)
            spare.ready_file.unlink(missing_ok=True)
            self.taken += 1
            log.debug(
                "rank started in warm spare %s (pid %d%s)",
                spare.name,
                spare.proc.pid,
                "" if warm else ", still preloading",
            )
            return spare.proc
        return None

    @property
    def ready(self) -> int:
        """How many spares are waiting with their preload done."""
        return sum(1 for s in self.spares if s.ready and s.proc.poll() is None)

    def close(self) -> None:
        """End every waiting spare: it has run nothing yet, so SIGKILL loses nothing."""
        for spare in self.spares:
            spare.release()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(spare.proc.pid, signal.SIGKILL)
            spare.proc.wait()
        self.spares = []


__all__ = ["NoSpares", "Spare", "SparePool", "Spares", "split_python"]
