"""What a controller persists so that a restarted controller neither forgets nor repeats.

One state directory per run (default ``$RUNWATCH_HOME/controller/<run_id>``)::

    gang.json        the gang record: argv, sizes, incarnation, rank pids, ports, offsets
    processed.jsonl  one line per executed command id, appended and fsynced before acting
    logs/            inc<I>.rank<R>.log: each rank's stdout and stderr
    exit/            inc<I>.rank<R>: each rank's exit status, written by its shell wrapper

``gang.json`` is replaced atomically (write a temporary file, fsync, rename, fsync the
directory), so a crash leaves the old record or the new one, never half of one. A torn last
line of ``processed.jsonl`` (a crash mid-append, before the fsync returned, so before the
command was acted on) is skipped on load.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import msgspec

from runwatch.common.durable import append_durably, atomic_write
from runwatch.controller.topology import NodeTopology
from runwatch.schemas.events import BackendDeclaration

GANG_FILE = "gang.json"
PROCESSED_FILE = "processed.jsonl"

GangStatus = Literal["running", "completed", "failed", "dropped"]
"""``dropped``: this node was left out of a multi-node run's next incarnation (it kept
failing, `controller.membership`); the run goes on without it."""


DEFAULT_SPARE_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.checkpoint",
    "torch._inductor.config",
)
"""What a warm spare imports while it waits (``runwatch launch --spare-preload``), besides
the script's own top-level imports (`controller.warm_start`). DCP is imported lazily by
most scripts (1.4 s here); ``torch._inductor.config`` by ``torch.compile`` and by
``torch.use_deterministic_algorithms`` (1.2 s here): a spare pays both before it is needed."""


class RankProcess(msgspec.Struct, frozen=True, kw_only=True):
    """One launched rank.

    Attributes:
        rank: Its global rank.
        pid: Process id of its wrapper (also its process group id: its own session).
        start_ticks: The process's start time in clock ticks (``/proc/<pid>/stat`` field
            22), so a recycled pid is not mistaken for the rank; 0 when unknown.
    """

    rank: int
    pid: int
    start_ticks: int = 0


class GangRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Everything needed to supervise, restart or adopt one run's gang.

    Attributes:
        run_id: The run.
        argv: The command each rank runs.
        world_size: Ranks of the current incarnation.
        bootstrap: Kafka bootstrap address.
        prefix: Topic name prefix.
        checkpoint_dir: Where the gang's checkpoints are committed; None: unknown (every
            respawn starts from scratch).
        env: Extra environment every rank gets (besides the launch contract).
        incarnation: The current incarnation (0 first, +1 per restart).
        ranks: The current incarnation's processes.
        master_port: The current incarnation's rendezvous port.
        launch_offsets: Commands-topic partition -> end offset when the run was launched.
        consumer_offsets: Commands-topic partition -> offset of the last command this
            controller acted on (re-read after a restart; the processed ids make that safe).
        failure_counts: Failures caused per rank index (elastic budget).
        status: ``running``, or how the run ended.
        grace_s: SIGTERM grace before SIGKILL.
        command_timeout_s: How long a dead gang waits for a command.
        rank_failure_budget: Failures a rank may cause before the gang shrinks.
        min_nproc: The gang never shrinks below this.
        log_format: ``runwatch launch --log-format``: the controller turns rank 0's
            output into the run's events (`controller.logwatch`); None: the script emits them.
        log_regex: The pattern for ``log_format="regex"``.
        log_tokens_per_step: Tokens per step for step lines that do not say.
        exit_evidence: Publish every rank exit as a RankExited (``runwatch launch
            --no-exit-evidence`` turns it off: dead ranks are then learned from silence).
        topology: This agent's node in the gang (`controller.topology`); one node by
            default. On one node the gang is ranks ``0..world_size-1`` (it may shrink by
            ranks); on several, this agent's ranks are ``topology.global_ranks`` and
            ``world_size`` is ``topology.world_size``.
        host: The agent's host name, where the ranks run ("" in older records); an
            adopting controller skips records of other hosts (a shared file system shows
            every node's state directories).
        node_timeout_s: How long an agent of a multi-node gang waits, on a restart, for
            the other nodes' agents to announce themselves (``--node-timeout``); a node
            not heard from by then is lost (`controller.membership`).
        backend: What the run's training backend declared in its latest RunStarted, as
            last seen by this agent; None: nothing seen yet (the gang is never shrunk).
        relay_socket: The Unix socket of this agent's relay (``runwatch launch
            --relay``, `controller.relay`): the ranks hand it their events and the agent
            owns the node's one Kafka producer; "" without a relay.
        warm_spares: Keep a warm spare per local rank slot (``runwatch launch
            --warm-spares``, `controller.spares`): a restart's ranks start in processes
            that already imported `spare_preload`.
        spare_preload: The modules a warm spare imports while it waits.
        node_failure_budget: ``--node-failure-budget``: failures a node of a multi-node
            gang may cause; one more and it is dropped when ``--min-nnodes`` allows.
        node_failure_counts: Failures charged per node of the current incarnation
            (`controller.membership.charge_failure`); every agent of the gang keeps the
            same counts, from the same verdicts.
    """

    run_id: str
    argv: tuple[str, ...]
    world_size: int
    bootstrap: str
    prefix: str
    checkpoint_dir: str | None = None
    env: dict[str, str] = {}
    incarnation: int = 0
    ranks: tuple[RankProcess, ...] = ()
    master_port: int = 0
    launch_offsets: dict[int, int] = {}
    consumer_offsets: dict[int, int] = {}
    failure_counts: tuple[int, ...] = ()
    status: GangStatus = "running"
    grace_s: float = 10.0
    command_timeout_s: float = 120.0
    rank_failure_budget: int = 2
    min_nproc: int = 1
    log_format: str | None = None
    log_regex: str | None = None
    log_tokens_per_step: int = 0
    exit_evidence: bool = True
    topology: NodeTopology = NodeTopology()
    host: str = ""
    node_timeout_s: float = 60.0
    backend: BackendDeclaration | None = None
    relay_socket: str = ""
    warm_spares: bool = False
    spare_preload: tuple[str, ...] = DEFAULT_SPARE_PRELOAD
    node_failure_budget: int = 2
    node_failure_counts: tuple[int, ...] = ()

    @property
    def node(self) -> NodeTopology:
        """The topology of the current incarnation (one node: ``world_size`` ranks)."""
        if self.topology.nnodes == 1 and self.topology.nproc_per_node != self.world_size:
            return msgspec.structs.replace(self.topology, nproc_per_node=self.world_size)
        return self.topology

    @property
    def speaks_for_gang(self) -> bool:
        """True for node 0's agent, which announces the gang's ends and restarts."""
        return self.topology.node_rank == 0


class ProcessedCommand(msgspec.Struct, frozen=True, kw_only=True):
    """One line of ``processed.jsonl``."""

    command_id: str
    run_id: str
    incarnation: int
    ts_ns: int


class ControllerState:
    """The state directory of one run's controller.

    Args:
        root: The directory (created if missing).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        (self.root / "exit").mkdir(exist_ok=True)
        self._processed: set[str] = set(self._read_processed())

    # ------------------------------------------------------------------ gang record

    def load_gang(self) -> GangRecord | None:
        """The recorded gang, or None if none was recorded here."""
        path = self.root / GANG_FILE
        if not path.is_file():
            return None
        return msgspec.json.decode(path.read_bytes(), type=GangRecord)

    def save_gang(self, record: GangRecord) -> None:
        """Replace the gang record atomically and durably."""
        atomic_write(self.root / GANG_FILE, msgspec.json.format(msgspec.json.encode(record)))

    # ------------------------------------------------------------------ processed commands

    def _read_processed(self) -> Iterator[str]:
        path = self.root / PROCESSED_FILE
        if not path.is_file():
            return
        data = path.read_bytes()
        if data and not data.endswith(b"\n"):  # cut a torn tail so the next append is whole
            data = data[: data.rfind(b"\n") + 1]
            with path.open("r+b") as f:
                f.truncate(len(data))
                os.fsync(f.fileno())
        for line in data.splitlines():
            try:
                yield msgspec.json.decode(line, type=ProcessedCommand).command_id
            except msgspec.DecodeError:
                continue  # a torn last line: its command was never acted on

    @property
    def processed(self) -> frozenset[str]:
        """Ids of the commands executed so far."""
        return frozenset(self._processed)

    def mark_processed(self, entry: ProcessedCommand) -> None:
        """Record a command as executed; durable when this returns (call it before acting)."""
        append_durably(self.root / PROCESSED_FILE, msgspec.json.encode(entry) + b"\n")
        self._processed.add(entry.command_id)

    # ------------------------------------------------------------------ paths

    def log_path(self, incarnation: int, rank: int) -> Path:
        """Where a rank's output goes."""
        return self.root / "logs" / f"inc{incarnation}.rank{rank}.log"

    def exit_path(self, incarnation: int, rank: int) -> Path:
        """Where a rank's shell wrapper writes its exit status."""
        return self.root / "exit" / f"inc{incarnation}.rank{rank}"

    def stack_path(self, incarnation: int, rank: int) -> Path:
        """Where a rank writes its Python stacks when asked (`producers.stackdump`)."""
        return self.root / "stacks" / f"inc{incarnation}.rank{rank}.txt"


class StateLocked(RuntimeError):
    """Another live controller holds the state directory."""


def lock_state_dir(root: str | os.PathLike[str]) -> int:
    """Take the state directory's lock for the life of this process (released on exit).

    Returns:
        The lock's file descriptor (keep it open).

    Raises:
        StateLocked: Another process holds it.
    """
    import fcntl

    path = Path(root) / "lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StateLocked(f"another controller holds {root}") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def default_state_dir(run_id: str) -> Path:
    """``$RUNWATCH_HOME/controller/<run_id>`` (``~/.runwatch`` without RUNWATCH_HOME)."""
    from runwatch.common.settings import runwatch_home

    return runwatch_home() / "controller" / run_id


__all__ = [
    "GANG_FILE",
    "PROCESSED_FILE",
    "ControllerState",
    "GangRecord",
    "GangStatus",
    "ProcessedCommand",
    "RankProcess",
    "StateLocked",
    "default_state_dir",
    "lock_state_dir",
]
