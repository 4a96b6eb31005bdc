"""Every use runwatch's controller makes of torchft, in one module, against one version.

torchft is young (0.2.0 here) and its Python surface moves; what the controller needs of it
is one thing: a Lighthouse (``torchft.coordination.LighthouseServer``, public in 0.2.0)
whose address the replica groups get in ``TORCHFT_LIGHTHOUSE``. It runs in a process of
its own (`LighthouseProcess`), so that a controller that dies does not take the quorum
with it, started as ``python -m runwatch.controller.torchft_compat`` with the settings on
its command line; it prints one line, ``lighthouse <address> barrier <address>``, and
serves until it is terminated.

Two Lighthouses serve: the training quorum (``min_replicas`` = ``--min-replicas``) and a
start barrier (``min_replicas`` = every group): see
`producers.torchft_backend.TorchFTDDPBackend`.

Guards: the version is checked on import of torchft here (`require_torchft`), and any
attribute missing from it is a `TorchFTUnsupported` that says which version is expected;
nothing else in runwatch's controller imports torchft.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any

EXPECTED_VERSION = "0.2.0"
"""The torchft this module was written against (the ``ft`` extra pins it)."""

READY_PREFIX = "lighthouse "


class TorchFTUnsupported(RuntimeError):
    """torchft is missing, or not the version whose surface this module uses."""


def require_torchft() -> Any:
    """Import ``torchft.coordination`` after checking the installed version.

    Raises:
        TorchFTUnsupported: Not installed, another version, or the Lighthouse class gone.
    """
    try:
        version = importlib.metadata.version("torchft")
    except importlib.metadata.PackageNotFoundError:
        raise TorchFTUnsupported(
            "--fault-tolerance torchft needs torchft (pip install 'runwatch[ft]')"
        ) from None
    if version != EXPECTED_VERSION:
        raise TorchFTUnsupported(
            f"torchft {version} is installed; runwatch's controller is written against "
            f"{EXPECTED_VERSION} (pip install 'runwatch[ft]')"
        )
    import torchft.coordination as coordination

    if not hasattr(coordination, "LighthouseServer"):
        raise TorchFTUnsupported(f"torchft {version} has no coordination.LighthouseServer")
    return coordination


@dataclass(frozen=True)
class LighthouseSettings:
    """How the Lighthouse judges the replica groups.

    Attributes:
        min_replicas: Fewest groups a quorum may have (``--min-replicas``).
        groups: Replica groups in the run (the start barrier waits for all of them).
        join_timeout_ms: How long a quorum waits for a heartbeating group to join.
        heartbeat_timeout_ms: A group not heard from this long is out of the quorum.
    """

    min_replicas: int
    groups: int
    join_timeout_ms: int = 1000
    heartbeat_timeout_ms: int = 2000

    def argv(self) -> list[str]:
        """The command line of the Lighthouse process."""
        return [
            sys.executable,
            "-m",
            "runwatch.controller.torchft_compat",
            "--min-replicas",
            str(self.min_replicas),
            "--groups",
            str(self.groups),
            "--join-timeout-ms",
            str(self.join_timeout_ms),
            "--heartbeat-timeout-ms",
            str(self.heartbeat_timeout_ms),
        ]


@dataclass(frozen=True)
class LighthouseProcess:
    """A running Lighthouse process.

    Attributes:
        pid: Its process id (its own session: ``os.killpg`` stops it).
        address: The training quorum's address (``TORCHFT_LIGHTHOUSE``).
        barrier: The start barrier's address (``RUNWATCH_FT_START_BARRIER``).
    """

    pid: int
    address: str
    barrier: str

    def stop(self) -> None:
        """Terminate it (nothing of it is durable)."""
        try:
            os.killpg(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return


def start_lighthouse(settings: LighthouseSettings, timeout_s: float = 120.0) -> LighthouseProcess:
    """Start a Lighthouse process and wait for its address.

    Raises:
        TorchFTUnsupported: torchft is unusable here (the process said why).
        TimeoutError: It did not say its address within ``timeout_s``.
    """
    proc = subprocess.Popen(
        settings.argv(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        text=True,
    )
    assert proc.stdout is not None
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout_s)
    text = line[0].strip() if line else ""
    if not text.startswith(READY_PREFIX):
        proc.kill()
        if text:
            raise TorchFTUnsupported(text)
        raise TimeoutError(f"the torchft Lighthouse did not start within {timeout_s:g}s")
    words = text.split()
    return LighthouseProcess(pid=proc.pid, address=words[1], barrier=words[3])


def _serve(args: argparse.Namespace) -> int:
    try:
        coordination = require_torchft()
    except TorchFTUnsupported as exc:
        print(f"error: {exc}", flush=True)
        return 2
    server = coordination.LighthouseServer(
        bind="[::]:0",
        min_replicas=args.min_replicas,
        join_timeout_ms=args.join_timeout_ms,
        heartbeat_timeout_ms=args.heartbeat_timeout_ms,
    )
    barrier = coordination.LighthouseServer(
        bind="[::]:0", min_replicas=args.groups, join_timeout_ms=3_600_000
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    print(f"{READY_PREFIX}{server.address()} barrier {barrier.address()}", flush=True)
    done.wait()
    server.shutdown()
    barrier.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Serve a Lighthouse and a start barrier until SIGTERM (`start_lighthouse` starts it)."""
    p = argparse.ArgumentParser(description="runwatch's torchft Lighthouse process")
    p.add_argument("--min-replicas", type=int, required=True)
    p.add_argument("--groups", type=int, required=True)
    p.add_argument("--join-timeout-ms", type=int, default=1000)
    p.add_argument("--heartbeat-timeout-ms", type=int, default=2000)
    return _serve(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "EXPECTED_VERSION",
    "LighthouseProcess",
    "LighthouseSettings",
    "TorchFTUnsupported",
    "require_torchft",
    "start_lighthouse",
]
