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
`producers.torchft_backend.TorchFTDDPBackend`. On one host they listen on free ports; a
run of several nodes has node 0's agent start them on fixed ports (`LighthouseSettings.port`
and the next one) and the other nodes' agents join them there (`join_lighthouse`).

Guards: the version is checked on import of torchft here (`require_torchft`), and any
attribute missing from it is a `TorchFTUnsupported` that says which version is expected;
nothing else in runwatch's controller imports torchft.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
import threading
import time
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
        port: The quorum's port (the barrier's is the next one); 0: free ports (one host).
    """

    min_replicas: int
    groups: int
    join_timeout_ms: int = 1000
    heartbeat_timeout_ms: int = 2000
    port: int = 0

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
            "--port",
            str(self.port),
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


@dataclass(frozen=True)
class JoinedLighthouse:
    """Another node's Lighthouse, which this node's groups meet in (nothing of it is ours).

    Attributes:
        address: The training quorum's address (``TORCHFT_LIGHTHOUSE``).
        barrier: The start barrier's address (``RUNWATCH_FT_START_BARRIER``).
    """

    address: str
    barrier: str

    def stop(self) -> None:
        """Nothing: node 0's agent stops its Lighthouse."""


def lighthouse_address(host: str, port: int) -> str:
    """The address torchft's clients use for a Lighthouse on ``host``:``port``."""
    return f"http://{host}:{port}"


def join_lighthouse(host: str, port: int, timeout_s: float) -> JoinedLighthouse:
    """Wait until node 0's Lighthouse and barrier accept connections; return their addresses.

    Args:
        host: Node 0's host (``--master-addr``).
        port: The quorum's port (the barrier's is the next one).
        timeout_s: How long node 0's agent may take to start them.

    Raises:
        TimeoutError: They did not accept a connection within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    for p in (port, port + 1):
        while True:
            try:
                socket.create_connection((host, p), timeout=1.0).close()
                break
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"node 0's torchft Lighthouse at {host}:{p} did not answer within "
                        f"{timeout_s:g}s ({exc})"
                    ) from None
                time.sleep(0.2)  # retrying a connection that node 0 has not opened yet
    return JoinedLighthouse(lighthouse_address(host, port), lighthouse_address(host, port + 1))


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
    port, barrier_port = (args.port, args.port + 1) if args.port else (0, 0)
    server = coordination.LighthouseServer(
        bind=f"[::]:{port}",
        min_replicas=args.min_replicas,
        join_timeout_ms=args.join_timeout_ms,
        heartbeat_timeout_ms=args.heartbeat_timeout_ms,
    )
    barrier = coordination.LighthouseServer(
        bind=f"[::]:{barrier_port}", min_replicas=args.groups, join_timeout_ms=3_600_000
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
    p.add_argument("--port", type=int, default=0)
    return _serve(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "EXPECTED_VERSION",
    "JoinedLighthouse",
    "LighthouseProcess",
    "LighthouseSettings",
    "TorchFTUnsupported",
    "join_lighthouse",
    "lighthouse_address",
    "require_torchft",
    "start_lighthouse",
]
