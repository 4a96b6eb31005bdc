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
    """

    groups: tuple[int, ...] = ()
    lost: tuple[int, ...] = ()
    last_step: int = -1
    steps: int = 0
    degraded_steps: int = 0
    degraded_time_s: float = 0.0
    lost_verdicts: int = 0
    rejoined_verdicts: int = 0


Emit = Callable[[AnomalyKind, int, str], None]
"""``(kind, replica_group, detail)``: raise a verdict about the current step."""


def fold_replicas(tally: ReplicaTally, event: StepCompleted, emit: Emit) -> ReplicaTally:
    """Apply one step's participants, by numbered rules.

    1. No participants: the step says nothing of replica groups; unchanged.
    2. Each group known and not in this quorum, not already lost: ``replica_lost``.
    3. Each lost group in this quorum: ``replica_rejoined``.
    4. A step above the last counted is counted, degraded when its quorum is smaller than
       the groups known (this one's included).

    Args:
        tally: The run's tally.
        event: The step.
        emit: Raises a verdict (the caller gives it identity, provenance and log time).

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
    return ReplicaTally(
        groups=tuple(sorted(known)),
        lost=tuple(sorted(lost)),
        last_step=max(tally.last_step, event.step),
        steps=tally.steps + counted,
        degraded_steps=tally.degraded_steps + degraded,
        degraded_time_s=tally.degraded_time_s + (event.step_time_s if degraded else 0.0),
        lost_verdicts=tally.lost_verdicts + len(known - here - set(tally.lost)),
        rejoined_verdicts=tally.rejoined_verdicts + len(back),
    )


__all__ = ["Emit", "ReplicaTally", "fold_replicas"]
