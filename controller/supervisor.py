"""One run under a controller: its gang, its record, and how a restart command is executed.

`RunSupervisor` holds no Kafka client: the controller loop (`controller.loop`) reads
commands, asks the gate, and hands the commands to execute here; what the supervisor has to
say (RestartCompleted, RestartFailed, RunEnded) goes back through the callables it is given.

Decisions (see docs/controller.md):

* **Respawn** stops the gang with SIGTERM, ``grace_s``, SIGKILL; **rollback** SIGKILLs at
  once, because a rank that checkpoints on SIGTERM would write the poisoned state the
  rollback is escaping.
* The old incarnation's end is always announced by the controller (RunEnded ``stopped``)
  before the new gang starts, whatever the old gang said, so liveness checks are suspended
  while restarting and the new RunStarted opens a fresh incarnation.
* The checkpoint is resolved here, from disk: the latest complete one at or before the
  command's ``max_checkpoint_step``. None qualifies: the gang starts over with
  ``RUNWATCH_RESTART_FROM=0`` ("no checkpoint", which also makes the script discard the
  checkpoints newer than 0: a rollback must never land on them), and RestartCompleted
  carries ``checkpoint_step=None``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import msgspec

from runwatch.common.checkpoint_layout import latest_complete_checkpoint
from runwatch.common.launch_env import LaunchEnv
from runwatch.controller.elastic import (
    RankExit,
    SizeDecision,
    count_failures,
    culprits,
    due_reports,
    next_world_size,
)
from runwatch.controller.gang import RUNNING, Gang, free_port, node_environ, rank_environ
from runwatch.controller.membership import NodeDecision, charge_failure, decide_nodes
from runwatch.controller.spares import SparePool, split_python
from runwatch.controller.stacks import capture
from runwatch.controller.state import ControllerState, GangRecord, ProcessedCommand
from runwatch.controller.topology import NodeTopology, RunBinding
from runwatch.schemas.events import (
    AgentReady,
    AnomalyDetected,
    BackendDeclaration,
    Event,
    RankExited,
    RankStack,
    RestartCompleted,
    RestartFailed,
    RestartRequested,
)
from runwatch.schemas.kinds import kind_spec

log = logging.getLogger(__name__)

EXIT_HOLD_S = 0.5
"""How long an agent of a multi-node gang holds back a non-signalled abnormal exit."""

HOST = socket.gethostname()
"""This agent's host name, in the exit evidence it publishes."""

STACK_TIMEOUT_S = 1.5
"""Longest a restart waits for the ranks' stacks."""

Publish = Callable[[Event], None]
"""Publishes a controller-side event (the controller topic; a RankExited: the heartbeats topic)."""
AnnounceEnd = Callable[[GangRecord, str, str], None]
"""``(record, status, reason)``: emits RunEnded for the record's incarnation."""


class Peers(Protocol):
    """What an agent of a multi-node gang hears of its run from the others (Kafka side).

    `controller.loop.PeerWatch` implements it; the supervisor holds no Kafka client.
    """

    def backend(self, run_id: str) -> BackendDeclaration | None:
        """What the run's latest RunStarted declared of its backend; None: nothing seen."""
        ...

    def await_ready(
        self, run_id: str, incarnation: int, nnodes: int, timeout_s: float
    ) -> Mapping[int, AgentReady]:
        """The agents ready for ``incarnation`` by node rank.

        Returns:
            All ``nnodes`` of them, or those heard from within ``timeout_s``.
        """
        ...

    def cause(self, command: RestartRequested) -> AnomalyDetected | None:
        """The verdict ``command`` was issued for (the record at its ``source``); None: unread."""
        ...


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


def launch_env(
    record: GangRecord,
    local_rank: int,
    master_port: int,
    resume: Resume | None,
    stack_file: Path | None = None,
) -> LaunchEnv:
    """The launch environment of one of this node's ranks in ``record``'s incarnation.

    Args:
        record: The gang record of the incarnation being launched.
        local_rank: The rank's index on this node (the global rank on one host).
        master_port: The incarnation's rendezvous port.
        resume: Where a respawn resumes; None for a first launch (no
            ``RUNWATCH_RESTART_FROM``).
        stack_file: Where the rank dumps its stacks when asked (`controller.stacks`).

    Returns:
        The struct whose `LaunchEnv.to_environ` the rank is started with (written by
        `controller.topology.NodeTopology.launch_env`).
    """
    return record.node.launch_env(
        local_rank,
        incarnation=record.incarnation,
        master_port=master_port,
        run=RunBinding(
            run_id=record.run_id,
            bootstrap=record.bootstrap,
            prefix=record.prefix,
            checkpoint_dir=record.checkpoint_dir,
            relay_socket=record.relay_socket or None,
        ),
        restart_from=None if resume is None else resume.env_value,
        stack_file=None if stack_file is None else str(stack_file),
    )


def merge_stacks(
    local: tuple[RankStack, ...], announced: Iterable[AgentReady]
) -> tuple[RankStack, ...]:
    """Every node's rank stacks, by rank: this node's, then those the other agents announced.

    Args:
        local: This node's (`RunSupervisor._take_stacks`).
        announced: The other nodes' AgentReady for the same restart.

    Returns:
        One entry per rank (this node's own entry wins over a repeated rank), in rank order.
    """
    by_rank = {s.rank: s for ready in announced for s in ready.stacks}
    by_rank.update({s.rank: s for s in local})
    return tuple(by_rank[r] for r in sorted(by_rank))


@dataclass
class RunSupervisor:
    """Supervises one run's gang for the controller loop.

    Attributes:
        state: The run's state directory.
        record: The current gang record (persisted on every change).
        gang: The running (or ended) gang.
        publish: Sends events to the controller topic.
        announce_end: Emits RunEnded for an incarnation.
        exits: Exits noticed in the current incarnation, by rank.
        unreported: Exits noticed and held back, not yet published (multi-node only).
        dead_since_s: When the whole gang was noticed dead (monotonic), None while alive.
        peers: The other agents of a multi-node gang (None: restart at full size without
            asking who is there, as on one node).
        spares: The run's warm spares on this node (``--warm-spares``), made at the first
            launch; None without.
        launched_s: When this agent last launched the gang (monotonic; spares are
            refilled `controller.spares.SparePool.delay_s` after it).
    """

    state: ControllerState
    record: GangRecord
    gang: Gang
    publish: Publish
    announce_end: AnnounceEnd
    peers: Peers | None = None
    exits: dict[int, RankExit] = field(default_factory=dict)
    unreported: dict[int, RankExit] = field(default_factory=dict)
    dead_since_s: float | None = None
    spares: SparePool | None = None
    launched_s: float | None = None

    @property
    def run_id(self) -> str:
        """The run."""
        return self.record.run_id

    @property
    def finished(self) -> bool:
        """True once the run completed or failed for good."""
        return self.record.status != "running"

    def _save(self, **changes: object) -> None:
        self.record = msgspec.structs.replace(self.record, **changes)
        self.state.save_gang(self.record)

    # ------------------------------------------------------------------ launching

    def launch(self, resume: Resume | None) -> None:
        """Start this node's ranks of the record's incarnation and persist the pids.

        The rendezvous port is the topology's for the incarnation (every node's agent
        computes the same), or a free port on one node without ``--master-port``.

        Args:
            resume: Where to resume; None for a first launch (no ``RUNWATCH_RESTART_FROM``).
        """
        rec = self.record
        node = rec.node
        port = node.incarnation_port(rec.incarnation) or free_port()
        envs = [
            rank_environ(
                os.environ,
                rec.env,
                launch_env(
                    rec,
                    local,
                    port,
                    resume,
                    self.state.stack_path(rec.incarnation, node.global_rank(local)),
                ),
            )
            for local in node.local_ranks
        ]
        ranks = node.global_ranks
        spares = self._spare_pool(len(ranks))
        taken = spares.taken if spares is not None else 0
        self.gang = Gang.launch(
            rec.argv,
            envs,
            [self.state.log_path(rec.incarnation, r) for r in ranks],
            [self.state.exit_path(rec.incarnation, r) for r in ranks],
            ranks=ranks,
            warm=spares.start_rank if spares is not None else None,
        )
        self.launched_s = time.monotonic()
        self.exits, self.unreported, self.dead_since_s = {}, {}, None
        self._save(ranks=self.gang.ranks, master_port=port)
        warm = (spares.taken - taken) if spares is not None else 0
        log.warning(
            "run %s incarnation %d: node %d/%d started ranks %s (pids %s%s), rendezvous port %s:%d",
            rec.run_id,
            rec.incarnation,
            node.node_rank,
            node.nnodes,
            list(ranks),
            [p.pid for p in self.gang.ranks],
            f"; {warm} in warm spares" if warm else "",
            node.master_addr,
            port,
        )

    def _spare_pool(self, size: int) -> SparePool | None:
        """The run's warm spares, sized for this node's ranks (made on first use)."""
        rec = self.record
        if not rec.warm_spares:
            return None
        if self.spares is None:
            split = split_python(rec.argv)
            if split is None:  # `runwatch launch` refuses this; an edited record may not
                log.warning(
                    "run %s: warm spares need a Python command; ranks start cold", rec.run_id
                )
                return None
            self.spares = SparePool(
                root=self.state.root / "spares",
                interpreter=tuple(split[0]),
                target=tuple(split[1]),
                env=node_environ(os.environ, rec.env),
                preload=rec.spare_preload,
            )
        self.spares.size = size
        return self.spares

    def _refill_spares(self, now_s: float) -> None:
        pool = self.spares
        if pool is None or self.launched_s is None or now_s - self.launched_s < pool.delay_s:
            return
        if len(pool.spares) < pool.size:
            pool.fill()

    def close(self) -> None:
        """Release this run's warm spares (the gang itself is left as it is)."""
        if self.spares is not None:
            self.spares.close()

    # ------------------------------------------------------------------ watching

    def observe(self, now_s: float) -> None:
        """Notice rank exits; finish the run when it completed or waited too long for help.

        Every exit noticed is published as a `schemas.events.RankExited` (exit evidence:
        the processors name the culprit from it) before anything else is done about it;
        exits noticed in one sweep go culprit-first (`RankExit.report_order`). On one of
        several nodes a non-signalled abnormal exit waits `EXIT_HOLD_S` first
        (`controller.elastic.due_reports`: a rank killed on another node is the culprit).
        Ranks the controller stops itself are never observed (a restart resets ``exits``).
        """
        if self.finished:
            self.close()
            return
        self._refill_spares(now_s)
        noticed = []
        for proc in self.record.ranks:
            if proc.rank in self.exits:
                continue
            status = self.gang.status(proc.rank)
            if status != RUNNING:
                code = status if isinstance(status, int) else None
                noticed.append(RankExit(proc.rank, code, now_s))
        for gone in noticed:
            self.exits[gone.rank] = gone
            self.unreported[gone.rank] = gone
        hold_s = EXIT_HOLD_S if self.record.topology.nnodes > 1 else 0.0
        self._report_pending(now_s, hold_s)
        if len(self.exits) < len(self.record.ranks):
            return
        if all(e.code == 0 for e in self.exits.values()):
            log.warning("run %s completed: every local rank exited 0", self.run_id)
            self._save(status="completed")
            return
        if self.dead_since_s is None:
            self.dead_since_s = now_s
            blamed = self._count_failure()
            codes = {r: e.code for r, e in sorted(self.exits.items())}
            log.warning(
                "run %s incarnation %d: gang dead (exit codes %s, blamed ranks %s); "
                "waiting up to %.0fs for a command",
                self.run_id,
                self.record.incarnation,
                codes,
                list(blamed),
                self.record.command_timeout_s,
            )
        elif now_s - self.dead_since_s > self.record.command_timeout_s:
            codes = {r: e.code for r, e in sorted(self.exits.items())}
            reason = (
                f"gang dead (exit codes {codes}) and no restart command within "
                f"{self.record.command_timeout_s:g}s"
            )
            log.warning("run %s failed: %s", self.run_id, reason)
            self._report_pending(now_s, 0.0)
            self.announce_end(self.record, "failed", reason)
            self._save(status="failed")

    def _report_pending(self, now_s: float, hold_s: float) -> None:
        """Publish the exits not reported yet that are due (`controller.elastic.due_reports`)."""
        if not self.unreported:
            return
        due, held = due_reports(list(self.unreported.values()), now_s, hold_s)
        self.unreported = {e.rank: e for e in held}
        pids = {p.rank: p.pid for p in self.record.ranks}
        for gone in due:
            self._report_exit(gone, pids[gone.rank])

    def _count_failure(self) -> tuple[int, ...]:
        """Charge this incarnation's failure to its culprits (once); return them."""
        blamed = culprits(list(self.exits.values()))
        counts = count_failures(self.record.failure_counts, blamed, self.record.world_size)
        self._save(failure_counts=counts)
        return blamed

    def _report_exit(self, gone: RankExit, pid: int) -> None:
        log.warning(
            "run %s incarnation %d: rank %d (pid %d) exited with status %s",
            self.run_id,
            self.record.incarnation,
            gone.rank,
            pid,
            gone.code,
        )
        if not self.record.exit_evidence:
            return
        try:
            self.publish(
                RankExited(
                    run_id=self.run_id,
                    ts_ns=time.time_ns(),
                    rank=gone.rank,
                    incarnation=self.record.incarnation,
                    host=HOST,
                    pid=pid,
                    exit_code=gone.exit_code,
                    signal=gone.signal,
                )
            )
        except Exception as exc:  # evidence is best effort: the silence timeout still holds
            log.warning("run %s: could not publish rank %d's exit: %s", self.run_id, gone.rank, exc)

    # ------------------------------------------------------------------ executing

    def execute(self, command: RestartRequested, received_s: float) -> None:
        """Execute a command the gate let through: record it, stop, resume, report.

        Args:
            command: The verified command.
            received_s: When it was read (monotonic), the start of ``duration_s``.
        """
        self.state.mark_processed(
            ProcessedCommand(
                command_id=command.command_id,
                run_id=command.run_id,
                incarnation=command.incarnation,
                ts_ns=time.time_ns(),
            )
        )
        try:
            self._restart(command, received_s)
        except Exception as exc:  # the run must hear about it, whatever went wrong
            reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
            log.exception("run %s: command %s failed", self.run_id, command.command_id)
            self._publish_failed(command, reason)

    def _publish_failed(self, command: RestartRequested, reason: str) -> None:
        """Tell the run its command was not carried out, and why (one line)."""
        self.publish(
            RestartFailed(
                run_id=self.run_id,
                ts_ns=time.time_ns(),
                command_id=command.command_id,
                reason=reason,
            )
        )

    def _restart(self, command: RestartRequested, received_s: float) -> None:
        self.observe(time.monotonic())  # count the failure before the stop hides it
        if self.dead_since_s is None and any(e.abnormal for e in self.exits.values()):
            # The command came while the culprit's peers still ran (blocked on it: exit
            # evidence is faster than their failure), so observe() did not count it yet.
            # Only exits noticed before the stop are charged, never the stop's own.
            blamed = self._count_failure()
            log.warning("run %s: failure charged to ranks %s", self.run_id, list(blamed))
        old = self.record
        stacks = self._take_stacks(command)
        self.gang.stop(old.grace_s, kill_now=command.action == "rollback")
        self._report_pending(time.monotonic(), 0.0)
        limit = old.topology.max_restarts
        if limit is not None and old.incarnation >= limit:
            self._give_up(command, f"--max-restarts {limit} reached (after {old.incarnation})")
            return
        topology, stacks = self._next_nodes(command, stacks)
        if topology is None:
            return  # the node decision failed the run, or dropped this node (said why)
        speaks = topology.node_rank == 0  # node 0 of the next incarnation speaks for the gang
        if speaks:
            self.announce_end(
                old, "stopped", f"controller: {command.action} for command {command.command_id}"
            )
        resume = resolve_resume(old.checkpoint_dir, command.max_checkpoint_step)
        size = self._next_size(command, topology)
        if size.reason:
            log.warning("run %s: elastic: %s", self.run_id, size.reason)
        self._save(
            incarnation=old.incarnation + 1,
            world_size=size.world_size,
            failure_counts=size.counts,
            ranks=(),
            topology=topology,
        )
        self.launch(resume)
        if not speaks:  # node 0's agent reports the gang's restart
            log.warning(
                "run %s: node %d restarted into incarnation %d from checkpoint %s",
                self.run_id,
                old.topology.node_rank,
                self.record.incarnation,
                resume.step,
            )
            return
        self.publish(
            RestartCompleted(
                run_id=self.run_id,
                ts_ns=time.time_ns(),
                command_id=command.command_id,
                checkpoint_step=resume.step,
                checkpoint_path=resume.path,
                world_size=size.world_size,
                duration_s=round(time.monotonic() - received_s, 6),
                stacks=stacks,
                stacks_dir=str(self.state.stack_path(old.incarnation, 0).parent) if stacks else "",
            )
        )

    def _take_stacks(self, command: RestartRequested) -> tuple[RankStack, ...]:
        """Where each rank stood, for a restart caused by a hang or a dead rank.

        Taken before the stop, from the ranks still running; exited ranks say how they
        ended. Best effort: diagnostics never hold up or fail a restart.
        """
        if not kind_spec(command.cause_kind).captures_stacks:
            return ()
        running = set(self.gang.running())
        slots = {
            p.rank: (p.pid, self.state.stack_path(self.record.incarnation, p.rank))
            for p in self.record.ranks
            if p.rank in running
        }
        try:
            taken = capture(slots, timeout_s=STACK_TIMEOUT_S)
        except Exception as exc:  # a diagnostic must never cost the restart
            log.warning("run %s: could not take stacks: %s", self.run_id, exc)
            taken = {}
        out = []
        for proc in self.record.ranks:
            t = taken.get(proc.rank)
            if t is not None:
                out.append(RankStack(rank=proc.rank, host=HOST, where=t.where, note=t.note))
            else:
                status = self.gang.status(proc.rank)
                out.append(RankStack(rank=proc.rank, host=HOST, note=f"exited ({status})"))
        log.warning(
            "run %s incarnation %d: before the stop, %s (stacks in %s)",
            self.run_id,
            self.record.incarnation,
            "; ".join(f"rank {s.rank} {'was in ' + s.where if s.where else s.note}" for s in out),
            self.state.stack_path(self.record.incarnation, 0).parent,
        )
        return tuple(out)

    def _next_nodes(
        self, command: RestartRequested, stacks: tuple[RankStack, ...]
    ) -> tuple[NodeTopology | None, tuple[RankStack, ...]]:
        """This node's topology in the next incarnation, and the gang's stacks.

        One node, or no peers to ask: the same topology, this node's stacks. Several:
        announce this agent ready (`schemas.events.AgentReady`, with this node's stacks),
        wait for the others (``node_timeout_s``), charge the restart to the node of the
        rank its verdict names (`controller.membership.charge_failure`), and let
        `controller.membership.decide_nodes` say full size, fewer nodes, or fail.

        Args:
            command: The command being executed.
            stacks: Where this node's ranks were before the stop (`_take_stacks`).

        Returns:
            ``(topology, stacks)``: the topology None when the run failed or this node was
            dropped (said why); the stacks of every node heard from, by rank.
        """
        rec = self.record
        node = rec.topology
        if node.nnodes == 1 or self.peers is None:
            return node, stacks
        nxt = rec.incarnation + 1
        self.publish(
            AgentReady(
                run_id=self.run_id,
                ts_ns=time.time_ns(),
                command_id=command.command_id,
                incarnation=nxt,
                node_rank=node.node_rank,
                nnodes=node.nnodes,
                host=HOST,
                stacks=stacks,
            )
        )
        ready = dict(self.peers.await_ready(self.run_id, nxt, node.nnodes, rec.node_timeout_s))
        others = [r for n, r in ready.items() if n != node.node_rank]
        gang_stacks = merge_stacks(stacks, others)
        backend = self.peers.backend(self.run_id) or rec.backend
        if backend != rec.backend:
            self._save(backend=backend)
        heard = {*ready, node.node_rank}
        failures = charge_failure(
            rec.node_failure_counts,
            nnodes=node.nnodes,
            nproc_per_node=node.nproc_per_node,
            command=command,
            verdict=self.peers.cause(command),
            ready=heard,
        )
        if failures != rec.node_failure_counts:
            log.warning(
                "run %s: failures per node %s (--node-failure-budget %d)",
                self.run_id,
                list(failures),
                rec.node_failure_budget,
            )
        decision: NodeDecision = decide_nodes(
            node.nnodes,
            heard,
            min_nnodes=node.min_nnodes,
            backend=backend,
            timeout_s=rec.node_timeout_s,
            failures=failures,
            failure_budget=rec.node_failure_budget,
        )
        if decision.verdict == "fail":
            self._give_up(command, decision.reason)
            return None, gang_stacks
        if node.node_rank not in decision.nodes:
            self._save(node_failure_counts=failures)
            self._dropped(decision)
            return None, gang_stacks
        self._save(node_failure_counts=decision.counts(failures))
        if decision.verdict == "full":
            if decision.reason:
                log.warning("run %s: elastic by nodes: %s", self.run_id, decision.reason)
            return node, gang_stacks
        first = decision.nodes[0]
        addr = node.master_addr
        if first != 0:  # node 0 is lost: the first survivor serves the rendezvous store
            announced = ready.get(first)
            addr = announced.host if announced is not None and announced.host else HOST
        log.warning("run %s: elastic by nodes: %s", self.run_id, decision.reason)
        return (
            msgspec.structs.replace(
                node,
                nnodes=len(decision.nodes),
                node_rank=decision.new_rank(node.node_rank),
                master_addr=addr,
            ),
            gang_stacks,
        )

    def _dropped(self, decision: NodeDecision) -> None:
        """This node is left out of the next incarnation: its agent ends, its ranks stay down.

        The run goes on on the other nodes (the next node 0 speaks for it); this agent
        publishes nothing more and `controller.loop.Controller.serve` exits
        `controller.loop.EXIT_DROPPED`.
        """
        node = self.record.topology
        log.warning(
            "run %s: node %d of %d dropped from incarnation %d: %s; this agent stops "
            "(its ranks stay down) and the run goes on without it",
            self.run_id,
            node.node_rank,
            node.nnodes,
            self.record.incarnation + 1,
            decision.reason,
        )
        self._save(status="dropped")

    def _next_size(self, command: RestartRequested, topology: NodeTopology) -> SizeDecision:
        """The world size of the respawn: elastic by ranks on one node, by nodes on several."""
        rec = self.record
        if rec.topology.nnodes > 1:
            if topology.nnodes != rec.topology.nnodes:
                return SizeDecision(
                    topology.world_size,
                    (0,) * topology.world_size,
                    f"{rec.topology.nnodes} -> {topology.nnodes} nodes: {rec.world_size} -> "
                    f"{topology.world_size} ranks",
                )
            if command.world_size not in (None, rec.world_size):
                log.warning(
                    "run %s: command asks for %d ranks; a gang of %d nodes restarts at its "
                    "size (%d)",
                    self.run_id,
                    command.world_size,
                    rec.topology.nnodes,
                    rec.world_size,
                )
            return SizeDecision(rec.world_size, rec.failure_counts)
        return next_world_size(
            rec.world_size,
            rec.failure_counts,
            budget=rec.rank_failure_budget,
            min_nproc=rec.min_nproc,
            requested=command.world_size,
        )

    def _give_up(self, command: RestartRequested, reason: str) -> None:
        """Refuse to restart: the run fails (its ranks are already stopped)."""
        log.warning("run %s failed: %s", self.run_id, reason)
        self._publish_failed(command, reason)
        self.announce_end(self.record, "failed", reason)
        self._save(status="failed")

    def note_offset(self, partition: int, offset: int) -> None:
        """Remember the position of the last command acted on (re-read after a restart)."""
        self._save(consumer_offsets={**self.record.consumer_offsets, partition: offset})

    def stop(self) -> None:
        """Stop the gang for good (the controller itself was asked to stop)."""
        self.gang.stop(self.record.grace_s)
        self.close()
        self._save(status="failed")


__all__ = [
    "AnnounceEnd",
    "Peers",
    "Publish",
    "Resume",
    "RunSupervisor",
    "launch_env",
    "merge_stacks",
    "resolve_resume",
]
