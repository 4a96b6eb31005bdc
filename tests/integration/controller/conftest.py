"""Fixtures for the controller tests: one processors worker, launchers, readers, a reference.

Everything is real: the session broker, a `runwatch processors` worker subprocess, `runwatch
launch` / `runwatch controller` subprocesses, and gloo ranks of `examples/train_ddp.py`.
Waiting is always a read of a topic (or a changelog) with a deadline, never a sleep.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runwatch import admin
from runwatch.controller.state import GANG_FILE, GangFile, GangRecord, read_gang_file
from runwatch.schemas.events import Event
from runwatch.schemas.topics import TopicNames, names
from tests.integration.processors.harness import COMMAND_KEY, Reader, workers

if importlib.util.find_spec("torch") is None:  # an optional extra
    collect_ignore_glob = ["test_*.py"]

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "examples" / "train_ddp.py"
SETS = ("dead_rank_timeout_s=10", "hang_timeout_s=12")
"""Fast liveness verdicts (log time; 300 s and 600 s by default), so a silent gang is flagged
in seconds, yet slow enough that a rank's exit evidence wins its race by a wide margin.

Exit evidence (a `RankExited`) names the culprit and silences the scans, but only once it is
folded: a rank's last heartbeat, its exit, the agent noticing it and the record reaching the
broker all happen before. On an idle box that takes ~0.1 s; under ``make test`` on a loaded
2-core CI box it took more than the 3 s these once were: two tests that assert exactly the
culprit's verdict got a peer's ``dead_rank`` besides or instead (a peer that exited cleanly,
so only its silence could name it). The tests of silence itself (a hang, a lost node) wait
these out."""
PARTITIONS = 2
WAIT_S = 120.0


@dataclass
class Loop:
    """The closed loop's shared parts: broker, topics, the processors' app id, a scratch dir."""

    bootstrap: str
    prefix: str
    topics: TopicNames
    app_id: str
    root: Path

    def reader(self, topic: str) -> Reader:
        return Reader(self.bootstrap, topic)


@pytest.fixture(scope="package")
def loop(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    """Topics for a fresh prefix and one processors worker with fast liveness verdicts."""
    import uuid

    prefix = f"c{uuid.uuid4().hex[:10]}"
    admin.create_topics(kafka_bootstrap, admin.catalogue(prefix, PARTITIONS))
    root = tmp_path_factory.mktemp("loop")
    with ExitStack() as stack:
        start = stack.enter_context(
            workers(kafka_bootstrap, prefix, root, partitions=PARTITIONS, sets=SETS)
        )
        start()
        yield Loop(kafka_bootstrap, prefix, names(prefix), f"{prefix}-app", root)


def rank_env() -> dict[str, str]:
    """The environment tests give launchers (and so ranks): no stray RUNWATCH_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWATCH_")}
    env.update(RUNWATCH_COMMAND_KEY=COMMAND_KEY, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return env


RENDEZVOUS_PORTS = range(20_000, 32_000)
"""Where multi-node tests put their rendezvous ports: below the kernel's ephemeral range
(32768-60999 here), so no outgoing connection can take port P + incarnation between the
check and the incarnation that binds it (an EADDRINUSE at a restart's rendezvous)."""


def free_rendezvous_ports(count: int) -> int:
    """A port P such that P .. P + count - 1 (incarnations 0 ..) are free, off the ephemeral range."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(RENDEZVOUS_PORTS.start, RENDEZVOUS_PORTS.stop - count)
        held = []
        try:
            for extra in range(count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port + extra))
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
        return port
    raise AssertionError(f"no {count} consecutive free ports in {RENDEZVOUS_PORTS}")


class Proc:
    """A `runwatch` subcommand running as a subprocess in its own session."""

    def __init__(self, args: Sequence[str], log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runwatch.cli", *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            start_new_session=True,
        )

    def wait(self, timeout_s: float = WAIT_S) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout_s}s:\n{self.log()}") from None

    def kill(self) -> None:
        """SIGKILL this process only (the gang's ranks are in sessions of their own)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self._log.close()


@dataclass
class Run:
    """One launched run: its launcher and its directories."""

    run_id: str
    launcher: Proc
    state_dir: Path
    checkpoint_dir: Path
    trace_dir: Path

    def metrics(self) -> dict[str, Any]:
        return json.loads((self.trace_dir / "metrics.json").read_text())

    def losses(self) -> dict[int, float]:
        return {int(k): v for k, v in self.metrics()["losses"].items()}

    def gang(self) -> GangFile:
        """What the launcher was asked and what happened (`controller.state`), read only."""
        gang = read_gang_file(self.state_dir / GANG_FILE)
        assert gang is not None, f"no gang record in {self.state_dir}"
        return gang

    def gang_record(self) -> GangRecord:
        """What happened: the launcher's gang record."""
        return self.gang().record

    def rank_logs(self) -> str:
        logs = sorted((self.state_dir / "logs").glob("*.log"))
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs)


@pytest.fixture
def launch(loop: Loop, tmp_path: Path) -> Iterator[Callable[..., Run]]:
    """``launch(run_id, script_args, nproc=2, extra=(), name=run_id)``: `runwatch launch` a
    gang, its directories under ``name`` (a second launch of a run id needs another)."""
    started: list[Run] = []

    def start(
        run_id: str,
        script_args: Sequence[str],
        nproc: int = 2,
        extra: Sequence[str] = (),
        name: str | None = None,
    ) -> Run:
        base = tmp_path / (name or run_id)
        run = Run(run_id, None, base / "state", base / "ckpt", base / "trace")  # type: ignore[arg-type]
        base.mkdir(parents=True)
        args = [
            "launch",
            "--bootstrap",
            loop.bootstrap,
            "--prefix",
            loop.prefix,
            "--nproc",
            str(nproc),
            "--run-id",
            run_id,
            "--checkpoint-dir",
            str(run.checkpoint_dir),
            "--state-dir",
            str(run.state_dir),
            "--grace-s",
            "5",
            "--command-timeout",
            "60",
            *extra,
            "--",
            sys.executable,
            str(SCRIPT),
            "--trace-dir",
            str(run.trace_dir),
            "--checkpoint-every",
            "5",
            *script_args,
        ]
        run.launcher = Proc(args, base / "launcher.log", rank_env())
        started.append(run)
        return run

    yield start
    for run in started:
        run.launcher.close()


def of_run(run_id: str, kind: type[Event] | None = None) -> Callable[[Event], bool]:
    """A filter for one run's events (of one type)."""
    return lambda e: e.run_id == run_id and (kind is None or isinstance(e, kind))


def wait_events(
    reader: Reader, keep: Callable[[Event], bool], count: int = 1, timeout_s: float = WAIT_S
) -> list[Event]:
    """Consume until ``count`` events pass ``keep``; return those that do."""
    events = reader.wait_for(lambda ev: sum(1 for e in ev if keep(e)) >= count, timeout_s)
    return [e for e in events if keep(e)]


def reference_losses(root: Path, script_args: Sequence[str], nproc: int = 2) -> dict[int, float]:
    """Losses of an uninterrupted gang (no Kafka, no controller) with the same arguments."""
    from runwatch.controller.gang import free_port

    trace = root / "trace"
    port = free_port()
    procs = []
    for rank in range(nproc):
        env = rank_env() | {
            "RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        cmd = [sys.executable, str(SCRIPT), "--no-emit", "--trace-dir", str(trace)]
        cmd += ["--checkpoint-dir", str(root / "ckpt"), "--checkpoint-every", "5", *script_args]
        log = (root / f"ref.rank{rank}.log").open("wb")
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + WAIT_S
    codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    assert codes == [0] * nproc, (root / "ref.rank0.log").read_text()
    metrics = json.loads((trace / "metrics.json").read_text())
    return {int(k): v for k, v in metrics["losses"].items()}


def ended_liveness(loop: Loop, run_id: str, incarnation: int, timeout_s: float = WAIT_S) -> Any:
    """The run's liveness state once the processors folded its ``incarnation``'s end."""
    from runwatch.processors.fleet import latest_states

    deadline = time.monotonic() + timeout_s
    while True:
        view = latest_states(loop.bootstrap, loop.app_id).get(run_id)
        state = view.liveness if view else None
        if state and state.incarnation == incarnation and not state.live:
            return state
        assert time.monotonic() < deadline, f"no ended liveness state for {run_id}: {state}"
        time.sleep(0.2)  # polling a changelog, not synchronising on time


def audit_cli(loop: Loop, run_id: str) -> subprocess.CompletedProcess[str]:
    """`runwatch audit --run RUN` of the loop's processors, with their settings."""
    return subprocess.run(
        [sys.executable, "-m", "runwatch.cli", "audit", "--bootstrap", loop.bootstrap]
        + ["--prefix", loop.prefix, "--app-id", loop.app_id, "--run", run_id, "--wait", "120"]
        + [arg for pair in SETS for arg in ("--set", pair)],
        capture_output=True,
        text=True,
        timeout=300,
    )
