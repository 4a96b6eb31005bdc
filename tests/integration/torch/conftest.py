"""Launch `examples/train_ddp.py` gangs as real processes, the way torchrun would.

Each rank is its own ``python`` process with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` set (a fresh free port per gang, below the kernel's
ephemeral range as the controller picks them: `controller.gang.free_port`); no torchrun
involved.
Emitting to Kafka is off unless a test asks for it (``RUNWATCH_*`` cleared, ``--no-emit``);
the script's ``--trace-dir`` records what it would have emitted.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runwatch.controller.gang import free_port

if importlib.util.find_spec("torch") is None:  # an optional extra
    collect_ignore_glob = ["test_*.py"]

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "examples" / "train_ddp.py"


@dataclass
class Gang:
    returncodes: list[int]
    logs: list[str]
    trace: Path

    def metrics(self) -> dict[str, Any]:
        return json.loads((self.trace / "metrics.json").read_text())

    def losses(self) -> dict[int, float]:
        return {int(k): v for k, v in self.metrics()["losses"].items()}

    def events(self, rank: int = 0, call: str | None = None) -> list[dict[str, Any]]:
        path = self.trace / f"events.rank{rank}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return [r for r in rows if call is None or r["call"] == call]

    def samples(self, rank: int) -> dict[int, list[int]]:
        path = self.trace / f"samples.rank{rank}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return {r["step"]: r["ids"] for r in rows}


def gang_env(rank: int, nproc: int, port: int, env: dict[str, str] | None = None) -> dict[str, str]:
    """A rank's environment: ``RUNWATCH_*`` cleared, ``env`` applied, the torchrun variables."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RUNWATCH_")}
    return (
        base
        | (env or {})
        | {
            "RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
    )


def start_gang(
    nproc: int,
    args: Sequence[str],
    trace: Path,
    *,
    env: dict[str, str] | None = None,
    emit: bool = False,
) -> list[subprocess.Popen[str]]:
    """Start ``nproc`` ranks of the training script; returns their processes.

    ``RUNWATCH_*`` variables are cleared, then ``env`` applied; ``emit=False`` adds
    ``--no-emit`` (the default: no Kafka needed).
    """
    port = free_port()
    procs = []
    for rank in range(nproc):
        rank_env = gang_env(rank, nproc, port, env)
        cmd = [
            sys.executable,
            str(SCRIPT),
            *([] if emit else ["--no-emit"]),
            "--trace-dir",
            str(trace),
            *args,
        ]
        procs.append(
            subprocess.Popen(
                cmd,
                env=rank_env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def wait_gang(procs: list[subprocess.Popen[str]], trace: Path, timeout_s: float = 120.0) -> Gang:
    """Wait for every rank (killing stragglers after ``timeout_s``); collect codes and logs."""
    deadline = time.monotonic() + timeout_s
    logs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            logs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return Gang([p.returncode for p in procs], logs, trace)


def run_gang(
    nproc: int,
    args: Sequence[str],
    trace: Path,
    *,
    env: dict[str, str] | None = None,
    timeout_s: float = 120.0,
) -> Gang:
    """Start ``nproc`` ranks, wait for all of them, return exit codes and logs."""
    return wait_gang(start_gang(nproc, args, trace, env=env), trace, timeout_s)


@pytest.fixture
def solo_rank_env() -> dict[str, str]:
    """The environment of a 1-rank gang on a free port (for a script run as its rank)."""
    return gang_env(0, 1, free_port())


@pytest.fixture(scope="module")
def gang_runner(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Gang]:
    """``gang_runner(nproc, args, name, env=None)``: run a gang with its own trace dir."""

    def run(nproc: int, args: Sequence[str], name: str, env: dict[str, str] | None = None) -> Gang:
        trace = tmp_path_factory.mktemp(name)
        return run_gang(nproc, args, trace, env=env)

    return run


@pytest.fixture
def gang_control() -> tuple[Callable[..., list[subprocess.Popen[str]]], Callable[..., Gang]]:
    """``(start_gang, wait_gang)``, for tests that act on a gang while it runs."""
    return start_gang, wait_gang
