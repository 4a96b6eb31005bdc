"""A `controller.launcher.Launcher` of torchft replica groups on one node.

``runwatch launch --fault-tolerance torchft --replica-groups N --nproc-per-group K``: the
run's N x K ranks are N replica groups of K ranks; on one host this agent starts them all,
on ``--nnodes M`` each node's agent starts its N / M of them (node I: groups
I x N/M .. (I+1) x N/M - 1, `ReplicaLayout.local`) and supervises those alone. Each group
is its own torchrun-style gang (``RANK`` 0..K-1 inside the group, ``WORLD_SIZE`` K, its
own rendezvous port on this host) started with
torchft's variables (``REPLICA_GROUP_ID``, ``NUM_REPLICA_GROUPS``, ``TORCHFT_LIGHTHOUSE``)
and runwatch's (``RUNWATCH_MIN_REPLICAS``, ``RUNWATCH_FT_START_BARRIER``,
``RUNWATCH_FT_GROUP_RESTARTS``). Global rank ``g x K + r`` names rank r of group g in the
gang record, the logs and the exit evidence. The groups meet per step in the quorum of a
Lighthouse: one this launcher started (one host, or node 0 of several, on the port
`lighthouse_port` names), or node 0's, joined there (`controller.torchft_compat`).

A `controller.launcher.Scope` naming groups stops and starts those groups only: the
others keep their processes (the same pids) and keep stepping; a restarted group heals
from a live peer (torchft), so it gets no ``RUNWATCH_RESTART_FROM``. A whole-node scope is
a gang restart (a rollback from DCP: every group of the node gets
``RUNWATCH_RESTART_FROM``). `Started.ranks` always lists every group's processes of this
node, so the supervisor's gang record holds the node's ranks whatever the scope.

With ``--warm-spares`` the launcher keeps one group's worth of spares (K interpreters with
torch, torchft and the script's own imports done: `controller.spares`), refilled 3 s
after each start; a restarted group's ranks start in them, so the group joins the quorum
and heals without importing torch again. A whole-node start takes them too, as far as they
go (the rest start cold).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from runwatch.common.durable import atomic_write
from runwatch.controller.gang import Gang, free_port, node_environ, rank_environ
from runwatch.controller.launcher import (
    HOST,
    STACK_TIMEOUT_S,
    WHOLE_NODE,
    Incarnation,
    RankStatus,
    Scope,
    Started,
)
from runwatch.controller.spares import NoSpares, SparePool, Spares, split_python
from runwatch.controller.stacks import capture
from runwatch.controller.state import ControllerState, GangRecord, LaunchSpec, RankProcess
from runwatch.controller.topology import PORT_SPAN, NodeTopology
from runwatch.controller.torchft_compat import (
    JoinedLighthouse,
    LighthouseProcess,
    LighthouseSettings,
    join_lighthouse,
    start_lighthouse,
)
from runwatch.producers.settings import (
    ENV_GROUP_RESTARTS,
    ENV_LIGHTHOUSE,
    ENV_MIN_REPLICAS,
    ENV_NUM_REPLICA_GROUPS,
    ENV_REPLICA_FLOOR,
    ENV_REPLICA_FLOOR_BOUND_S,
    ENV_REPLICA_GROUP_ID,
    ENV_START_BARRIER,
)
from runwatch.schemas.events import RankStack

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplicaLayout:
    """How this node's ranks form replica groups.

    Attributes:
        groups: Replica groups (``--replica-groups``).
        nproc_per_group: Ranks per group (``--nproc-per-group``).
        min_replicas: Fewest groups a step may commit with (``--min-replicas``).
        bound_s: ``--min-replicas-bound-s``: None: torchft's quorum needs ``min_replicas``
            groups. Given: it needs one, and the ranks announce ``min_replicas`` and this
            bound as the run's floor (`producers.torchft_backend.floor_thresholds`).
        nodes: Nodes the groups are spread over (``--nnodes``), as many groups on each.
        node: This node (``--node-rank``).
    """

    groups: int
    nproc_per_group: int = 1
    min_replicas: int = 1
    bound_s: float | None = None
    nodes: int = 1
    node: int = 0

    @property
    def quorum_floor(self) -> int:
        """The fewest groups torchft's quorum needs (its Lighthouse, its Manager)."""
        return self.min_replicas if self.bound_s is None else 1

    def __post_init__(self) -> None:
        """A layout that exists is valid."""
        if self.groups < 1 or self.nproc_per_group < 1:
            raise ValueError("--replica-groups and --nproc-per-group must be >= 1")
        if not 1 <= self.min_replicas <= self.groups:
            raise ValueError(
                f"--min-replicas must be in 1..{self.groups} (--replica-groups), "
                f"got {self.min_replicas}"
            )
        if self.nodes < 1 or self.groups % self.nodes or not 0 <= self.node < self.nodes:
            raise ValueError(
                f"--replica-groups {self.groups} must be a multiple of --nnodes {self.nodes} "
                f"(as many groups on every node), node {self.node} in 0..{self.nodes - 1}"
            )

    @property
    def local(self) -> range:
        """The groups this node's agent starts and supervises."""
        per_node = self.groups // self.nodes
        return range(self.node * per_node, (self.node + 1) * per_node)

    def group_of(self, rank: int) -> int:
        """The replica group of global ``rank``."""
        return rank // self.nproc_per_group

    def ranks_of(self, group: int) -> range:
        """The global ranks of ``group``."""
        return range(group * self.nproc_per_group, (group + 1) * self.nproc_per_group)

    def groups_in(self, scope: Scope) -> tuple[int, ...]:
        """The groups ``scope`` names (this node's groups for a whole-node scope).

        Raises:
            ValueError: A group that does not exist, or another node's.
        """
        local = self.local
        if scope.groups is None:
            return tuple(local)
        bad = [g for g in scope.groups if g not in local]
        if bad:
            raise ValueError(
                f"no replica group {bad} on node {self.node} "
                f"(groups {local.start}..{local.stop - 1})"
            )
        return tuple(sorted(set(scope.groups)))


def lighthouse_port(topology: NodeTopology) -> int:
    """Where node 0's Lighthouse listens in a run of several nodes (the barrier: the next port).

    The two ports after the incarnations' rendezvous ports (``--master-port`` ..
    ``--master-port + 15``): every agent computes them without talking. 0 on one host
    (free ports).
    """
    return topology.master_port + PORT_SPAN if topology.nnodes > 1 else 0


LIGHTHOUSE_FILE = "lighthouse.json"
"""Where an agent records its Lighthouse process (pid, addresses) in its state directory."""


def _running_lighthouse(path: Path) -> LighthouseProcess | None:
    """The Lighthouse ``path`` records, if its process still runs."""
    try:
        found = msgspec.json.decode(path.read_bytes(), type=LighthouseProcess)
    except (OSError, msgspec.DecodeError):
        return None
    try:
        os.kill(found.pid, 0)
    except OSError:
        return None
    return found


class TorchFTLauncher:
    """Replica groups on one host, each started, watched and stopped on its own (module doc).

    Args:
        state: The run's state directory (logs, exit files, stack and error files).
        spec: What was asked (command, extra environment, the run).
        layout: The replica groups.
        lighthouse: The Lighthouse the groups meet in (closed with the launcher: node 0's
            own stops, another node's joined one is left alone).
        environ: The agent's environment, under each rank's (default ``os.environ``).
        host: This agent's host, in the stacks it reports.
        spares: Where a group's ranks may start warm (default `controller.spares.NoSpares`:
            every rank starts cold).
    """

    def __init__(
        self,
        state: ControllerState,
        spec: LaunchSpec,
        layout: ReplicaLayout,
        lighthouse: LighthouseProcess | JoinedLighthouse,
        *,
        environ: Mapping[str, str] | None = None,
        host: str = HOST,
        spares: Spares | None = None,
    ) -> None:
        self.state = state
        self.spec = spec
        self.layout = layout
        self.lighthouse = lighthouse
        self.environ = os.environ if environ is None else environ
        self.host = host
        self.spares: Spares = NoSpares() if spares is None else spares
        self.incarnation = 0
        self.gangs: dict[int, Gang] = {}
        self.restarts: dict[int, int] = {}
        self.ports: dict[int, int] = {}

    @classmethod
    def for_run(
        cls, state: ControllerState, spec: LaunchSpec, record: GangRecord
    ) -> TorchFTLauncher:
        """The launcher of ``spec``'s replica groups, watching the ranks ``record`` holds.

        The Lighthouse is the one this state directory's agent started when it is still
        running (an adopting controller: the groups are meeting in it), else a new one;
        where it is goes in ``<state>/lighthouse.json``. On a node other than node 0 of
        several, it is node 0's, joined at ``--master-addr`` (`lighthouse_port`), waiting
        up to ``--node-timeout`` for node 0's agent to start it.
        """
        ft = spec.fault_tolerance
        if ft is None:
            raise ValueError(f"run {spec.run_id} was not launched with --fault-tolerance")
        topology = record.topology
        layout = ReplicaLayout(
            ft.replica_groups,
            ft.nproc_per_group,
            ft.min_replicas,
            ft.min_replicas_bound_s,
            nodes=topology.nnodes,
            node=topology.node_rank,
        )
        port = lighthouse_port(topology)
        lighthouse: LighthouseProcess | JoinedLighthouse
        if topology.node_rank > 0:
            lighthouse = join_lighthouse(topology.master_addr, port, spec.node_timeout_s)
        else:
            path = state.root / LIGHTHOUSE_FILE
            found = _running_lighthouse(path)
            if found is None:
                settings = LighthouseSettings(layout.quorum_floor, ft.replica_groups, port=port)
                found = start_lighthouse(settings)
                atomic_write(path, msgspec.json.encode(found))
            lighthouse = found
        log.info(
            "run %s: torchft Lighthouse %s (%s), %d replica groups of %d (node %d: %s), min %d",
            spec.run_id,
            lighthouse.address,
            f"pid {lighthouse.pid}" if isinstance(lighthouse, LighthouseProcess) else "node 0's",
            layout.groups,
            layout.nproc_per_group,
            layout.node,
            list(layout.local),
            layout.min_replicas,
        )
        launcher = cls(state, spec, layout, lighthouse, spares=group_spares(state, spec, layout))
        launcher.adopt(record.incarnation, record.ranks)
        return launcher

    def _group_env(self, group: int) -> dict[str, str]:
        layout = self.layout
        return {
            **self.spec.env,
            ENV_REPLICA_GROUP_ID: str(group),
            ENV_NUM_REPLICA_GROUPS: str(layout.groups),
            ENV_LIGHTHOUSE: self.lighthouse.address,
            ENV_START_BARRIER: self.lighthouse.barrier,
            ENV_GROUP_RESTARTS: str(self.restarts.get(group, 0)),
            ENV_MIN_REPLICAS: str(layout.quorum_floor),
            **(
                {
                    ENV_REPLICA_FLOOR: str(layout.min_replicas),
                    ENV_REPLICA_FLOOR_BOUND_S: f"{layout.bound_s:g}",
                }
                if layout.bound_s is not None
                else {}
            ),
        }

    def _start_group(self, incarnation: Incarnation, group: int, resume: int | None) -> Gang:
        """Start ``group``'s K ranks: a gang of its own on a fresh rendezvous port."""
        state, number, k = self.state, incarnation.number, self.layout.nproc_per_group
        inside = NodeTopology(nproc_per_node=k, max_restarts=incarnation.topology.max_restarts)
        port = free_port()
        ranks = self.layout.ranks_of(group)
        envs = []
        for local, rank in enumerate(ranks):
            state.error_path(number, rank).unlink(missing_ok=True)
            state.done_path(number, rank).unlink(missing_ok=True)  # a group's earlier launch
            contract = inside.launch_env(
                local,
                incarnation=number,
                master_port=port,
                run=self.spec.run,
                restart_from=resume,
                stack_file=str(state.stack_path(number, rank)),
                error_file=str(state.error_path(number, rank)),
                done_file=str(state.done_path(number, rank)),
            )
            envs.append(rank_environ(self.environ, self._group_env(group), contract))
        for path in (state.log_path(number, ranks[0]).parent, state.exit_path(number, 0).parent):
            path.mkdir(parents=True, exist_ok=True)
        self.ports[group] = port
        return Gang.launch(
            self.spec.argv,
            envs,
            [state.log_path(number, r) for r in ranks],
            [state.exit_path(number, r) for r in ranks],
            ranks=ranks,
            warm=self.spares.start_rank,
        )

    def _all_ranks(self) -> tuple[RankProcess, ...]:
        return tuple(
            sorted((p for gang in self.gangs.values() for p in gang.ranks), key=lambda p: p.rank)
        )

    def start(self, incarnation: Incarnation, scope: Scope = WHOLE_NODE) -> Started:
        """Start ``scope``'s groups of ``incarnation`` (see `controller.launcher.Launcher`).

        A whole-node scope starts every group (a first launch, or a gang restart that
        resumes from ``incarnation.resume``); a scope naming groups restarts those alone,
        to heal from a live peer (no ``RUNWATCH_RESTART_FROM``).
        """
        groups = self.layout.groups_in(scope)
        resume = incarnation.resume.env_value if incarnation.resume is not None else None
        if scope.whole_node:
            self.restarts = {}
        else:
            resume = None
            for g in groups:
                self.restarts[g] = self.restarts.get(g, 0) + 1
        taken = self.spares.taken
        for g in groups:
            self.gangs[g] = self._start_group(incarnation, g, resume)
        self.incarnation = incarnation.number
        self.spares.launched(time.monotonic())
        return Started(self._all_ranks(), self.ports[groups[0]], warm=self.spares.taken - taken)

    def adopt(self, incarnation: int, ranks: Sequence[RankProcess]) -> None:
        """Watch ranks another process launched, by group (exit status from the files)."""
        self.incarnation = incarnation
        by_group: dict[int, list[RankProcess]] = {}
        for proc in ranks:
            by_group.setdefault(self.layout.group_of(proc.rank), []).append(proc)
        self.gangs = {
            g: Gang.adopt(procs, [self.state.exit_path(incarnation, p.rank) for p in procs])
            for g, procs in by_group.items()
        }

    def status(self, rank: int) -> RankStatus:
        """See `controller.launcher.Launcher.status`."""
        return self.gangs[self.layout.group_of(rank)].status(rank)

    def running(self) -> list[int]:
        """See `controller.launcher.Launcher.running`."""
        return sorted(r for gang in self.gangs.values() for r in gang.running())

    def pids(self, group: int) -> tuple[int, ...]:
        """The pids of ``group``'s ranks (what a group restart replaces, and only that)."""
        return tuple(p.pid for p in self.gangs[group].ranks)

    def take_stacks(
        self, scope: Scope, timeout_s: float = STACK_TIMEOUT_S
    ) -> tuple[RankStack, ...]:
        """Where ``scope``'s ranks are (`controller.stacks.capture` on the running ones)."""
        procs = [p for g in self.layout.groups_in(scope) for p in self.gangs[g].ranks]
        running = set(self.running())
        slots = {
            p.rank: (p.pid, self.state.stack_path(self.incarnation, p.rank))
            for p in procs
            if p.rank in running
        }
        try:
            taken = capture(slots, timeout_s=timeout_s)
        except Exception as exc:  # a diagnostic must never cost the restart
            log.warning("run %s: could not take stacks: %s", self.spec.run_id, exc)
            taken = {}
        out = []
        for proc in procs:
            t = taken.get(proc.rank)
            if t is not None:
                out.append(RankStack(rank=proc.rank, host=self.host, where=t.where, note=t.note))
            else:
                note = f"exited ({self.status(proc.rank)})"
                out.append(RankStack(rank=proc.rank, host=self.host, note=note))
        return tuple(out)

    def stop(self, scope: Scope, *, grace_s: float, kill_now: bool) -> None:
        """Stop ``scope``'s groups (the others keep running)."""
        for g in self.layout.groups_in(scope):
            gang = self.gangs.get(g)
            if gang is not None:
                gang.stop(grace_s, kill_now=kill_now)

    def tick(self, now_s: float) -> None:
        """Refill the warm spares when it is time (`controller.spares.SparePool.tick`)."""
        self.spares.tick(now_s)

    def close(self) -> None:
        """Release the warm spares and stop this node's Lighthouse, if it started one.

        The groups are left as they are.
        """
        self.spares.close()
        self.lighthouse.stop()


FT_PRELOAD = ("torchft",)
"""What a group's spare imports besides ``--spare-preload``: torchft, which the
``torchft-ddp`` backend imports only when it starts (`producers.torchft_backend`)."""


def group_spares(state: ControllerState, spec: LaunchSpec, layout: ReplicaLayout) -> Spares:
    """The warm spares ``spec`` asks for: one group's worth (`ReplicaLayout.nproc_per_group`).

    A group restart needs K ranks at once, and groups fail one at a time far more often
    than together; a whole-node start takes what there is and starts the rest cold.
    Without ``--warm-spares``, or for a command that is not Python (a record edited since
    the launch refused it), `controller.spares.NoSpares`.
    """
    wanted = spec.warm_spares
    split = split_python(spec.argv) if wanted is not None else None
    if wanted is None or split is None:
        if wanted is not None:
            log.warning("run %s: warm spares need a Python command; ranks start cold", spec.run_id)
        return NoSpares()
    preload = wanted.preload + tuple(m for m in FT_PRELOAD if m not in wanted.preload)
    return SparePool(
        root=state.root / "spares",
        interpreter=tuple(split[0]),
        target=tuple(split[1]),
        env=node_environ(os.environ, spec.env),
        preload=preload,
        size=layout.nproc_per_group,
    )


__all__ = [
    "FT_PRELOAD",
    "LIGHTHOUSE_FILE",
    "ReplicaLayout",
    "TorchFTLauncher",
    "group_spares",
    "lighthouse_port",
]
