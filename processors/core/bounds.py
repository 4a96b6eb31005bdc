"""Bounds on what one record may claim: steps, step jumps and incarnation jumps.

A trainer's credential may write any record to the input topics, for any run. The schema
already refuses what no event can mean (a negative step, an integer past int64); these are
the bounds that need the run's state to judge. A record past one is refused by the fold
(`BoundError`, a ``ValueError``), so the shared fold (`processors.core.replay`) makes it a
dead letter (stage ``fold``, the reason naming the bound) and the run's state stays as it
was. docs/core.md, "Records that steer decisions", has the reasoning.
"""

from __future__ import annotations

from typing import Final

MAX_STEP: Final = 2**53
"""Steps are below this (exact as a float; a run at a step a millisecond takes 285,000
years to reach it), so a state's step arithmetic (``step + threshold``) stays inside int64."""
MAX_STEP_JUMP: Final = 1_000_000
"""Most steps one event may lie ahead of the newest step its run reported (a million: far
more than any gap of dropped or rate-limited heartbeats, far less than int64)."""
MAX_INCARNATION_JUMP: Final = 1_000
"""Most incarnations one event may lie ahead of its run's current one (a new run's first
event: ahead of 0). A controller counts one per restart, and the restart budget allows a
few per thousand steps, so a thousand restarts are not a jump anyone makes."""


class BoundError(ValueError):
    """A record claims something past a bound of this module; its fold refuses it."""


def check_step(step: int, newest: int, what: str = "step") -> None:
    """Refuse a step outside ``[0, MAX_STEP)`` or more than `MAX_STEP_JUMP` past ``newest``.

    Rules, in order:
        1. A step outside ``[0, MAX_STEP)`` is refused.
        2. With no step known for the run (``newest < 0``), any other step is accepted.
        3. A step more than `MAX_STEP_JUMP` past ``newest`` is refused.

    Args:
        step: The step the record claims.
        newest: The newest step known for the run (-1: none).
        what: What the step is, for the reason.

    Raises:
        BoundError: A rule refused it.
    """
    if not 0 <= step < MAX_STEP:
        raise BoundError(f"step_range: {what} {step} outside [0, 2**53)")
    if newest < 0:
        return
    if step - newest > MAX_STEP_JUMP:
        raise BoundError(
            f"step_jump: {what} {step} is {step - newest} past the run's newest step "
            f"{newest} (bound {MAX_STEP_JUMP})"
        )


def check_incarnation(incarnation: int, current: int, what: str = "incarnation") -> None:
    """Refuse an incarnation more than `MAX_INCARNATION_JUMP` past ``current``.

    Args:
        incarnation: The incarnation the record claims.
        current: The run's current incarnation (a run not seen yet: 0).
        what: What carries it, for the reason.

    Raises:
        BoundError: It jumps too far.
    """
    if incarnation - max(current, 0) > MAX_INCARNATION_JUMP:
        raise BoundError(
            f"incarnation_jump: {what} {incarnation} is {incarnation - max(current, 0)} past "
            f"the run's incarnation {max(current, 0)} (bound {MAX_INCARNATION_JUMP})"
        )


__all__ = [
    "MAX_INCARNATION_JUMP",
    "MAX_STEP",
    "MAX_STEP_JUMP",
    "BoundError",
    "check_incarnation",
    "check_step",
]
