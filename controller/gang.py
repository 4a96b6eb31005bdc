"""Launching, watching and stopping a torch gang: one process per rank, as torchrun does.

Each rank gets its `common.launch_env.LaunchEnv` (torchrun's variables plus runwatch's;
`controller.topology.NodeTopology.launch_env` writes one per local rank) over the agent's
own environment. The command key is removed from the ranks' environment: only the
controller verifies commands.

A rank runs under a tiny ``sh`` wrapper in its own session (so its process group id is the
wrapper's pid, and a signal to the gang never reaches the controller). The wrapper writes
the rank's exit status to a file when the rank ends, which lets a controller that did not
launch the gang (it adopted it after a restart) still tell a finished run from a failed
one. The wrapper traps SIGTERM and SIGINT with a handler (not by ignoring them, so the rank
keeps their default disposition) and waits for the rank.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

from runwatch.common.launch_env import LaunchEnv
from runwatch.common.settings import ranks_environ
from runwatch.controller.state import RankProcess

WRAPPER = (
    "trap : TERM INT HUP\n"
    '"$@"\n'
    "rc=$?\n"
    'printf "%s\\n" "$rc" > "$0.tmp" && mv -f "$0.tmp" "$0"\n'
    'exit "$rc"\n'
)
"""``sh -c WRAPPER <exit file> <argv...>``: run argv, then record its exit status."""

SCRUBBED_ENV = ("RUNWATCH_COMMAND_KEY", "RUNWATCH_COMMAND_KEY_FILE", "RUNWATCH_RESTART_FROM")
"""Variables never passed to ranks from the controller's own environment."""

RUNNING = "running"


WarmStart = Callable[
    [Sequence[str], Mapping[str, str], Path, Path], "subprocess.Popen[bytes] | None"
]
"""``(argv, env, log_path, exit_file) -> process``: a rank started in a warm spare, or None."""


def start_wrapped(
    argv: Sequence[str],
    env: Mapping[str, str],
    exit_file: Path,
    *,
    stdout: IO[bytes],
    stdin: int = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` under `WRAPPER` in a session of its own (its pid is its group's id).

    Args:
        argv: The command.
        env: Its whole environment.
        exit_file: Where the wrapper writes the exit status when the command ends.
        stdout: Its output (stderr goes there too).
        stdin: Its input: ``subprocess.DEVNULL`` for a rank, ``subprocess.PIPE`` for a
            warm spare waiting for its assignment.

    Returns:
        The wrapper's process.
    """
    return subprocess.Popen(
        ["/bin/sh", "-c", WRAPPER, str(exit_file), *argv],
        env=dict(env),
        stdin=stdin,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


EPHEMERAL_PORTS_FILE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""Where Linux keeps the range it gives outgoing connections their local ports from."""

RENDEZVOUS_PORT_FLOOR: Final = 10_000
"""The lowest port `free_port` picks: above the well-known and most registered services."""


def ephemeral_ports(path: Path = EPHEMERAL_PORTS_FILE) -> range:
    """The kernel's ephemeral port range (Linux's default, 32768-60999, when unreadable)."""
    try:
        low, high = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        return range(32768, 61000)
    return range(low, high + 1)


def free_port(ephemeral: range | None = None, tries: int = 64) -> int:
    """A TCP port that was free a moment ago (a rendezvous port), outside the ephemeral range.

    A port from ``bind(0)`` is an ephemeral one: until the rank's TCPStore binds it, the
    kernel may give it to any process's outgoing connection (a Kafka client, another
    gang's ranks), and the store then fails with EADDRINUSE. That was seen: a torchft
    group's restart in a busy test run lost its port and the gang never met again. A port
    below the ephemeral range is only ever taken by an explicit bind.

    Rules:
        1. A random port in [`RENDEZVOUS_PORT_FLOOR`, the range's start) that binds on every
           address now, in up to ``tries`` draws.
        2. Otherwise (the range leaves less than 1,024 ports below it, or none bound), a
           port the kernel picks, as before.

    Args:
        ephemeral: The ephemeral range (default: the kernel's, `ephemeral_ports`).
        tries: Draws before rule 2.
    """
    below = (ephemeral_ports() if ephemeral is None else ephemeral).start
    if below - RENDEZVOUS_PORT_FLOOR >= 1024:  # rule 1
        for _ in range(tries):
            port = random.randrange(RENDEZVOUS_PORT_FLOOR, below)
            with socket.socket() as s:
                try:
                    s.bind(("", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:  # rule 2
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_environ(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """What every rank of this node shares: ``base`` without `SCRUBBED_ENV`, then ``extra``.

    The ranks log in to Kafka as the trainer when the controller's environment has its
    credential (`common.settings.ranks_environ`), never with the controller's own.

    A warm spare starts with it (`controller.spares`); a rank adds its contract.

    Args:
        base: The controller's environment.
        extra: Variables the gang record adds (``runwatch launch --env``).
    """
    env = ranks_environ({k: v for k, v in base.items() if k not in SCRUBBED_ENV})
    env.update(extra)
    return env


def rank_environ(
    base: Mapping[str, str], extra: Mapping[str, str], launch: LaunchEnv
) -> dict[str, str]:
    """The environment of one rank: `node_environ`, then the rank's contract.

    torchrun's defaults (`common.launch_env.LaunchEnv.defaults`:
    ``TORCH_NCCL_ASYNC_ERROR_HANDLING``, ``OMP_NUM_THREADS``) fill in what neither the
    controller's environment nor ``extra`` sets; the contract then wins over all of them.

    Args:
        base: The controller's environment.
        extra: Variables the gang record adds (``runwatch launch --env``).
        launch: The rank's launch environment (the contract; it wins over both).

    Returns:
        The environment.
    """
    env = node_environ(base, extra)
    for name, value in launch.defaults().items():
        env.setdefault(name, value)
    env.update(launch.to_environ())
    return env


def start_ticks(pid: int) -> int:
    """The start time of ``pid`` in clock ticks, 0 if it is gone or unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat[stat.rfind(")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else 0


def _alive(proc: RankProcess) -> bool:
    try:
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return False
    return proc.start_ticks == 0 or int(fields[19]) == proc.start_ticks


def _read_exit(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


@dataclass
class Gang:
    """One incarnation's ranks, launched here (children) or adopted (pids only).

    Attributes:
        ranks: The rank processes.
        exit_files: Where each rank's wrapper writes its exit status, by rank.
        children: The `subprocess.Popen` of each rank launched by this process.
    """

    ranks: tuple[RankProcess, ...]
    exit_files: tuple[Path, ...]
    children: dict[int, subprocess.Popen[bytes]]

    @classmethod
    def launch(
        cls,
        argv: Sequence[str],
        envs: Sequence[Mapping[str, str]],
        log_paths: Sequence[Path],
        exit_files: Sequence[Path],
        *,
        ranks: Sequence[int] | None = None,
        warm: WarmStart | None = None,
    ) -> Gang:
        """Start one wrapped process per rank, each in its own session.

        Args:
            argv: The command every rank runs.
            envs: Each rank's environment.
            log_paths: Each rank's output file (appended).
            exit_files: Each rank's exit-status file (removed first if present).
            ranks: The global rank of each process (default ``0..len(envs)-1``; node I of
                a multi-node gang of K ranks per node starts ``I*K .. I*K+K-1``).
            warm: Starts a rank in a warm spare where one is left (`controller.spares`);
                a rank it returns None for starts cold.

        Returns:
            The running gang.
        """
        started, children = [], {}
        numbers = list(range(len(envs))) if ranks is None else list(ranks)
        for rank, env, log_path, exit_file in zip(
            numbers, envs, log_paths, exit_files, strict=True
        ):
            exit_file.unlink(missing_ok=True)
            proc = warm(argv, env, log_path, exit_file) if warm is not None else None
            if proc is None:
                fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                with os.fdopen(fd, "ab") as log:  # 0600: a rank's output may hold secrets
                    proc = start_wrapped(argv, env, exit_file, stdout=log)
            children[rank] = proc
            started.append(RankProcess(rank=rank, pid=proc.pid, start_ticks=start_ticks(proc.pid)))
        return cls(tuple(started), tuple(exit_files), children)

    @classmethod
    def adopt(cls, ranks: Sequence[RankProcess], exit_files: Sequence[Path]) -> Gang:
        """Watch ranks another process launched (their exit status comes from the files)."""
        return cls(tuple(ranks), tuple(exit_files), {})

    def status(self, rank: int) -> int | str | None:
        """``"running"``, the rank's exit status, or None if it ended with an unknown status."""
        index = self._index(rank)
        child = self.children.get(rank)
        if child is not None:
            code = child.poll()
            if code is None:
                return RUNNING
            recorded = _read_exit(self.exit_files[index])
            return code if recorded is None else recorded
        if _alive(self.ranks[index]):
            return RUNNING
        return _read_exit(self.exit_files[index])

    def _index(self, rank: int) -> int:
        """Position of global ``rank`` in `ranks` (and `exit_files`)."""
        for index, proc in enumerate(self.ranks):
            if proc.rank == rank:
                return index
        raise KeyError(f"rank {rank} is not in this gang")

    def running(self) -> list[int]:
        """Ranks still running."""
        return [r.rank for r in self.ranks if self.status(r.rank) == RUNNING]

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process group of every running rank."""
        for proc in self.ranks:
            if self.status(proc.rank) == RUNNING:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)

    def wait(self, timeout_s: float, poll_s: float = 0.05) -> bool:
        """Wait until every rank ended; True if they did within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.running():
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    def stop(self, grace_s: float, *, kill_now: bool = False) -> None:
        """Stop the gang: SIGTERM, up to ``grace_s`` for a clean exit, then SIGKILL.

        Args:
            grace_s: Seconds between SIGTERM and SIGKILL.
            kill_now: SIGKILL right away (a rollback: a rank that checkpoints on SIGTERM
                would write poisoned state).
        """
        if not kill_now:
            self.signal(signal.SIGTERM)
            if self.wait(grace_s):
                return
        self.signal(signal.SIGKILL)
        self.wait(30.0)


__all__ = [
    "RUNNING",
    "SCRUBBED_ENV",
    "WRAPPER",
    "Gang",
    "WarmStart",
    "free_port",
    "node_environ",
    "rank_environ",
    "start_ticks",
    "start_wrapped",
]
