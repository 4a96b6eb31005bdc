"""Replica groups of a per-step fault-tolerant run (torchft): who is in each step's quorum.

A torchft run reports each committed step once (the quorum's first group), with the
replica groups whose gradients the step averaged (``StepCompleted.participants``). From
those alone, in the steps partition's order (ARCHITECTURE rule 1):

* a group seen in an earlier step's quorum and missing from this one is **lost**: one
  ``replica_lost`` verdict naming it (the policy asks ``respawn_group`` for it), then
  nothing more about it until it is back;
* a lost group back in a step's quorum has **rejoined** (healed from a live peer):
  ``replica_rejoined`` (information);
* a step with fewer groups than the run has had is **degraded**: counted, with its step
  time, per run (the receipt's degraded steps and time; tokens/s and MFU already count
  what the step's ``tokens`` say was computed).

* a run whose steps' quorums have had fewer groups than its floor (``min_replicas``, the
  run's threshold) for longer than ``min_replicas_bound_s`` of log time is **below min**:
  one ``replicas_below_min`` verdict (critical; the policy escalates it to a gang restart,
  whatever group restarts came before), then nothing more until a step's quorum is back
  at the floor.

Steps without participants (no replica groups) leave the tally as it is. A step at or
below the last one counted (another group's report of it, or a step redone after a
rollback) is judged for membership but not counted twice.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from runwatch.schemas.events import AnomalyKind, StepCompleted


class ReplicaTally(msgspec.Struct, frozen=True, gc=False):
    """What the step reducer knows of a run's replica groups.

    Attributes:
        groups: Every group seen in a step's quorum, ascending.
        lost: Groups lost and not back yet, ascending.
        last_step: The last step counted (-1: none).
        steps: Steps with participants counted.
        degraded_steps: Those with fewer groups than ``groups``.
        degraded_time_s: Their step time, summed.
        lost_verdicts: ``replica_lost`` verdicts raised.
        rejoined_verdicts: ``replica_rejoined`` verdicts raised.
        below_since_ns: Log time of the first step of the current stretch below the floor
            (-1: at or above it; `BELOW_RAISED`: its verdict is raised).
        below_verdicts: ``replicas_below_min`` verdicts raised.
    """

    groups: tuple[int, ...] = ()
    lost: tuple[int, ...] = ()
    last_step: int = -1
    steps: int = 0
    degraded_steps: int = 0
    degraded_time_s: float = 0.0
    lost_verdicts: int = 0
    rejoined_verdicts: int = 0
    below_since_ns: int = -1
    below_verdicts: int = 0


BELOW_RAISED = -2
"""``ReplicaTally.below_since_ns`` once the stretch below the floor has its verdict."""

Emit = Callable[[AnomalyKind, int | None, str], None]
"""``(kind, replica_group, detail)``: raise a verdict about the current step (group None:
the run's)."""


class Floor(msgspec.Struct, frozen=True, gc=False):
    """The run's floor of replica groups (its thresholds).

    Attributes:
        min_replicas: Fewest groups a step's quorum should have; 0: no floor.
        bound_s: How long, in log time, the steps may stay below it.
    """

    min_replicas: int = 0
    bound_s: float = 300.0


NO_FLOOR = Floor()


def fold_replicas(
    tally: ReplicaTally, event: StepCompleted, emit: Emit, floor: Floor = NO_FLOOR
) -> ReplicaTally:
    """Apply one step's participants, by numbered rules.

    1. No participants: the step says nothing of replica groups; unchanged.
    2. Each group known and not in this quorum, not already lost: ``replica_lost``.
    3. Each lost group in this quorum: ``replica_rejoined``.
    4. A step above the last counted is counted, degraded when its quorum is smaller than
       the groups known (this one's included).
    5. The floor (`below_floor`): a quorum below it for longer than its bound raises
       ``replicas_below_min`` once per stretch.

    Args:
        tally: The run's tally.
        event: The step.
        emit: Raises a verdict (the caller gives it identity, provenance and log time).
        floor: The run's floor of groups (default: none).

    Returns:
        The new tally.
    """
    here = frozenset(event.participants)
    if not here:  # rule 1
        return tally
    known = frozenset(tally.groups) | here
    lost = set(tally.lost)
    for group in sorted(known - here - lost):  # rule 2
        lost.add(group)
        emit(
            "replica_lost",
            group,
            f"replica group {group} is not in step {event.step}'s quorum "
            f"({len(here)} of {len(known)} groups stepping: {sorted(here)})",
        )
    back = sorted(lost & here)
    for group in back:  # rule 3
        lost.discard(group)
        emit(
            "replica_rejoined",
            group,
            f"replica group {group} is back in step {event.step}'s quorum "
            f"({len(here)} of {len(known)} groups stepping)",
        )
    counted = event.step > tally.last_step  # rule 4
    degraded = counted and len(here) < len(known)
    since = below_floor(tally.below_since_ns, event, len(here), floor, emit)  # rule 5
    return ReplicaTally(
        groups=tuple(sorted(known)),
        lost=tuple(sorted(lost)),
        last_step=max(tally.last_step, event.step),
        steps=tally.steps + counted,
        degraded_steps=tally.degraded_steps + degraded,
        degraded_time_s=tally.degraded_time_s + (event.step_time_s if degraded else 0.0),
        lost_verdicts=tally.lost_verdicts + len(known - here - set(tally.lost)),
        rejoined_verdicts=tally.rejoined_verdicts + len(back),
        below_since_ns=since,
        below_verdicts=tally.below_verdicts + (since == BELOW_RAISED != tally.below_since_ns),
    )


def below_floor(
    since_ns: int, event: StepCompleted, stepping: int, floor: Floor, emit: Emit
) -> int:
    """The stretch below the floor after ``event``, by numbered rules.

    1. No floor, or this step's quorum is at or above it: the stretch (if any) ends (-1).
    2. The stretch's verdict is raised: nothing more until it ends.
    3. A stretch starts at this step's log time.
    4. Below for longer than the bound (log time, first step of the stretch to this
       one): ``replicas_below_min``, once.

    Args:
        since_ns: ``ReplicaTally.below_since_ns`` before this step.
        event: The step.
        stepping: Groups in its quorum.
        floor: The run's floor.
        emit: Raises the verdict.

    Returns:
        The new ``below_since_ns``.
    """
    if floor.min_replicas <= 0 or stepping >= floor.min_replicas:  # rule 1
        return -1
    if since_ns == BELOW_RAISED:  # rule 2
        return since_ns
    if since_ns < 0:  # rule 3
        return event.ts_ns
    below_s = (event.ts_ns - since_ns) / 1e9
    if below_s <= floor.bound_s:
        return since_ns
    emit(  # rule 4
        "replicas_below_min",
        None,
        f"{stepping} replica groups in step {event.step}'s quorum, below --min-replicas "
        f"{floor.min_replicas} for {below_s:.1f} s of log time (bound {floor.bound_s:g} s): "
        "gang restart",
    )
    return BELOW_RAISED


__all__ = [
    "BELOW_RAISED",
    "NO_FLOOR",
    "Emit",
    "Floor",
    "ReplicaTally",
    "below_floor",
    "fold_replicas",
]
