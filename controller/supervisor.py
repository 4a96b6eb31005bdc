"""One run under a controller: it watches the gang and carries out restart commands.

`RunSupervisor` holds no Kafka client and no process. The controller loop
(`controller.loop`) reads commands, asks the gate (`controller.command_gate`), and hands
the commands to execute here; what the supervisor has to say (RankExited,
RestartCompleted, RestartFailed, AgentReady, RunEnded) goes back through the callables it
is given. The processes are its `controller.launcher.Launcher`'s.

What a restart does is decided by `controller.restart_plan` (pure, numbered rules): the
supervisor takes the stacks, stops, hears the other agents, persists, resolves the
checkpoint, launches and reports, in the order the plans say.

* The old incarnation's end is announced by the controller (RunEnded ``stopped``, by node
  0 of the next incarnation) before the new gang starts, whatever the old gang said, so
  liveness checks are suspended while restarting and the new RunStarted opens a fresh
  incarnation.
* The checkpoint is resolved here, from disk: the latest complete one at or before the
  command's ``max_checkpoint_step``. None qualifies: the gang starts over with
  ``RUNWATCH_RESTART_FROM=0`` ("no checkpoint", which also makes the script discard the
  checkpoints newer than 0: a rollback must never land on them), and RestartCompleted
  carries ``checkpoint_step=None``.

Logging: what the supervisor does (a launch, a restart's steps, a clean exit, the run
completed) is INFO, one line per step; trouble (a rank that died, a dead gang, a node or
rank dropped, a command not carried out, the run failed) is WARNING.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

import msgspec

from runwatch.controller.elastic import RankExit, count_failures, culprits, due_reports
from runwatch.controller.error_file import read_root_cause
from runwatch.controller.group_plan import ReplicaGroups, plan_group
from runwatch.controller.launcher import (
    HOST,
    RUNNING,
    STACK_TIMEOUT_S,
    WHOLE_NODE,
    Incarnation,
    Launcher,
    Resume,
    Scope,
    resolve_resume,
)
from runwatch.controller.restart_plan import (
    Heard,
    Note,
    RestartPlan,
    plan_restart,
    plan_stop,
)
from runwatch.controller.state import (
    ControllerState,
    GangFile,
    GangRecord,
    LaunchSpec,
    ProcessedCommand,
)
from runwatch.controller.teardown import STOPPED, TeardownAction, TeardownClock, teardown_step
from runwatch.producers.backend import UnknownBackendError, training_backend_capabilities
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


Publish = Callable[[Event], None]
"""Publishes a controller-side event (the controller topic; a RankExited: the heartbeats topic)."""
AnnounceEnd = Callable[[GangRecord, str, str], None]
"""``(record, status, reason)``: emits RunEnded for the record's incarnation of the run."""


def captures_stacks(kind: str) -> bool:
    """True when a restart caused by a verdict of ``kind`` first asks the ranks where they are.

    `schemas.kinds.KindSpec.captures_stacks` decides (a hang, a dead rank).
    """
    return kind_spec(kind).captures_stacks


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


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "unknown signal"


def _log_note(run_id: str, note: Note) -> None:
    log.log(
        logging.WARNING if note.level == "warning" else logging.INFO,
        "run %s: %s",
        run_id,
        note.text,
    )


@dataclass
class RunSupervisor:
    """Supervises one run's gang on this node for the controller loop.

    Attributes:
        state: The run's state directory.
        spec: What was asked (never changed here).
        record: What happened (persisted with the spec on every change).
        launcher: Starts, watches and stops the run's processes on this node.
        publish: Sends events to the controller topic (RankExited: the heartbeats topic).
        announce_end: Emits RunEnded for an incarnation.
        peers: The other agents of a multi-node gang (None: restart at full size without
            asking who is there, as on one node).
        exits: Exits noticed in the current incarnation, by rank.
        unreported: Exits noticed and held back, not yet published (multi-node only).
        dead_since_s: When the whole gang was noticed dead (monotonic), None while alive.
        group_restarts: When each replica group was last restarted alone (monotonic); a
            group restarted less than ``command_timeout_s`` ago may still be healing.
        teardown: How long the incarnation has had ranks running after every local rank
            said its training finished (`controller.teardown`).
    """

    state: ControllerState
    spec: LaunchSpec
    record: GangRecord
    launcher: Launcher
    publish: Publish
    announce_end: AnnounceEnd
    peers: Peers | None = None
    exits: dict[int, RankExit] = field(default_factory=dict)
    unreported: dict[int, RankExit] = field(default_factory=dict)
    dead_since_s: float | None = None
    group_restarts: dict[int, float] = field(default_factory=dict)
    teardown: TeardownClock = STOPPED

    @property
    def run_id(self) -> str:
        """The run."""
        return self.spec.run_id

    @property
    def finished(self) -> bool:
        """True once the run completed or failed for good (or this node was dropped)."""
        return self.record.status != "running"

    def _save(self, record: GangRecord | None = None, **changes: object) -> None:
        """Persist ``record`` (default: the current one) with ``changes`` applied."""
        self.record = msgspec.structs.replace(record or self.record, **changes)
        self.state.save_gang(GangFile(spec=self.spec, record=self.record))

    # ------------------------------------------------------------------ launching

    def launch(self, resume: Resume | None, scope: Scope = WHOLE_NODE) -> None:
        """Start this node's ranks of the record's incarnation and persist the pids.

        Args:
            resume: Where to resume; None for a first launch (no ``RUNWATCH_RESTART_FROM``).
            scope: What to start (a plan's ``start``); the whole node today, so the record's
                ranks and the exits noticed are replaced as a whole.
        """
        rec = self.record
        node = rec.topology
        started = self.launcher.start(Incarnation(rec.incarnation, node, resume), scope)
        self.exits, self.unreported, self.dead_since_s = {}, {}, None
        self.teardown = STOPPED
        if scope.whole_node:
            self.group_restarts = {}
        self._save(ranks=started.ranks, master_port=started.master_port)
        log.info(
            "run %s incarnation %d: node %d/%d started ranks %s (pids %s%s), rendezvous port %s:%d",
            self.run_id,
            rec.incarnation,
            node.node_rank,
            node.nnodes,
            list(node.global_ranks),
            [p.pid for p in started.ranks],
            f"; {started.warm} in warm spares" if started.warm else "",
            node.master_addr,
            started.master_port,
        )

    def close(self) -> None:
        """Release what the launcher holds besides the gang (warm spares)."""
        self.launcher.close()

    # ------------------------------------------------------------------ watching

    def observe(self, now_s: float) -> None:
        """Notice rank exits; finish the run when it completed or waited too long for help.

        Every exit noticed is published as a `schemas.events.RankExited` (exit evidence:
        the processors name the culprit from it) before anything else is done about it;
        exits noticed in one sweep go culprit-first (`RankExit.report_order`). On one of
        several nodes a non-signalled abnormal exit waits `EXIT_HOLD_S` first
        (`controller.elastic.due_reports`: a rank killed on another node is the culprit).
        Ranks the controller stops itself are never observed (a restart resets ``exits``).
        A rank that said its training finished (`producers.rank_done`) and was then killed
        by a signal died in its interpreter's teardown: its exit counts as clean for the
        run's completion, and its RankExited says ``finished``. An exit code after it is
        still a failure (the script raised after training, e.g. in its final save).
        """
        if self.finished:
            self.close()
            return
        self.launcher.tick(now_s)
        noticed = []
        for proc in self.record.ranks:
            if proc.rank in self.exits:
                continue
            status = self.launcher.status(proc.rank)
            if status != RUNNING:
                code = status if isinstance(status, int) else None
                gone = RankExit(proc.rank, code, now_s)
                noticed.append(replace(gone, finished=True) if self._finished(gone) else gone)
        for gone in noticed:
            self.exits[gone.rank] = gone
            self.unreported[gone.rank] = gone
        hold_s = EXIT_HOLD_S if self.record.topology.nnodes > 1 else 0.0
        self._report_pending(now_s, hold_s)
        if len(self.exits) < len(self.record.ranks):
            self._watch_teardown(now_s)
            return
        if not any(e.abnormal for e in self.exits.values()):
            after = sorted(r for r, e in self.exits.items() if e.code != 0)
            log.info(
                "run %s completed: every local rank exited 0%s",
                self.run_id,
                f" or after it finished training (ranks {after})" if after else "",
            )
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
                self.spec.command_timeout_s,
            )
        elif now_s - self.dead_since_s > self.spec.command_timeout_s:
            codes = {r: e.code for r, e in sorted(self.exits.items())}
            reason = (
                f"gang dead (exit codes {codes}) and no restart command within "
                f"{self.spec.command_timeout_s:g}s"
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

    def _watch_teardown(self, now_s: float) -> None:
        """Warn about, or stop, ranks running on after every local rank finished training.

        `controller.teardown.teardown_step` decides; a stop takes the ranks' stacks first
        (where each hangs, in the log and the state directory), then stops the node's
        ranks as a restart does. Killed after their word, they count as finished at the
        next look, and the run completes. Ranks that outlive the stop are sent SIGKILL
        again every `controller.teardown.TEARDOWN_WARN_S`, with an error naming them.
        """
        rec = self.record
        running = [p.rank for p in rec.ranks if p.rank not in self.exits]
        every_done = all(self._said_done(p.rank) for p in rec.ranks)
        timeout_s = self.spec.teardown_timeout_s
        self.teardown, action = teardown_step(
            self.teardown, every_done=every_done, running=len(running), now_s=now_s,
            timeout_s=timeout_s,
        )  # fmt: skip
        if action is TeardownAction.WAIT:
            return
        since_s = self.teardown.since_s
        waited_s = 0.0 if since_s is None else now_s - since_s
        if action is TeardownAction.WARN:
            log.warning(
                "run %s incarnation %d: ranks %s still running %.0fs after every local rank "
                "finished training (a final save or upload, or a hang in the teardown)%s",
                self.run_id, rec.incarnation, running, waited_s,
                f"; stopped at {timeout_s:g}s" if timeout_s is not None
                else "; runwatch launch --teardown-timeout stops them",
            )  # fmt: skip
            return
        if action is TeardownAction.KILL:
            self._kill_again(running, now_s)
            return
        self._take_stacks(WHOLE_NODE)
        log.warning(
            "run %s incarnation %d: stopping ranks %s, still running %.0fs after every local "
            "rank finished training (--teardown-timeout %g)",
            self.run_id, rec.incarnation, running, waited_s, timeout_s,
        )  # fmt: skip
        self.launcher.stop(WHOLE_NODE, grace_s=self.spec.grace_s, kill_now=False)

    def _kill_again(self, running: list[int], now_s: float) -> None:
        """SIGKILL again the ranks that outlived the teardown stop, with an error naming them."""
        stopped_s = self.teardown.stopped_s
        log.error(
            "run %s incarnation %d: ranks %s outlived SIGKILL %.0fs ago (uninterruptible "
            "sleep, most often inside a driver call: this node needs a look); killing them "
            "again",
            self.run_id, self.record.incarnation, running,
            0.0 if stopped_s is None else now_s - stopped_s,
        )  # fmt: skip
        self.launcher.stop(WHOLE_NODE, grace_s=0.0, kill_now=True)

    def _finished(self, gone: RankExit) -> bool:
        """Whether a rank killed by a signal had said its training finished first."""
        if not gone.signalled:
            return False  # a clean exit needs no word; an exit code is the script's own
        return self._said_done(gone.rank)

    def _said_done(self, rank: int) -> bool:
        """Whether ``rank`` of the current incarnation wrote its done file (`rank_done`)."""
        return self.state.done_path(self.record.incarnation, rank).is_file()

    def _count_failure(self) -> tuple[int, ...]:
        """Charge this incarnation's failure to its culprits (once); return them."""
        blamed = culprits(list(self.exits.values()))
        counts = count_failures(self.record.failure_counts, blamed, self.record.world_size)
        self._save(failure_counts=counts)
        return blamed

    def _report_exit(self, gone: RankExit, pid: int) -> None:
        if gone.signal is not None:
            how = f"was killed by signal {gone.signal} ({_signal_name(gone.signal)})"
        elif gone.code is None:
            how = "exited with an unknown status"
        else:
            how = f"exited with code {gone.code}"
        if gone.finished:
            how += " after it finished training (its interpreter's teardown: not a fault)"
        # What the rank's @record entry point wrote (torchrun's TORCHELASTIC_ERROR_FILE)
        root_cause = (
            read_root_cause(self.state.error_path(self.record.incarnation, gone.rank))
            if gone.abnormal
            else ""
        )
        log.log(
            logging.WARNING if gone.code != 0 else logging.INFO,  # a teardown abort too
            "run %s incarnation %d: rank %d (pid %d) %s%s",
            self.run_id,
            self.record.incarnation,
            gone.rank,
            pid,
            how,
            f": {root_cause}" if root_cause else "",
        )
        if not self.spec.exit_evidence:
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
                    root_cause=root_cause,
                    launch_id=self.spec.run.launch_id,
                    finished=gone.finished,
                )
            )
        except Exception as exc:  # evidence is best effort: the silence timeout still holds
            log.warning("run %s: could not publish rank %d's exit: %s", self.run_id, gone.rank, exc)

    # ------------------------------------------------------------------ executing

    def execute(self, command: RestartRequested, received_s: float) -> None:
        """Execute a command the gate let through: record it, then carry out its plans.

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

    def _publish_failed(
        self, command: RestartRequested, reason: str, *, covered: bool = False
    ) -> None:
        """Tell the run its command was not carried out, and why (one line).

        ``covered``: a restart in progress already answers it (`RestartFailed.covered`).
        """
        self.publish(
            RestartFailed(
                run_id=self.run_id,
                ts_ns=time.time_ns(),
                command_id=command.command_id,
                reason=reason,
                covered=covered,
            )
        )

    def _restart(self, command: RestartRequested, received_s: float) -> None:
        """Carry out `controller.group_plan.plan_group`, else `controller.restart_plan`'s plans."""
        self.observe(time.monotonic())  # notice the exits before the stop hides them
        now_s = time.monotonic()
        healing = [
            g for g, at in self.group_restarts.items() if now_s - at < self.spec.command_timeout_s
        ]
        group = plan_group(
            command,
            self._replicas(),
            self._backend(),
            list(self.exits.values()),
            healing,
            cause_rank=self._cause_rank(command),
        )
        if group.verdict == "ignore":
            log.info("run %s: %s not for this node: %s", self.run_id, command.action, group.reason)
            return
        if group.verdict == "refuse":
            level = logging.INFO if group.covered else logging.WARNING
            log.log(level, "run %s: %s refused: %s", self.run_id, command.action, group.reason)
            self._publish_failed(command, group.reason, covered=group.covered)
            return
        if group.verdict == "groups":
            self._restart_groups(command, group.groups, group.reason, received_s)
            return
        if self.spec.fault_tolerance is not None:
            log.info("run %s: gang restart (rule %d: %s)", self.run_id, group.rule, group.reason)
        stop = plan_stop(
            command,
            self.record,
            list(self.exits.values()),
            found_dead=self.dead_since_s is not None,
            can_ask_peers=self.peers is not None,
        )
        if stop.blamed:
            self._save(stop.record)
            log.info("run %s: failure charged to ranks %s", self.run_id, list(stop.blamed))
        stacks = self._take_stacks(stop.scope) if captures_stacks(command.cause_kind) else ()
        log.info(
            "run %s: stopping incarnation %d (%s)",
            self.run_id,
            self.record.incarnation,
            "SIGKILL" if stop.kill_now else f"SIGTERM, {self.spec.grace_s:g}s grace, SIGKILL",
        )
        self.launcher.stop(stop.scope, grace_s=self.spec.grace_s, kill_now=stop.kill_now)
        self._report_pending(time.monotonic(), 0.0)
        if stop.give_up:
            self._give_up(command, stop.give_up)
            return
        heard = self._hear(command, stacks) if stop.ask_peers else None
        plan = plan_restart(command, self.spec, self.record, heard, stacks=stacks, host=HOST)
        self._carry_out(plan, command, received_s)

    def _replicas(self) -> ReplicaGroups | None:
        ft = self.spec.fault_tolerance
        if ft is None:
            return None
        node = self.record.topology
        per_node = ft.replica_groups // node.nnodes
        return ReplicaGroups(
            ft.replica_groups,
            ft.nproc_per_group,
            ft.min_replicas,
            bounded=ft.min_replicas_bound_s is not None,
            local=(
                tuple(range(node.node_rank * per_node, (node.node_rank + 1) * per_node))
                if node.nnodes > 1
                else None
            ),
        )

    def _cause_rank(self, command: RestartRequested) -> int | None:
        """The rank a ``respawn``'s verdict names, for replica groups on several nodes.

        Its exit may have been on another node (group plan rule 5); on one node the exits
        noticed here say it all, and nothing is read.
        """
        if (
            self.spec.fault_tolerance is None
            or self.peers is None
            or command.action != "respawn"
            or self.record.topology.nnodes == 1
        ):
            return None
        cause = self.peers.cause(command)
        return None if cause is None else cause.rank

    def _backend(self) -> BackendDeclaration | None:
        """What the run's backend declares: its RunStarted's as recorded, else the launch's."""
        if self.record.backend is not None:
            return self.record.backend
        ft = self.spec.fault_tolerance
        if ft is None:
            return None
        try:
            return training_backend_capabilities(ft.backend).declaration()
        except UnknownBackendError:
            return None

    def _restart_groups(
        self, command: RestartRequested, groups: tuple[int, ...], why: str, received_s: float
    ) -> None:
        """Stop and restart ``groups`` alone; the other groups keep their processes.

        The gang's incarnation goes on (no RunEnded, no RunStarted): the restarted groups
        heal from a live peer (no ``RUNWATCH_RESTART_FROM``).
        """
        scope = Scope(groups=groups)
        log.info("run %s: %s for groups %s: %s", self.run_id, command.action, list(groups), why)
        stacks = self._take_stacks(scope) if captures_stacks(command.cause_kind) else ()
        self.launcher.stop(scope, grace_s=self.spec.grace_s, kill_now=False)
        self._report_pending(time.monotonic(), 0.0)
        rec = self.record
        started = self.launcher.start(Incarnation(rec.incarnation, rec.topology, None), scope)
        per_group = self.spec.fault_tolerance.nproc_per_group if self.spec.fault_tolerance else 1
        restarted = {r for g in groups for r in range(g * per_group, (g + 1) * per_group)}
        for rank in restarted:  # their old processes' exits are history now
            self.exits.pop(rank, None)
            self.unreported.pop(rank, None)
        self.dead_since_s = None
        for g in groups:
            self.group_restarts[g] = time.monotonic()
        self._save(ranks=started.ranks)
        done = RestartCompleted(
            run_id=self.run_id,
            ts_ns=time.time_ns(),
            command_id=command.command_id,
            checkpoint_step=None,
            world_size=self.record.world_size,
            duration_s=round(time.monotonic() - received_s, 6),
            stacks=stacks,
            stacks_dir=str(self.state.stack_path(rec.incarnation, 0).parent) if stacks else "",
        )
        self.publish(done)
        log.info(
            "run %s: groups %s restarted in %.2fs (ranks %s, pids %s%s); they heal from a live "
            "peer",
            self.run_id,
            list(groups),
            done.duration_s,
            sorted(restarted),
            [p.pid for p in started.ranks if p.rank in restarted],
            f"; {started.warm} in warm spares" if started.warm else "",
        )

    def _take_stacks(self, scope: Scope) -> tuple[RankStack, ...]:
        """Where each rank of ``scope`` stood before the stop (logged on one line)."""
        stacks = self.launcher.take_stacks(scope, STACK_TIMEOUT_S)
        log.info(
            "run %s incarnation %d: before the stop, %s (stacks in %s)",
            self.run_id,
            self.record.incarnation,
            "; ".join(
                f"rank {s.rank} {'was in ' + s.where if s.where else s.note}" for s in stacks
            ),
            self.state.stack_path(self.record.incarnation, 0).parent,
        )
        return stacks

    def _hear(self, command: RestartRequested, stacks: tuple[RankStack, ...]) -> Heard:
        """Announce this agent ready for the next incarnation and hear the others.

        Publishes `schemas.events.AgentReady` (with this node's stacks), then waits up to
        ``node_timeout_s`` for the other nodes' and reads the run's backend declaration
        and the verdict the command names (`Peers`).
        """
        assert self.peers is not None  # plan_stop asks only when there are peers
        node = self.record.topology
        nxt = self.record.incarnation + 1
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
        log.info(
            "run %s: node %d of %d ready for incarnation %d; waiting up to %gs for the others",
            self.run_id,
            node.node_rank,
            node.nnodes,
            nxt,
            self.spec.node_timeout_s,
        )
        ready = self.peers.await_ready(self.run_id, nxt, node.nnodes, self.spec.node_timeout_s)
        return Heard(
            ready=dict(ready),
            backend=self.peers.backend(self.run_id),
            cause=self.peers.cause(command),
        )

    def _carry_out(self, plan: RestartPlan, command: RestartRequested, received_s: float) -> None:
        """Execute `controller.restart_plan.plan_restart`'s plan: persist, launch, report."""
        for note in plan.notes:
            _log_note(self.run_id, note)
        old = self.record
        if plan.verdict == "fail":
            self._save(plan.record)
            self._give_up(command, plan.reason)
            return
        if plan.verdict == "drop":
            log.warning(
                "run %s: %s; this agent stops (its ranks stay down) and the run goes on without it",
                self.run_id,
                plan.reason,
            )
            self._save(plan.record)
            return
        if plan.speaks:
            self.announce_end(
                old, "stopped", f"controller: {command.action} for command {command.command_id}"
            )
        resume = resolve_resume(self.spec.run.checkpoint_dir, command.max_checkpoint_step)
        self._save(plan.record)
        self.launch(resume, plan.start)
        if not plan.speaks:  # node 0's agent reports the gang's restart
            log.info(
                "run %s: node %d restarted into incarnation %d from checkpoint %s",
                self.run_id,
                old.topology.node_rank,
                self.record.incarnation,
                resume.step,
            )
            return
        done = RestartCompleted(
            run_id=self.run_id,
            ts_ns=time.time_ns(),
            command_id=command.command_id,
            checkpoint_step=resume.step,
            checkpoint_path=resume.path,
            world_size=self.record.world_size,
            duration_s=round(time.monotonic() - received_s, 6),
            stacks=plan.stacks,
            stacks_dir=str(self.state.stack_path(old.incarnation, 0).parent) if plan.stacks else "",
        )
        self.publish(done)
        log.info(
            "run %s: %s completed in %.2fs: incarnation %d, %d ranks, from checkpoint %s",
            self.run_id,
            command.action,
            done.duration_s,
            self.record.incarnation,
            done.world_size,
            resume.step,
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
        log.info("run %s: stopping the gang (the controller was asked to stop)", self.run_id)
        self.launcher.stop(WHOLE_NODE, grace_s=self.spec.grace_s, kill_now=False)
        self.close()
        self._save(status="failed")


__all__ = [
    "EXIT_HOLD_S",
    "HOST",
    "AnnounceEnd",
    "Peers",
    "Publish",
    "RunSupervisor",
    "captures_stacks",
]
