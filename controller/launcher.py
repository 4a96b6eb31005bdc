"""The Launcher seam: what starts, adopts, watches and stops one run's processes on this node.

`controller.supervisor.RunSupervisor` decides nothing about processes and holds none: it
executes the plans of `controller.restart_plan` and asks its `Launcher` to do the process
side of them. A launcher is made for one run on one node, from the run's
`controller.state.LaunchSpec` and state directory, and is told:

* `Launcher.start`: start this node's processes of an incarnation (its number, this
  node's topology in it, where to resume) for a `Scope`, and say what it started (pids
  for the gang record, the rendezvous port, how many started warm);
* `Launcher.adopt`: watch processes a previous controller started (after a restart of the
  controller, from the gang record's pids);
* `Launcher.status` / `Launcher.running`: how each rank is doing (the supervisor turns
  exits into exit evidence);
* `Launcher.take_stacks`: where the running ranks of a scope are, before they are stopped;
* `Launcher.stop`: stop a scope's processes (SIGTERM, grace, SIGKILL; or SIGKILL at once);
* `Launcher.tick` (housekeeping, after every look at the gang) and `Launcher.close`.

A `Scope` names *which* of the node's processes a step concerns: today every plan names
the whole node (`WHOLE_NODE`), because every restart restarts the gang. A launcher of
replica groups (torchft: one process group per replica group, healed from a live peer)
gets plans that name groups (`Scope.groups`): it stops and starts those groups only, and
the supervisor executes such a plan with the same calls. `LocalLauncher` has no groups and
refuses a scope that names some.

`LocalLauncher` is today's launcher: one wrapped process per local rank, as torchrun
starts them (`controller.gang`), optionally in warm spares (`controller.spares`). A run
without ``--warm-spares`` gets `controller.spares.NoSpares`, a pool that never has a
spare: the launcher asks it like any other.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from runwatch.common.checkpoint_layout import latest_complete_checkpoint
from runwatch.common.launch_env import LaunchEnv
from runwatch.controller.gang import RUNNING, Gang, free_port, node_environ, rank_environ
from runwatch.controller.spares import NoSpares, SparePool, Spares, split_python
from runwatch.controller.stacks import capture
from runwatch.controller.state import ControllerState, GangRecord, LaunchSpec, RankProcess
from runwatch.controller.topology import NodeTopology
from runwatch.schemas.events import RankStack

log = logging.getLogger(__name__)

HOST = socket.gethostname()
"""This agent's host name: where its launcher starts processes (in exit evidence, stacks)."""

STACK_TIMEOUT_S = 1.5
"""Longest a restart waits for the ranks' stacks."""

RankStatus = int | str | None
"""``"running"`` (`controller.gang.RUNNING`), the rank's exit status, or None: unknown."""


@dataclass(frozen=True)
class Scope:
    """Which of this node's processes a step of a plan concerns.

    Attributes:
        groups: Replica groups (a launcher that has them); None: every process of the run
            on this node, the whole gang's share here.
    """

    groups: tuple[int, ...] | None = None

    @property
    def whole_node(self) -> bool:
        """True when the scope is every process of the run on this node."""
        return self.groups is None


WHOLE_NODE = Scope()
"""Every process of the run on this node (a gang restart)."""


@dataclass(frozen=True)
class Resume:
    """Where a respawned gang starts.

    Attributes:
        step: The checkpoint step, None: from scratch.
        path: Its directory ("" from scratch).
    """

    step: int | None
    path: str = ""

    @property
    def env_value(self) -> int:
        """``RUNWATCH_RESTART_FROM``: the step, or 0 for "no checkpoint"."""
        return 0 if self.step is None else self.step


def resolve_resume(checkpoint_dir: str | None, max_step: int | None) -> Resume:
    """The checkpoint a respawn resumes from (a read of the disk, no torch).

    Args:
        checkpoint_dir: The gang's checkpoint root; None: unknown, start from scratch.
        max_step: The command's bound (``max_checkpoint_step``), None: the latest.

    Returns:
        The resume point.
    """
    if checkpoint_dir is None:
        return Resume(None)
    found = latest_complete_checkpoint(checkpoint_dir, at_or_before=max_step)
    return Resume(None) if found is None else Resume(found[0], str(found[1]))


@dataclass(frozen=True)
class Incarnation:
    """What a launcher starts: this node's share of one incarnation of the gang.

    Attributes:
        number: The incarnation (0 first, +1 per restart).
        topology: This node's place in it (a one-node gang that shrank by ranks has
            fewer ``nproc_per_node`` than it was launched with).
        resume: Where a respawn resumes; None for a first launch (no
            ``RUNWATCH_RESTART_FROM``).
    """

    number: int
    topology: NodeTopology
    resume: Resume | None = None


@dataclass(frozen=True)
class Started:
    """What a launcher started.

    Attributes:
        ranks: The processes, for the gang record (pids and start times).
        master_port: The incarnation's rendezvous port.
        warm: How many of them started in a warm spare.
    """

    ranks: tuple[RankProcess, ...]
    master_port: int
    warm: int = 0


class Launcher(Protocol):
    """Starts, adopts, watches and stops one run's processes on this node (module doc)."""

    def start(self, incarnation: Incarnation, scope: Scope = WHOLE_NODE) -> Started:
        """Start ``scope``'s processes of ``incarnation``; they replace what ran before."""
        ...

    def adopt(self, incarnation: int, ranks: Sequence[RankProcess]) -> None:
        """Watch ``ranks`` of ``incarnation``, started by a previous controller."""
        ...

    def status(self, rank: int) -> RankStatus:
        """``"running"``, the rank's exit status, or None if it ended with an unknown one."""
        ...

    def running(self) -> list[int]:
        """The ranks still running."""
        ...

    def take_stacks(self, scope: Scope, timeout_s: float) -> tuple[RankStack, ...]:
        """Where each of ``scope``'s ranks is now (running ones asked, exited ones say so).

        Best effort: diagnostics never hold up or fail a restart.
        """
        ...

    def stop(self, scope: Scope, *, grace_s: float, kill_now: bool) -> None:
        """Stop ``scope``'s processes: SIGTERM, ``grace_s``, SIGKILL; or SIGKILL at once."""
        ...

    def tick(self, now_s: float) -> None:
        """Housekeeping after each look at the gang (``now_s``: monotonic seconds)."""
        ...

    def close(self) -> None:
        """Release what the launcher holds besides the gang (the gang is left as it is)."""
        ...


def launch_env(
    spec: LaunchSpec,
    incarnation: Incarnation,
    local_rank: int,
    master_port: int,
    stack_file: str | None = None,
    error_file: str | None = None,
    done_file: str | None = None,
) -> LaunchEnv:
    """The launch environment of one of this node's ranks in ``incarnation``.

    Args:
        spec: The run's launch spec (the run the rank reports to).
        incarnation: The incarnation being started.
        local_rank: The rank's index on this node (the global rank on one host).
        master_port: The incarnation's rendezvous port.
        stack_file: Where the rank dumps its stacks when asked (`controller.stacks`).
        error_file: Where the rank's ``@record`` entry point writes its exception
            (``TORCHELASTIC_ERROR_FILE``; `controller.state.ControllerState.error_path`,
            where the supervisor reads it when the rank exits non-zero).
        done_file: Where the rank says its training finished (``RUNWATCH_DONE_FILE``;
            `controller.state.ControllerState.done_path`, where the supervisor looks when
            a signal kills the rank: `producers.rank_done`).

    Returns:
        The struct whose `LaunchEnv.to_environ` the rank is started with (written by
        `controller.topology.NodeTopology.launch_env`).
    """
    resume = incarnation.resume
    return incarnation.topology.launch_env(
        local_rank,
        incarnation=incarnation.number,
        master_port=master_port,
        run=spec.run,
        restart_from=None if resume is None else resume.env_value,
        stack_file=stack_file,
        error_file=error_file,
        done_file=done_file,
    )


class LocalLauncher:
    """One wrapped process per local rank, as torchrun starts them (`controller.gang`).

    Implements `Launcher` without replica groups: every scope is the whole node.

    Args:
        state: The run's state directory (logs, exit files, stack files).
        spec: What was asked (command, extra environment, the run).
        spares: Where ranks may start warm: a `controller.spares.SparePool`, or
            `controller.spares.NoSpares`.
        environ: The agent's environment, under each rank's (default ``os.environ``).
        host: This agent's host, in the stacks it reports.
    """

    def __init__(
        self,
        state: ControllerState,
        spec: LaunchSpec,
        spares: Spares,
        *,
        environ: Mapping[str, str] | None = None,
        host: str = HOST,
    ) -> None:
        self.state = state
        self.spec = spec
        self.spares = spares
        self.environ = os.environ if environ is None else environ
        self.host = host
        self.incarnation = 0
        self.gang = Gang.adopt((), ())

    @classmethod
    def for_run(cls, state: ControllerState, spec: LaunchSpec, record: GangRecord) -> LocalLauncher:
        """The launcher ``spec`` asks for, watching the ranks ``record`` holds (if any).

        Warm spares need a Python command (`controller.spares.split_python`):
        ``runwatch launch`` refuses anything else, and a record edited since starts cold
        (said in the log).
        """
        spares: Spares = NoSpares()
        wanted = spec.warm_spares
        split = split_python(spec.argv) if wanted is not None else None
        if wanted is not None and split is None:
            log.warning("run %s: warm spares need a Python command; ranks start cold", spec.run_id)
        elif wanted is not None and split is not None:
            spares = SparePool(
                root=state.root / "spares",
                interpreter=tuple(split[0]),
                target=tuple(split[1]),
                env=node_environ(os.environ, spec.env),
                preload=wanted.preload,
            )
        launcher = cls(state, spec, spares)
        launcher.adopt(record.incarnation, record.ranks)
        return launcher

    @staticmethod
    def _whole(scope: Scope) -> None:
        if not scope.whole_node:
            raise ValueError(
                f"this launcher starts and stops the whole gang on its node; it has no replica "
                f"groups (asked for groups {list(scope.groups or ())})"
            )

    def start(self, incarnation: Incarnation, scope: Scope = WHOLE_NODE) -> Started:
        """Start this node's ranks of ``incarnation`` (see `Launcher.start`).

        The rendezvous port is the topology's for the incarnation (every node's agent
        computes the same), or a free port on one node without ``--master-port``.
        """
        self._whole(scope)
        node = incarnation.topology
        port = node.incarnation_port(incarnation.number) or free_port()
        state, number = self.state, incarnation.number
        ranks = node.global_ranks
        for rank in ranks:  # a relaunch of a run id may have left one of an old gang
            state.error_path(number, rank).unlink(missing_ok=True)
            state.done_path(number, rank).unlink(missing_ok=True)
        envs = [
            rank_environ(
                self.environ,
                self.spec.env,
                launch_env(
                    self.spec,
                    incarnation,
                    local,
                    port,
                    str(state.stack_path(number, node.global_rank(local))),
                    str(state.error_path(number, node.global_rank(local))),
                    str(state.done_path(number, node.global_rank(local))),
                ),
            )
            for local in node.local_ranks
        ]
        self.spares.resize(len(ranks))
        taken = self.spares.taken
        self.gang = Gang.launch(
            self.spec.argv,
            envs,
            [state.log_path(number, r) for r in ranks],
            [state.exit_path(number, r) for r in ranks],
            ranks=ranks,
            warm=self.spares.start_rank,
        )
        self.incarnation = number
        self.spares.launched(time.monotonic())
        return Started(self.gang.ranks, port, warm=self.spares.taken - taken)

    def adopt(self, incarnation: int, ranks: Sequence[RankProcess]) -> None:
        """Watch ranks another process launched (their exit status comes from the files)."""
        self.incarnation = incarnation
        self.gang = Gang.adopt(ranks, [self.state.exit_path(incarnation, p.rank) for p in ranks])

    def status(self, rank: int) -> RankStatus:
        """See `Launcher.status`."""
        return self.gang.status(rank)

    def running(self) -> list[int]:
        """See `Launcher.running`."""
        return self.gang.running()

    def take_stacks(
        self, scope: Scope, timeout_s: float = STACK_TIMEOUT_S
    ) -> tuple[RankStack, ...]:
        """See `Launcher.take_stacks`: `controller.stacks.capture` on the running ranks."""
        self._whole(scope)
        running = set(self.gang.running())
        slots = {
            p.rank: (p.pid, self.state.stack_path(self.incarnation, p.rank))
            for p in self.gang.ranks
            if p.rank in running
        }
        try:
            taken = capture(slots, timeout_s=timeout_s)
        except Exception as exc:  # a diagnostic must never cost the restart
            log.warning("run %s: could not take stacks: %s", self.spec.run_id, exc)
            taken = {}
        out = []
        for proc in self.gang.ranks:
            t = taken.get(proc.rank)
            if t is not None:
                out.append(RankStack(rank=proc.rank, host=self.host, where=t.where, note=t.note))
            else:
                status = self.gang.status(proc.rank)
                out.append(RankStack(rank=proc.rank, host=self.host, note=f"exited ({status})"))
        return tuple(out)

    def stop(self, scope: Scope, *, grace_s: float, kill_now: bool) -> None:
        """See `Launcher.stop`."""
        self._whole(scope)
        self.gang.stop(grace_s, kill_now=kill_now)

    def tick(self, now_s: float) -> None:
        """Refill the warm spares when it is time (`controller.spares.SparePool.tick`)."""
        self.spares.tick(now_s)

    def close(self) -> None:
        """Release the warm spares (they have run nothing)."""
        self.spares.close()


__all__ = [
    "HOST",
    "RUNNING",
    "STACK_TIMEOUT_S",
    "WHOLE_NODE",
    "Incarnation",
    "Launcher",
    "LocalLauncher",
    "RankStatus",
    "Resume",
    "Scope",
    "Started",
    "launch_env",
    "resolve_resume",
]
