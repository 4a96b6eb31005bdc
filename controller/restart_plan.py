"""How a verified restart command is carried out on this node: a pure plan, in two steps.

`controller.supervisor.RunSupervisor` executes what these functions decide (it stops,
publishes, waits for the other agents, persists and launches); they read no clock, no
disk and no Kafka. A restart is decided in two steps because a multi-node agent has to
hear from the other agents between them, after its own ranks stopped.

**Before the stop** (`plan_stop`), the rules in order:

1. Charge the failure: when the command arrived before the gang was found dead (exit
   evidence is faster than the peers' failure in their next collective) and an exit
   noticed so far was abnormal, the culprits of those exits (`controller.elastic.culprits`)
   get one failure each. Only exits noticed before the stop count, never the stop's own;
   a gang found dead was charged when it was found.
2. Stop the whole gang on this node: a ``rollback`` SIGKILLs at once (a rank that
   checkpoints on SIGTERM would write the poisoned state the rollback escapes), anything
   else gets SIGTERM, ``--grace-s``, SIGKILL.
3. ``--max-restarts M`` reached (the gang is at incarnation M or later): after the stop,
   **give up** (RestartFailed, RunEnded ``failed``); no other agent is told.
4. Several nodes and someone to ask: announce this agent ready for the next incarnation
   (with its ranks' stacks) and hear the others (`Heard`) before `plan_restart`.
5. Otherwise go on to `plan_restart` with nothing heard.

Whether the ranks are asked for their stacks before the stop is a fact of the command's
cause (`controller.supervisor.captures_stacks`), not a rule here.

**After the stop** (`plan_restart`), the rules in order:

1. Nothing heard (one node, or no one to ask): the same nodes; go to rule 6.
2. Charge the restart to the node of the rank its verdict names
   (`controller.membership.charge_failure`) and decide the next incarnation's nodes from
   the agents heard, this one included (`controller.membership.decide_nodes`: full size,
   fewer nodes, or fail; the backend is the latest declaration heard, else the one
   recorded).
3. The node decision is ``fail``: **fail** with its reason.
4. This node is not among the next incarnation's nodes: **drop** it: its agent stops, its
   ranks stay down, the run goes on on the others (the next node 0 speaks for it).
5. Fewer nodes: this node takes its rank among the nodes left; when node 0 was dropped,
   the first node left serves the rendezvous store at the host its AgentReady named (this
   agent's host when it named none).
6. The world size: on several nodes the nodes' (a shrink resets the rank failure counts;
   a command's ``world_size`` is not obeyed, said in a note); on one node
   `controller.elastic.next_world_size` (the command's size wins, else a rank over its
   ``--rank-failure-budget`` costs the gang one rank, never below ``--min-nproc``).
7. **restart** the whole gang on this node into incarnation + 1; node 0 of the next
   incarnation speaks for the gang: it announces the old incarnation's end (RunEnded
   ``stopped``) and the RestartCompleted, with every node's stacks by rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec

from runwatch.controller.elastic import (
    RankExit,
    SizeDecision,
    count_failures,
    culprits,
    next_world_size,
)
from runwatch.controller.launcher import WHOLE_NODE, Scope
from runwatch.controller.membership import charge_failure, decide_nodes
from runwatch.controller.state import GangRecord, LaunchSpec
from runwatch.controller.topology import NodeTopology
from runwatch.schemas.events import (
    AgentReady,
    AnomalyDetected,
    BackendDeclaration,
    RankStack,
    RestartRequested,
)

NoteLevel = Literal["info", "warning"]
RestartVerdict = Literal["restart", "fail", "drop"]


@dataclass(frozen=True)
class Note:
    """A line the executor logs: ``info`` for what it does, ``warning`` for trouble."""

    level: NoteLevel
    text: str


@dataclass(frozen=True)
class StopPlan:
    """What to do before and at the stop (`plan_stop`).

    Attributes:
        record: The gang record with the failure charged (rule 1); the one given when
            nothing was charged.
        blamed: The ranks charged by rule 1 (empty: none).
        scope: The processes to stop (rule 2: the whole node).
        kill_now: SIGKILL at once (rule 2).
        give_up: Rule 3's reason (empty: go on).
        ask_peers: Rule 4: announce this agent and hear the others first.
    """

    record: GangRecord
    blamed: tuple[int, ...]
    scope: Scope
    kill_now: bool
    give_up: str = ""
    ask_peers: bool = False


@dataclass(frozen=True)
class Heard:
    """What the other agents of a multi-node gang said, gathered after the stop.

    Attributes:
        ready: The AgentReady announcements for the next incarnation, by node rank
            (this agent's own may be among them).
        backend: The run's latest backend declaration heard (None: none heard).
        cause: The verdict the command names (None: it could not be read).
    """

    ready: Mapping[int, AgentReady]
    backend: BackendDeclaration | None = None
    cause: AnomalyDetected | None = None


@dataclass(frozen=True)
class RestartPlan:
    """What to do after the stop (`plan_restart`).

    Attributes:
        verdict: ``restart``, ``fail`` (RestartFailed, RunEnded ``failed``) or ``drop``
            (this agent ends, its ranks stay down, nothing more is published).
        record: The gang record to persist: the next incarnation's for ``restart`` (no
            ranks yet), the current one with what was learnt (backend, node counts) and
            the status ``dropped`` for ``drop``, with what was learnt for ``fail``.
        reason: One line for ``fail`` and ``drop``; empty for ``restart``.
        speaks: Node 0 of the next incarnation: announce the old incarnation's end and
            the RestartCompleted.
        start: The processes to start (the whole node).
        stacks: This node's rank stacks, and every other node's heard, by rank.
        notes: Lines to log, in order.
    """

    verdict: RestartVerdict
    record: GangRecord
    reason: str = ""
    speaks: bool = False
    start: Scope = WHOLE_NODE
    stacks: tuple[RankStack, ...] = ()
    notes: tuple[Note, ...] = ()


def plan_stop(
    command: RestartRequested,
    record: GangRecord,
    exits: Sequence[RankExit],
    *,
    found_dead: bool,
    can_ask_peers: bool,
) -> StopPlan:
    """Decide what happens before and at the stop; see the module doc's rules.

    Args:
        command: The verified command being executed.
        record: The gang record now.
        exits: The exits noticed in the current incarnation (none of the stop's).
        found_dead: The whole gang was found dead before the command came (its failure
            was charged then).
        can_ask_peers: Someone hears the other agents of a multi-node gang.

    Returns:
        The plan.
    """
    blamed: tuple[int, ...] = ()
    if not found_dead and any(e.abnormal for e in exits):  # rule 1
        blamed = culprits(exits)
        counts = count_failures(record.failure_counts, blamed, record.world_size)
        record = msgspec.structs.replace(record, failure_counts=counts)
    kill_now = command.action == "rollback"  # rule 2
    limit = record.topology.max_restarts
    if limit is not None and record.incarnation >= limit:  # rule 3
        reason = f"--max-restarts {limit} reached (after {record.incarnation})"
        return StopPlan(record, blamed, WHOLE_NODE, kill_now, give_up=reason)
    several = record.topology.nnodes > 1 and can_ask_peers  # rule 4
    return StopPlan(record, blamed, WHOLE_NODE, kill_now, ask_peers=several)  # rule 5


def merge_stacks(
    local: tuple[RankStack, ...], announced: Iterable[AgentReady]
) -> tuple[RankStack, ...]:
    """Every node's rank stacks, by rank: this node's, then those the other agents announced.

    Args:
        local: This node's.
        announced: The other nodes' AgentReady for the same restart.

    Returns:
        One entry per rank (this node's own entry wins over a repeated rank), in rank order.
    """
    by_rank = {s.rank: s for ready in announced for s in ready.stacks}
    by_rank.update({s.rank: s for s in local})
    return tuple(by_rank[r] for r in sorted(by_rank))


def plan_restart(
    command: RestartRequested,
    spec: LaunchSpec,
    record: GangRecord,
    heard: Heard | None,
    *,
    stacks: tuple[RankStack, ...],
    host: str,
) -> RestartPlan:
    """Decide the rest of a restart after the stop; see the module doc's rules.

    Args:
        command: The verified command being executed.
        spec: What was asked (budgets, timeouts).
        record: The gang record after `plan_stop`.
        heard: What the other agents said (`plan_stop` rule 4); None: nothing asked.
        stacks: Where this node's ranks were before the stop (empty: not asked).
        host: This agent's host (rule 5).

    Returns:
        The plan.
    """
    if heard is None:  # rule 1
        return _restart(command, spec, record, record.topology, stacks, ())
    return _plan_nodes(command, spec, record, heard, stacks, host)


def _plan_nodes(
    command: RestartRequested,
    spec: LaunchSpec,
    record: GangRecord,
    heard: Heard,
    stacks: tuple[RankStack, ...],
    host: str,
) -> RestartPlan:
    """Rules 2 to 5: which nodes go on, from what the agents heard."""
    node = record.topology
    backend = heard.backend or record.backend
    record = msgspec.structs.replace(record, backend=backend)
    nodes_heard = {*heard.ready, node.node_rank}
    others = [r for n, r in heard.ready.items() if n != node.node_rank]
    stacks = merge_stacks(stacks, others)
    failures = charge_failure(  # rule 2
        record.node_failure_counts,
        nnodes=node.nnodes,
        nproc_per_node=node.nproc_per_node,
        command=command,
        verdict=heard.cause,
        ready=nodes_heard,
    )
    notes: list[Note] = []
    if sum(failures) > sum(record.node_failure_counts):  # a node was charged
        notes.append(
            Note(
                "info",
                f"failures per node {list(failures)} (--node-failure-budget "
                f"{spec.node_failure_budget})",
            )
        )
    decision = decide_nodes(
        node.nnodes,
        nodes_heard,
        min_nnodes=node.min_nnodes,
        backend=backend,
        timeout_s=spec.node_timeout_s,
        failures=failures,
        failure_budget=spec.node_failure_budget,
    )
    if decision.verdict == "fail":  # rule 3
        return RestartPlan("fail", record, decision.reason, stacks=stacks, notes=tuple(notes))
    if node.node_rank not in decision.nodes:  # rule 4
        dropped = msgspec.structs.replace(record, node_failure_counts=failures, status="dropped")
        why = (
            f"node {node.node_rank} of {node.nnodes} dropped from incarnation "
            f"{record.incarnation + 1}: {decision.reason}"
        )
        return RestartPlan("drop", dropped, why, stacks=stacks, notes=tuple(notes))
    record = msgspec.structs.replace(record, node_failure_counts=decision.counts(failures))
    if decision.verdict == "full":
        if decision.reason:  # a failing node kept: says why
            notes.append(Note("warning", f"elastic by nodes: {decision.reason}"))
        return _restart(command, spec, record, node, stacks, notes)
    first = decision.nodes[0]  # rule 5
    addr = node.master_addr
    if first != 0:  # node 0 was dropped: the first node left serves the rendezvous store
        announced = heard.ready.get(first)
        addr = announced.host if announced is not None and announced.host else host
    notes.append(Note("warning", f"elastic by nodes: {decision.reason}"))
    smaller = msgspec.structs.replace(
        node,
        nnodes=len(decision.nodes),
        node_rank=decision.new_rank(node.node_rank),
        master_addr=addr,
    )
    return _restart(command, spec, record, smaller, stacks, notes)


def _next_size(
    command: RestartRequested, spec: LaunchSpec, record: GangRecord, topology: NodeTopology
) -> tuple[SizeDecision, tuple[Note, ...]]:
    """Rule 6: the next world size, and what to say about it."""
    now = record.topology
    if now.nnodes > 1:
        if topology.nnodes != now.nnodes:
            reason = (
                f"{now.nnodes} -> {topology.nnodes} nodes: {now.world_size} -> "
                f"{topology.world_size} ranks"
            )
            return SizeDecision(topology.world_size, (0,) * topology.world_size, reason), ()
        notes: tuple[Note, ...] = ()
        if command.world_size not in (None, now.world_size):
            notes = (
                Note(
                    "warning",
                    f"command asks for {command.world_size} ranks; a gang of {now.nnodes} "
                    f"nodes restarts at its size ({now.world_size})",
                ),
            )
        return SizeDecision(now.world_size, record.failure_counts), notes
    size = next_world_size(
        now.world_size,
        record.failure_counts,
        budget=spec.rank_failure_budget,
        min_nproc=spec.min_nproc,
        requested=command.world_size,
    )
    return size, ()


def _restart(
    command: RestartRequested,
    spec: LaunchSpec,
    record: GangRecord,
    topology: NodeTopology,
    stacks: tuple[RankStack, ...],
    notes: Sequence[Note],
) -> RestartPlan:
    """Rules 6 and 7: size the next incarnation and restart into it."""
    size, said = _next_size(command, spec, record, topology)
    notes = [*notes, *said]
    if size.reason:
        notes.append(Note("warning", f"elastic: {size.reason}"))
    if topology.nnodes == 1:  # one node: the gang is this node's ranks, however many now
        topology = msgspec.structs.replace(topology, nproc_per_node=size.world_size)
    nxt = msgspec.structs.replace(
        record,
        incarnation=record.incarnation + 1,
        topology=topology,
        failure_counts=size.counts,
        ranks=(),
    )
    return RestartPlan(
        "restart",
        nxt,
        speaks=topology.node_rank == 0,
        stacks=stacks,
        notes=tuple(notes),
    )


__all__ = [
    "Heard",
    "Note",
    "NoteLevel",
    "RestartPlan",
    "RestartVerdict",
    "StopPlan",
    "merge_stacks",
    "plan_restart",
    "plan_stop",
]
