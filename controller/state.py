"""What a controller persists so that a restarted controller neither forgets nor repeats.

One state directory per run (default ``$RUNWATCH_HOME/controller/<run_id>``)::

    gang.json        what was asked (`LaunchSpec`: argv, sizes, budgets) and what happened
                     (`GangRecord`: incarnation, rank pids, ports, counts, offsets)
    processed.jsonl  one line per executed command id, appended and fsynced before acting
    logs/            inc<I>.rank<R>.log: each rank's stdout and stderr
    exit/            inc<I>.rank<R>: each rank's exit status, written by its shell wrapper
    errors/          inc<I>.rank<R>.json: the exception a rank's ``@record`` entry point
                     handed over (torchrun's ``TORCHELASTIC_ERROR_FILE``), when it wrote one

``gang.json`` (`GangFile`, version 2; a version 1 file, one flat record, is converted on
read) is replaced atomically (write a temporary file, fsync, rename, fsync the
directory), so a crash leaves the old record or the new one, never half of one. A torn last
line of ``processed.jsonl`` (a crash mid-append, before the fsync returned, so before the
command was acted on) is skipped on load.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final, Literal

import msgspec

from runwatch.common.durable import append_durably, atomic_write
from runwatch.common.errors import RunwatchError
from runwatch.controller.topology import NodeTopology, RunBinding
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


class LogWatchSpec(msgspec.Struct, frozen=True, kw_only=True):
    """``runwatch launch --log-format``: the controller speaks for a script that only prints.

    Attributes:
        format: The line format (`producers.logtail.FORMATS`).
        regex: The pattern for ``format="regex"``; None otherwise.
        tokens_per_step: Tokens per step for step lines that do not say (0: unknown).
    """

    format: str
    regex: str | None = None
    tokens_per_step: int = 0


class WarmSparesSpec(msgspec.Struct, frozen=True, kw_only=True):
    """``runwatch launch --warm-spares``: a preloaded process per local rank slot.

    Attributes:
        preload: The modules a warm spare imports while it waits.
    """

    preload: tuple[str, ...] = DEFAULT_SPARE_PRELOAD


class FaultToleranceSpec(msgspec.Struct, frozen=True, kw_only=True):
    """``runwatch launch --fault-tolerance torchft``: the node's ranks as replica groups.

    Attributes:
        replica_groups: Groups (``--replica-groups``).
        nproc_per_group: Ranks per group (``--nproc-per-group``).
        min_replicas: Fewest groups a step may commit with (``--min-replicas``).
        backend: The training backend the launch names (its registered capabilities
            stand in until the run's RunStarted declares its own).
        min_replicas_bound_s: ``--min-replicas-bound-s``: None: torchft's quorum needs
            ``min_replicas`` groups (fewer cannot step). Given: the quorum needs one
            group, and steps below ``min_replicas`` for longer than this (log time)
            restart the gang (``replicas_below_min``).
    """

    replica_groups: int
    nproc_per_group: int = 1
    min_replicas: int = 1
    backend: str = "torchft-ddp"
    min_replicas_bound_s: float | None = None

    @property
    def quorum_floor(self) -> int:
        """The fewest groups torchft's quorum needs (its Lighthouse, its Manager)."""
        return self.min_replicas if self.min_replicas_bound_s is None else 1


class LaunchSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What was asked: how one node's agent launches and supervises its run's gang.

    Written when the gang is launched and never changed by the controller; what happened
    since is the `GangRecord`.

    Attributes:
        run: The run the ranks report to: run id, Kafka, topic prefix, checkpoint root,
            and this agent's relay socket (``runwatch launch --relay``, `controller.relay`;
            None without a relay).
        argv: The command each rank runs.
        env: Extra environment every rank gets (besides the launch contract).
        topology: This agent's node in the gang as launched (`controller.topology`); one
            node by default. The current incarnation's is `GangRecord.topology`.
        host: The agent's host name, where the ranks run ("" in records of older
            versions); an adopting controller skips records of other hosts (a shared file
            system shows every node's state directories).
        launch_offsets: Commands-topic partition -> end offset when the run was launched.
        grace_s: SIGTERM grace before SIGKILL.
        command_timeout_s: How long a dead gang waits for a command.
        teardown_timeout_s: How long ranks may run on after every local rank said its
            training finished before the agent stops them (``--teardown-timeout``,
            `controller.teardown`); None: never (the agent warns every minute).
        rank_failure_budget: Failures a rank may cause before a one-node gang shrinks.
        min_nproc: A one-node gang never shrinks below this.
        node_timeout_s: How long an agent of a multi-node gang waits, on a restart, for
            the other nodes' agents to announce themselves (``--node-timeout``); a node
            not heard from by then is lost (`controller.membership`).
        node_failure_budget: ``--node-failure-budget``: failures a node of a multi-node
            gang may cause; one more and it is dropped when ``--min-nnodes`` allows.
        exit_evidence: Publish every rank exit as a RankExited (``runwatch launch
            --no-exit-evidence`` turns it off: dead ranks are then learned from silence).
        log_watch: The controller turns rank 0's output into the run's events
            (`controller.logwatch`); None: the script emits them.
        warm_spares: Keep a warm spare per local rank slot (`controller.spares`): a
            restart's ranks start in processes that already imported its ``preload``;
            None: every rank starts cold.
        fault_tolerance: The ranks are torchft replica groups, restarted group by group
            (`controller.torchft_launcher`, `controller.group_plan`); None: one gang.
    """

    run: RunBinding
    argv: tuple[str, ...]
    env: dict[str, str] = {}
    topology: NodeTopology = NodeTopology()
    host: str = ""
    launch_offsets: dict[int, int] = {}
    grace_s: float = 10.0
    command_timeout_s: float = 120.0
    teardown_timeout_s: float | None = None
    rank_failure_budget: int = 2
    min_nproc: int = 1
    node_timeout_s: float = 60.0
    node_failure_budget: int = 2
    exit_evidence: bool = True
    log_watch: LogWatchSpec | None = None
    warm_spares: WarmSparesSpec | None = None
    fault_tolerance: FaultToleranceSpec | None = None

    @property
    def run_id(self) -> str:
        """The run."""
        return self.run.run_id

    def first_record(self, incarnation: int = 0) -> GangRecord:
        """The record of a gang about to be launched: ``incarnation``, nothing started yet."""
        return GangRecord(incarnation=incarnation, topology=self.topology)


class GangRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What happened: the gang's incarnation, processes, counts and offsets.

    Replaced (and persisted) on every change; what was asked is the `LaunchSpec`.

    Attributes:
        incarnation: The current incarnation (0 first, +1 per restart).
        topology: This agent's node in the current incarnation. On one node the gang is
            ranks ``0..nproc_per_node-1`` (fewer than launched once it shrank by ranks);
            on several, this agent's ranks are ``topology.global_ranks`` (its node rank
            and the node count change when the gang shrinks by nodes).
        ranks: The current incarnation's processes on this node.
        master_port: The current incarnation's rendezvous port.
        failure_counts: Failures caused per rank index (one node's elastic budget).
        node_failure_counts: Failures charged per node of the current incarnation
            (`controller.membership.charge_failure`); every agent of the gang keeps the
            same counts, from the same verdicts.
        consumer_offsets: Commands-topic partition -> offset of the last command this
            controller acted on (re-read after a restart; the processed ids make that safe).
        backend: What the run's training backend declared in its latest RunStarted, as
            last seen by this agent; None: nothing seen yet (the gang is never shrunk).
        status: ``running``, or how the run ended (on this node).
    """

    incarnation: int = 0
    topology: NodeTopology = NodeTopology()
    ranks: tuple[RankProcess, ...] = ()
    master_port: int = 0
    failure_counts: tuple[int, ...] = ()
    node_failure_counts: tuple[int, ...] = ()
    consumer_offsets: dict[int, int] = {}
    backend: BackendDeclaration | None = None
    status: GangStatus = "running"

    @property
    def world_size(self) -> int:
        """Ranks of the current incarnation, on every node."""
        return self.topology.world_size

    @property
    def speaks_for_gang(self) -> bool:
        """True for node 0's agent, which announces the gang's ends and restarts."""
        return self.topology.node_rank == 0


GANG_FILE_VERSION = 2
"""The version of ``gang.json`` this code writes (1: one flat record, before the split)."""


class GangFile(msgspec.Struct, frozen=True, kw_only=True):
    """The content of ``gang.json``: what was asked and what happened, in one atomic file.

    Attributes:
        version: `GANG_FILE_VERSION`.
        spec: What was asked.
        record: What happened.
    """

    spec: LaunchSpec
    record: GangRecord
    version: int = GANG_FILE_VERSION


class StateFormatError(RunwatchError):
    """A state file this version of runwatch cannot read (one line: which file and why)."""


class _Versioned(msgspec.Struct):
    """Just the version of a ``gang.json`` (version 1 files have no such field)."""

    version: int = 1


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
        # Private (issue 19, finding 12): rank logs, stacks and torch's error files may
        # hold secrets; 0700 directories, 0600 files (`PRIVATE_FILE`).
        for path in (
            self.root,
            self.root / "logs",
            self.root / "exit",
            self.root / "errors",
            self.root / "done",
        ):
            make_private_dir(path)  # errors/, done/: the ranks write there, creating nothing
        self._processed: set[str] = set(self._read_processed())

    # ------------------------------------------------------------------ gang record

    def load_gang(self) -> GangFile | None:
        """The recorded gang, or None if none was recorded here (see `read_gang_file`).

        Raises:
            StateFormatError: The file is not a gang file this version can read.
        """
        return read_gang_file(self.root / GANG_FILE)

    def save_gang(self, gang: GangFile) -> None:
        """Replace the gang file atomically and durably."""
        atomic_write(
            self.root / GANG_FILE,
            msgspec.json.format(msgspec.json.encode(gang)),
            mode=PRIVATE_FILE,
        )

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
        append_durably(
            self.root / PROCESSED_FILE, msgspec.json.encode(entry) + b"\n", mode=PRIVATE_FILE
        )
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

    def error_path(self, incarnation: int, rank: int) -> Path:
        """Where a rank's ``@record`` entry point writes its exception (`controller.error_file`)."""
        return self.root / "errors" / f"inc{incarnation}.rank{rank}.json"

    def done_path(self, incarnation: int, rank: int) -> Path:
        """Where a rank says its training finished (`producers.rank_done`)."""
        return self.root / "done" / f"inc{incarnation}.rank{rank}.json"


def read_gang_file(path: Path) -> GangFile | None:
    """Read a ``gang.json`` (a read only: nothing in the directory is touched).

    A version 1 file (one flat record, written before the split into spec and record) is
    converted (`controller.record_v1`); the next save writes it as version 2.

    Args:
        path: The file.

    Returns:
        Its content, or None if there is no such file.

    Raises:
        StateFormatError: The file is not a gang file this version can read.
    """
    if not path.is_file():
        return None
    data = path.read_bytes()
    try:
        version = msgspec.json.decode(data, type=_Versioned).version
        if version == 1:
            from runwatch.controller.record_v1 import GangRecordV1

            return msgspec.json.decode(data, type=GangRecordV1).upgrade()
        if version == GANG_FILE_VERSION:
            return msgspec.json.decode(data, type=GangFile)
    except msgspec.DecodeError as exc:  # ValidationError included
        raise StateFormatError(f"{path}: not a gang record ({exc})") from None
    raise StateFormatError(
        f"{path}: gang file version {version}; this runwatch reads versions 1 and "
        f"{GANG_FILE_VERSION} (was it written by a newer one?)"
    )


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
    make_private_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StateLocked(f"another controller holds {root}") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


PRIVATE_DIR: Final = 0o700
PRIVATE_FILE: Final = 0o600
"""Modes of the state directories and of the files the controller writes in them."""


def make_private_dir(path: Path) -> Path:
    """Create ``path`` (and its parents) if missing and make it this user's only (0700)."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    os.chmod(path, PRIVATE_DIR)
    return path


def default_state_dir(run_id: str) -> Path:
    """``$RUNWATCH_HOME/controller/<run_id>`` (``~/.runwatch`` without RUNWATCH_HOME)."""
    from runwatch.common.settings import runwatch_home

    return runwatch_home() / "controller" / run_id


__all__ = [
    "DEFAULT_SPARE_PRELOAD",
    "GANG_FILE",
    "GANG_FILE_VERSION",
    "PRIVATE_DIR",
    "PRIVATE_FILE",
    "PROCESSED_FILE",
    "ControllerState",
    "FaultToleranceSpec",
    "GangFile",
    "GangRecord",
    "GangStatus",
    "LaunchSpec",
    "LogWatchSpec",
    "ProcessedCommand",
    "RankProcess",
    "StateFormatError",
    "StateLocked",
    "WarmSparesSpec",
    "default_state_dir",
    "lock_state_dir",
    "make_private_dir",
    "read_gang_file",
]
