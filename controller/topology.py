"""Where one node's agent stands in a multi-node gang, and the environment of its ranks.

A pure module (no Kafka, no torch, no clock): `resolve_topology` turns `runwatch launch`'s
flags and, under ``srun``, SLURM's variables into one frozen `NodeTopology`, and
`NodeTopology.launch_env` builds each local rank's `common.launch_env.LaunchEnv` from it
(the variables ``torchrun`` sets plus runwatch's): the controller's one writer of the
struct the trainer reads back with `LaunchEnv.from_environ`.

Resolution, per value: the flag when given; else, inside an ``srun`` step (``SLURM_STEP_ID``
and ``SLURM_PROCID`` set), SLURM's value; else the single-host default. The rules:

1. ``--nproc K`` (the one-host form) is ``--nnodes 1 --nproc-per-node K``; it takes nothing
   from SLURM, and combining it with the multi-node flags is an error.
2. ``nnodes``: ``--nnodes``, else ``SLURM_NNODES`` (``SLURM_JOB_NUM_NODES``), else 1.
3. ``node_rank``: ``--node-rank``, else ``SLURM_PROCID`` when the step runs one task per
   node, else ``SLURM_NODEID``; required when ``nnodes > 1``; 0 on one node.
4. ``nproc_per_node``: ``--nproc-per-node``, else ``SLURM_GPUS_ON_NODE`` (when > 0), else
   ``SLURM_NTASKS_PER_NODE``, else 1.
5. ``master_addr``: ``--master-addr``, else the first host of ``SLURM_STEP_NODELIST``
   (``SLURM_JOB_NODELIST``, ``SLURM_NODELIST``), expanded by `expand_hostlist`; required
   when ``nnodes > 1``; ``127.0.0.1`` on one node.
6. ``master_port``: ``--master-port``, else ``MASTER_PORT`` under SLURM, else
   ``20000 + SLURM_JOB_ID % 20000`` under SLURM (every node of the job computes the same),
   else 29500 with several nodes, else 0 on one node (a fresh free port per incarnation).
7. ``run_id``: ``--run-id``, else ``slurm-<SLURM_JOB_ID>[.<SLURM_STEP_ID>]`` under SLURM,
   else None (the caller names the run).
8. An ``srun`` step with more tasks than nodes is an error: the agent is one per node and
   starts the node's ranks itself (``srun --ntasks-per-node=1``).

Every incarnation rendezvouses on its own port, agreed without talking:
``master_port + incarnation % PORT_SPAN``. A node whose agent already started incarnation
I+1 therefore never joins the store of incarnation I, which a slower node's old rank 0 may
still be serving.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Literal, TypeVar

import msgspec

from runwatch.common.launch_env import ROLE_NAME, LaunchEnv

PORT_SPAN = 16
"""Incarnations cycle through this many consecutive rendezvous ports."""

SINGLE_HOST_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500
SLURM_PORT_BASE = 20000
SLURM_PORT_RANGE = 20000

Source = Literal["flags", "slurm"]


class TopologyError(ValueError):
    """The flags and the environment do not describe a valid node topology (a usage error)."""


class NodeTopology(msgspec.Struct, frozen=True, kw_only=True):
    """One node's place in the gang (persisted in the agent's gang record).

    Attributes:
        nnodes: Nodes in the gang.
        node_rank: This node's index, ``0 <= node_rank < nnodes`` (torchrun's GROUP_RANK).
        nproc_per_node: Ranks this node starts (LOCAL_WORLD_SIZE), the same on every node.
        master_addr: Host of node 0, where global rank 0 serves the rendezvous store.
        master_port: Base rendezvous port; incarnation I uses `incarnation_port`. 0: one
            node, a fresh free port per incarnation.
        min_nnodes: The gang never shrinks below this many nodes (``--min-nnodes``,
            default ``nnodes``: never shrink; `controller.membership` reads it).
        max_restarts: Restart commands the agent executes; one more fails the run. None:
            no limit (the processors' policy decides).
        role: torchrun's role of every rank (``ROLE_NAME``, ``--role``).
        source: ``slurm`` when a value came from SLURM's variables, else ``flags``.
    """

    nnodes: int = 1
    node_rank: int = 0
    nproc_per_node: int = 1
    master_addr: str = SINGLE_HOST_ADDR
    master_port: int = 0
    min_nnodes: int = 1
    max_restarts: int | None = None
    role: str = ROLE_NAME
    source: Source = "flags"

    def __post_init__(self) -> None:
        """Check the invariants (a struct that exists is a valid topology)."""
        if self.nnodes < 1:
            raise TopologyError(f"--nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise TopologyError(
                f"--node-rank must be in 0..{self.nnodes - 1} for {self.nnodes} nodes, "
                f"got {self.node_rank}"
            )
        if self.nproc_per_node < 1:
            raise TopologyError(f"--nproc-per-node must be >= 1, got {self.nproc_per_node}")
        if not 1 <= self.min_nnodes <= self.nnodes:
            raise TopologyError(
                f"--min-nnodes must be in 1..{self.nnodes} (--nnodes), got {self.min_nnodes}"
            )
        if self.max_restarts is not None and self.max_restarts < 0:
            raise TopologyError(f"--max-restarts must be >= 0, got {self.max_restarts}")
        if not self.master_addr:
            raise TopologyError("--master-addr must not be empty")
        if not self.role:
            raise TopologyError("--role must not be empty")
        if self.master_port == 0:
            if self.nnodes > 1:
                raise TopologyError("several nodes need a fixed --master-port (not 0)")
        elif not 1 <= self.master_port <= 65535 - PORT_SPAN + 1:
            raise TopologyError(
                f"--master-port must be in 1..{65535 - PORT_SPAN + 1} (incarnations use "
                f"{PORT_SPAN} consecutive ports), got {self.master_port}"
            )

    @property
    def world_size(self) -> int:
        """Ranks in the whole gang."""
        return self.nnodes * self.nproc_per_node

    @property
    def local_ranks(self) -> range:
        """This node's local ranks."""
        return range(self.nproc_per_node)

    def global_rank(self, local_rank: int) -> int:
        """The global rank of one of this node's ranks (node-major, as torchrun)."""
        if local_rank not in self.local_ranks:
            raise ValueError(f"local rank {local_rank} not in 0..{self.nproc_per_node - 1}")
        return self.node_rank * self.nproc_per_node + local_rank

    @property
    def global_ranks(self) -> range:
        """The global ranks this node starts."""
        first = self.node_rank * self.nproc_per_node
        return range(first, first + self.nproc_per_node)

    def incarnation_port(self, incarnation: int) -> int | None:
        """The rendezvous port of ``incarnation``; None: pick a free one (one node only)."""
        if self.master_port == 0:
            return None
        return self.master_port + incarnation % PORT_SPAN

    def launch_env(
        self,
        local_rank: int,
        *,
        incarnation: int,
        master_port: int,
        run: RunBinding,
        restart_from: int | None = None,
        stack_file: str | None = None,
        error_file: str | None = None,
        done_file: str | None = None,
    ) -> LaunchEnv:
        """The launch environment of one local rank (`common.launch_env.LaunchEnv`).

        Its `LaunchEnv.to_environ` is torchrun's contract (``RANK``, ``LOCAL_RANK``,
        ``GROUP_RANK``, ``GROUP_WORLD_SIZE``, ``ROLE_*``, ``LOCAL_WORLD_SIZE``,
        ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_*``) plus
        runwatch's (``RUNWATCH_*``).

        Args:
            local_rank: The rank's index on this node.
            incarnation: The gang's incarnation (0 first, +1 per restart).
            master_port: The incarnation's rendezvous port (`incarnation_port`, or the
                free port picked for it on one node).
            run: The run the rank belongs to.
            restart_from: Checkpoint step to resume from (0: none, start over); None on a
                first launch.
            stack_file: Where the rank dumps its stacks when its agent asks
                (`controller.stacks`); None: not asked for.
            error_file: Where the rank's ``@record`` entry point writes the exception
                that ended it (``TORCHELASTIC_ERROR_FILE``); None: not given.
            done_file: Where the rank says its training finished
                (``RUNWATCH_DONE_FILE``); None: not given.

        Returns:
            The struct the rank is started with.
        """
        return LaunchEnv(
            rank=self.global_rank(local_rank),
            world_size=self.world_size,
            local_rank=local_rank,
            local_world_size=self.nproc_per_node,
            group_rank=self.node_rank,
            group_world_size=self.nnodes,
            role_name=self.role,
            master_addr=self.master_addr,
            master_port=master_port,
            max_restarts=self.max_restarts,
            run_id=run.run_id,
            bootstrap=run.bootstrap,
            prefix=run.prefix,
            incarnation=incarnation,
            checkpoint_dir=run.checkpoint_dir,
            restart_from=restart_from,
            stack_file=stack_file,
            error_file=error_file,
            done_file=done_file,
            relay_socket=run.relay_socket,
            launch_id=run.launch_id or None,
        )


class RunBinding(msgspec.Struct, frozen=True, kw_only=True):
    """The run a gang's ranks report to (runwatch's part of the launch contract).

    Attributes:
        run_id: The run.
        bootstrap: Kafka bootstrap address.
        prefix: Topic name prefix.
        checkpoint_dir: The checkpoint root shared by all nodes; None: unknown.
        relay_socket: This node's relay (``runwatch launch --relay``); None: the ranks
            talk to Kafka themselves.
        launch_id: This launch's id (random per ``runwatch launch``, or ``--launch-id``
            shared by every node's agent): the ranks' RunStarted carries it and the command
            gate executes only commands bound to it. Empty: a gang recorded before launch
            ids, or a multi-node launch given none; its commands are not bound.
    """

    run_id: str
    bootstrap: str
    prefix: str
    checkpoint_dir: str | None = None
    relay_socket: str | None = None
    launch_id: str = ""


# --------------------------------------------------------------------------- SLURM hostlists

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise TopologyError(f"nested brackets in hostlist {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise TopologyError(f"unbalanced ']' in hostlist {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise TopologyError(f"unbalanced '[' in hostlist {text!r}")
    parts.append(text[start:])
    return parts


def _expand_ranges(body: str, whole: str) -> list[str]:
    out = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise TopologyError(f"bad range {item!r} in hostlist {whole!r}")
        low, high = m.group(1), m.group(2) or m.group(1)
        if int(high) < int(low):
            raise TopologyError(f"descending range {item!r} in hostlist {whole!r}")
        width = len(low) if low.startswith("0") else 0
        out += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return out


def _expand_host(pattern: str, whole: str) -> list[str]:
    """One comma-free pattern, e.g. ``rack[1-2]-n[01-02]`` (brackets multiply)."""
    hosts = [""]
    rest = pattern
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            hosts = [h + rest for h in hosts]
            break
        close_at = rest.index("]", open_at)
        prefix, body, rest = rest[:open_at], rest[open_at + 1 : close_at], rest[close_at + 1 :]
        hosts = [h + prefix + n for h in hosts for n in _expand_ranges(body, whole)]
    return hosts


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a SLURM hostlist expression, in order.

    ``node[01-04,07],gpu5`` is ``node01 node02 node03 node04 node07 gpu5``: comma-separated
    patterns; inside brackets, comma-separated numbers or ``low-high`` ranges, zero-padded
    to the width of ``low`` when it has a leading zero; several brackets in one pattern
    multiply (``r[1-2]n[1-2]``: ``r1n1 r1n2 r2n1 r2n2``).

    Args:
        hostlist: The expression (e.g. ``SLURM_JOB_NODELIST``).

    Returns:
        The host names.

    Raises:
        TopologyError: The expression is malformed or empty.
    """
    text = hostlist.strip()
    if not text:
        raise TopologyError("empty hostlist")
    hosts: list[str] = []
    for part in _split_top(text):
        part = part.strip()
        if not part:
            raise TopologyError(f"empty entry in hostlist {hostlist!r}")
        hosts += _expand_host(part, hostlist)
    return hosts


# --------------------------------------------------------------------------- resolution

NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")


def in_srun_step(environ: Mapping[str, str]) -> bool:
    """True inside an ``srun`` step (not an ``salloc`` shell or the batch script itself)."""
    step = environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID"))
    return bool(step) and "SLURM_PROCID" in environ and "SLURM_JOB_ID" in environ


def _int(environ: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        raw = environ.get(name, "").strip()
        if not raw:
            continue
        m = re.match(r"^(\d+)", raw)  # SLURM_TASKS_PER_NODE-like "2(x3)" reads as 2
        if m is None:
            raise TopologyError(f"{name}={raw!r} is not a number")
        return int(m.group(1))
    return None


class SlurmStep(msgspec.Struct, frozen=True, kw_only=True):
    """What SLURM says about this task of an ``srun`` step (None: not set).

    Attributes:
        job_id: ``SLURM_JOB_ID``.
        step_id: ``SLURM_STEP_ID``.
        nnodes: ``SLURM_NNODES``.
        ntasks: ``SLURM_NTASKS`` (``SLURM_NPROCS``).
        procid: ``SLURM_PROCID``.
        nodeid: ``SLURM_NODEID``.
        gpus_on_node: ``SLURM_GPUS_ON_NODE``.
        ntasks_per_node: ``SLURM_NTASKS_PER_NODE``.
        first_host: The first host of the step's (or job's) node list.
        master_port: ``MASTER_PORT`` when the job script exported one.
    """

    job_id: str
    step_id: str | None = None
    nnodes: int | None = None
    ntasks: int | None = None
    procid: int | None = None
    nodeid: int | None = None
    gpus_on_node: int | None = None
    ntasks_per_node: int | None = None
    first_host: str | None = None
    master_port: int | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> SlurmStep | None:
        """The step, or None outside an ``srun`` step.

        Raises:
            TopologyError: A variable is malformed.
        """
        if not in_srun_step(environ):
            return None
        nodelist = next((environ[v] for v in NODELIST_VARS if environ.get(v)), None)
        return cls(
            job_id=environ["SLURM_JOB_ID"],
            step_id=environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID")),
            nnodes=_int(environ, "SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
            ntasks=_int(environ, "SLURM_NTASKS", "SLURM_NPROCS"),
            procid=_int(environ, "SLURM_PROCID"),
            nodeid=_int(environ, "SLURM_NODEID"),
            gpus_on_node=_int(environ, "SLURM_GPUS_ON_NODE"),
            ntasks_per_node=_int(environ, "SLURM_NTASKS_PER_NODE"),
            first_host=expand_hostlist(nodelist)[0] if nodelist else None,
            master_port=_int(environ, "MASTER_PORT"),
        )

    @property
    def one_task_per_node(self) -> bool:
        """True when the step runs one task per node (or does not say)."""
        return self.ntasks is None or self.nnodes is None or self.ntasks == self.nnodes

    @property
    def node_rank(self) -> int | None:
        """``SLURM_PROCID`` with one task per node, else ``SLURM_NODEID``."""
        if self.one_task_per_node and self.procid is not None:
            return self.procid
        return self.nodeid

    @property
    def run_id(self) -> str:
        """``slurm-<job>`` (``.<step>`` appended when the step id is a number)."""
        step = f".{self.step_id}" if self.step_id and self.step_id.isdigit() else ""
        return f"slurm-{self.job_id}{step}"

    @property
    def port(self) -> int:
        """``MASTER_PORT`` if exported, else a port derived from the job id."""
        if self.master_port:
            return self.master_port
        digits = re.sub(r"\D", "", self.job_id) or "0"
        return SLURM_PORT_BASE + int(digits) % SLURM_PORT_RANGE


T = TypeVar("T")


class _Picker:
    """The flag's value, else SLURM's; remembers whether SLURM supplied any."""

    def __init__(self, slurm: SlurmStep | None) -> None:
        self.slurm = slurm
        self.used = False

    def value(self, flag: T | None, read: Callable[[SlurmStep], T | None]) -> T | None:
        if flag is not None or self.slurm is None:
            return flag
        found = read(self.slurm)
        self.used = self.used or found is not None
        return found


class Resolved(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of `resolve_topology`.

    Attributes:
        topology: This node's topology.
        run_id: The run id the flags or SLURM give; None: the caller names the run.
    """

    topology: NodeTopology
    run_id: str | None = None


def resolve_topology(
    environ: Mapping[str, str],
    *,
    nproc: int | None = None,
    nnodes: int | None = None,
    node_rank: int | None = None,
    nproc_per_node: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    min_nnodes: int | None = None,
    max_restarts: int | None = None,
    run_id: str | None = None,
    role: str = ROLE_NAME,
) -> Resolved:
    """This node's topology from `runwatch launch`'s flags and SLURM's variables.

    Args:
        environ: The agent's environment (SLURM's variables are read from it).
        nproc: ``--nproc``: one host, this many ranks.
        nnodes: ``--nnodes``.
        node_rank: ``--node-rank``.
        nproc_per_node: ``--nproc-per-node``.
        master_addr: ``--master-addr``.
        master_port: ``--master-port``.
        min_nnodes: ``--min-nnodes`` (default: ``nnodes``, no shrinking).
        max_restarts: ``--max-restarts``.
        run_id: ``--run-id``.
        role: ``--role`` (torchrun's ``ROLE_NAME``).

    Returns:
        The topology and the run id.

    Raises:
        TopologyError: One line saying what is wrong (see the module doc's rules).
    """
    multi = {
        "--nnodes": nnodes,
        "--node-rank": node_rank,
        "--nproc-per-node": nproc_per_node,
        "--master-addr": master_addr,
        "--min-nnodes": min_nnodes,
    }
    if nproc is not None:  # rule 1
        if nproc < 1:
            raise TopologyError(f"--nproc must be >= 1, got {nproc}")
        given = [flag for flag, value in multi.items() if value is not None]
        if given:
            raise TopologyError(
                f"--nproc is the one-host form: use --nproc-per-node with {', '.join(given)}"
            )
        return Resolved(
            topology=NodeTopology(
                nproc_per_node=nproc,
                master_port=master_port or 0,
                max_restarts=max_restarts,
                role=role,
            ),
            run_id=run_id,
        )
    slurm = SlurmStep.from_environ(environ)
    if slurm is not None and not slurm.one_task_per_node:  # rule 8
        raise TopologyError(
            f"srun started {slurm.ntasks} tasks on {slurm.nnodes} nodes: runwatch launch is "
            f"one agent per node and starts the node's ranks itself (srun --ntasks-per-node=1)"
        )
    pick = _Picker(slurm)
    found_n = pick.value(nnodes, lambda s: s.nnodes)  # rule 2
    n = 1 if found_n is None else found_n
    rank = pick.value(node_rank, lambda s: s.node_rank)  # rule 3
    if rank is None:
        if n > 1:
            raise TopologyError(f"--nnodes {n} needs --node-rank (this node's index, 0..{n - 1})")
        rank = 0
    per_node = pick.value(nproc_per_node, lambda s: s.gpus_on_node or s.ntasks_per_node)  # 4
    addr = pick.value(master_addr, lambda s: s.first_host)  # rule 5
    if addr is None:
        if n > 1:
            raise TopologyError(f"--nnodes {n} needs --master-addr (the host of node 0)")
        addr = SINGLE_HOST_ADDR
    port = master_port
    if port is None and slurm is not None and (pick.used or n > 1):  # rule 6
        port = slurm.port
    if port is None:
        port = DEFAULT_MASTER_PORT if n > 1 else 0
    if run_id is None and slurm is not None and pick.used:  # rule 7
        run_id = slurm.run_id
    topology = NodeTopology(
        nnodes=n,
        node_rank=rank,
        nproc_per_node=1 if per_node is None else per_node,
        master_addr=addr,
        master_port=port,
        min_nnodes=n if min_nnodes is None else min_nnodes,
        max_restarts=max_restarts,
        role=role,
        source="slurm" if pick.used else "flags",
    )
    return Resolved(topology=topology, run_id=run_id)


__all__ = [
    "PORT_SPAN",
    "NodeTopology",
    "Resolved",
    "RunBinding",
    "SlurmStep",
    "TopologyError",
    "expand_hostlist",
    "in_srun_step",
    "resolve_topology",
]
