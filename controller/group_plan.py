"""Group restart or gang restart: the pure decision for a run of replica groups (torchft).

`controller.supervisor.RunSupervisor` asks `plan_group` before anything else about a
command; it reads no clock, disk or Kafka. A **group restart** stops and restarts the
named replica groups alone (`controller.launcher.Scope` with groups): the other groups keep
stepping with a smaller quorum, and the restarted ones heal from a live peer; the gang's
incarnation goes on. Otherwise the command takes the gang path
(`controller.restart_plan`), as for every run without replica groups.

The rules, in order (each a guard clause with its number):

1. The run has no replica groups (launched without ``--fault-tolerance``): the gang path;
   a ``respawn_group`` is refused (there is no group to restart alone).
2. A ``rollback`` (NaN, divergence): the gang path: every group rolls back from DCP. A
   ``respawn`` for ``replicas_below_min`` (the steps stayed below ``--min-replicas`` for
   longer than ``--min-replicas-bound-s`` of log time): the gang path too, whatever group
   restarts are healing (they did not come back in time).
3. The backend does not declare ``per_step_fault_tolerance`` (the run's RunStarted as last
   recorded, else the backend the launch named): the gang path; a ``respawn_group`` is
   refused. A backend that does not declare it is never asked to heal.
4. ``respawn_group``: the group the command names (refused when there is no such group).
5. ``respawn`` (a dead rank, a hang): the groups of the ranks that exited abnormally on
   this node, and on several nodes the group of the rank the command's verdict names (it
   may have exited on another node; not when that group is healing). None, but groups
   restarted alone lately are still healing: refused as *covered*
   (`RestartFailed.covered`: the verdict is their silence while they start and heal: a
   ``replica_lost`` seen before the exit evidence, or a dead-rank timeout shorter than a
   heal; a gang restart would throw away what the group restart saves, and nobody is
   paged for it). None and none healing (a hang): the gang path.
6. Every group would be down, or fewer groups than ``--min-replicas`` would go on stepping
   while the restarted ones heal: the run cannot commit a step meanwhile: escalate to the
   gang path. With ``--min-replicas-bound-s`` only every group down escalates here: the
   survivors may step below the floor for the bound, and the step reducer's
   ``replicas_below_min`` (rule 2) escalates a heal that takes longer. Every agent counts
   the run's groups, and this rule comes before rule 7, so on several nodes every agent
   takes the gang path together (one that ignored the command would leave the gang
   restart waiting for it).
7. Several nodes, and none of those groups is this node's: **ignore** the command (each
   agent reads every command; the agent that owns the groups restarts them and answers
   for it; no RestartFailed from this one). Some of them are: this node restarts its own.
8. Otherwise: restart those groups alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from runwatch.controller.elastic import RankExit
from runwatch.schemas.events import BackendDeclaration, RestartRequested

GroupVerdict = Literal["gang", "groups", "refuse", "ignore"]


@dataclass(frozen=True)
class ReplicaGroups:
    """The run's replica groups, as launched, and which are this node's.

    Attributes:
        groups: How many (``--replica-groups``).
        nproc_per_group: Ranks per group (global rank = group x this + rank in group).
        min_replicas: Fewest groups a step may commit with (``--min-replicas``).
        bounded: ``--min-replicas-bound-s`` was given: the survivors may step below
            ``min_replicas`` for that long (log time) before the gang restarts
            (``replicas_below_min``), so rule 6 escalates only when no group would step.
        local: The groups this node's agent owns (several nodes); None: every group.
    """

    groups: int
    nproc_per_group: int
    min_replicas: int
    bounded: bool = False
    local: tuple[int, ...] | None = None

    def owns(self, group: int) -> bool:
        """Whether ``group`` is this node's."""
        return self.local is None or group in self.local


@dataclass(frozen=True)
class GroupPlan:
    """What `plan_group` decided.

    Attributes:
        verdict: ``groups`` (restart `groups` alone), ``gang`` (the gang path),
            ``refuse`` (RestartFailed with `reason`; the run goes on as it is) or
            ``ignore`` (another node's agent restarts the groups; nothing to say).
        groups: The groups to restart (``groups`` only).
        reason: Why, in one line (logged; the RestartFailed reason for ``refuse``).
        rule: The rule that decided.
        covered: A ``refuse`` because group restarts in progress already answer the
            command (rule 5): the RestartFailed says so (`RestartFailed.covered`), and no
            one is paged for it.
    """

    verdict: GroupVerdict
    groups: tuple[int, ...] = ()
    reason: str = ""
    rule: int = 0
    covered: bool = False


def plan_group(
    command: RestartRequested,
    replicas: ReplicaGroups | None,
    backend: BackendDeclaration | None,
    exits: Sequence[RankExit],
    healing: Sequence[int] = (),
    cause_rank: int | None = None,
) -> GroupPlan:
    """Group restart or gang restart for ``command``; see the module doc's rules.

    Args:
        command: The verified command.
        replicas: The run's replica groups; None: it has none.
        backend: What the run's backend declares (None: nothing known).
        exits: The exits noticed in the current incarnation.
        healing: Groups restarted alone lately (the supervisor's bound), maybe still healing.
        cause_rank: On several nodes, the rank the command's verdict names (None: one node,
            no rank, or the verdict unread).

    Returns:
        The plan.
    """
    asked_group = command.action == "respawn_group"
    if replicas is None:  # rule 1
        if asked_group:
            return GroupPlan("refuse", reason="the run has no replica groups", rule=1)
        return GroupPlan("gang", reason="no replica groups", rule=1)
    if command.action == "rollback":  # rule 2
        return GroupPlan("gang", reason="a rollback restarts every group from DCP", rule=2)
    if command.cause_kind == "replicas_below_min":  # rule 2
        reason = "the steps stayed below --min-replicas for longer than the bound"
        return GroupPlan("gang", reason=reason, rule=2)
    if backend is None or not backend.per_step_fault_tolerance:  # rule 3
        name = "the run's backend" if backend is None else f"backend {backend.name}"
        reason = f"{name} does not declare per_step_fault_tolerance"
        return GroupPlan("refuse" if asked_group else "gang", reason=reason, rule=3)
    if asked_group:  # rule 4
        group = command.replica_group
        if group is None or not 0 <= group < replicas.groups:
            reason = f"no replica group {group} (groups 0..{replicas.groups - 1})"
            return GroupPlan("refuse", reason=reason, rule=4)
        chosen: tuple[int, ...] = (group,)
    else:  # rule 5
        named = {cause_rank // replicas.nproc_per_group} if cause_rank is not None else set()
        named -= set(healing)  # its silence while it heals, as above
        exited = {e.rank // replicas.nproc_per_group for e in exits if e.abnormal}
        chosen = tuple(sorted(g for g in exited | named if 0 <= g < replicas.groups))
        if not chosen and healing:
            reason = f"no rank exited and groups {sorted(healing)} are healing"
            return GroupPlan("refuse", reason=reason, rule=5, covered=True)
        if not chosen:
            return GroupPlan("gang", reason="no rank exited: the whole run is stuck", rule=5)
    left = replicas.groups - len(chosen)
    floor = 1 if replicas.bounded else max(1, replicas.min_replicas)
    if left < floor:  # rule 6
        reason = (
            f"restarting groups {list(chosen)} leaves {left} of {replicas.groups} stepping, "
            f"below --min-replicas {replicas.min_replicas}: gang restart"
        )
        return GroupPlan("gang", reason=reason, rule=6)
    mine = tuple(g for g in chosen if replicas.owns(g))
    if not mine:  # rule 7
        reason = f"groups {list(chosen)} are another node's: its agent restarts them"
        return GroupPlan("ignore", groups=chosen, reason=reason, rule=7)
    return GroupPlan(  # rule 8
        "groups",
        groups=mine,
        reason=f"groups {list(mine)} restart alone; {left} of {replicas.groups} go on",
        rule=8,
    )


__all__ = ["GroupPlan", "GroupVerdict", "ReplicaGroups", "plan_group"]
