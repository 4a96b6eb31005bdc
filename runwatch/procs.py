"""Child processes the demo (and tests) start and must always stop again."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


def exit_on_sigterm() -> None:
    """Make SIGTERM raise ``SystemExit(143)`` in the main thread, as Ctrl-C raises.

    A script that starts children in ``with`` blocks (a broker, workers, launchers) stops
    them on the way out only if its ``finally`` and ``__exit__`` run, which the default
    SIGTERM action (terminate at once) never lets them: ``timeout`` or a scheduler that
    stops a benchmark left its children running.
    """

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


class ManagedProcess:
    """A child in its own session with its output in a log file.

    Stopping signals the whole process group, so grandchildren (torch ranks, JVMs) stop
    with it.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        """Start ``argv`` now.

        Args:
            name: A short name for messages.
            argv: The command.
            log_path: Where its stdout and stderr go (appended).
            env: Its environment (default: ours).
            cwd: Its working directory.
        """
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            list(argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )

    @classmethod
    def runwatch(
        cls, name: str, args: Sequence[str], log_path: Path, **kwargs: object
    ) -> ManagedProcess:
        """Start ``runwatch ARGS`` with this interpreter."""
        return cls(name, [sys.executable, "-m", "runwatch.cli", *args], log_path, **kwargs)  # type: ignore[arg-type]

    @property
    def returncode(self) -> int | None:
        """The exit status, or None while running."""
        return self.proc.poll()

    def wait(self, timeout_s: float | None = None) -> int:
        """Wait for the exit; raises `subprocess.TimeoutExpired` past the timeout."""
        return self.proc.wait(timeout=timeout_s)

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the process group and reap it."""
        self._signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, grace_s: float = 20.0) -> int | None:
        """SIGTERM, wait up to ``grace_s``, then SIGKILL; returns the exit status."""
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
        self._log.close()
        return self.proc.returncode

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of its log."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])
