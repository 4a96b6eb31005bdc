"""Restart continuity: is a resumed run the run that was checkpointed?

A resume from the checkpoint of step S should continue the loss curve where it stood at S.
A resume that dropped optimizer state (Adam moments back to zero) or RNG state often
matches the first step (same weights) and drifts over the next few. So the first
``restart_check_steps`` steps after a restart marker are each judged against the loss
baseline frozen as it stood at S, and the check fails when one step, or the cumulative
evidence of the steps so far (Stouffer's sum of z over sqrt(n)), rises above the
threshold. The check is one-sided: a resumed loss *below* the old baseline is what a
healthy, still-improving run produces.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

ContinuityVerdict = Literal["pending", "ok", "broken", "unchecked"]


class RestartRecord(msgspec.Struct, frozen=True, gc=False):
    """One observed resume and its continuity verdict.

    Attributes:
        at_step: The first step after the resume.
        from_step: The checkpoint step resumed from.
        incarnation: The gang incarnation of the resumed run.
        ts_ns: Log time of the first step after the resume.
        marked: True for a restart marker, False for steps seen again without one.
        verdict: ``pending`` while being checked, ``ok``, ``broken``, or ``unchecked``
            (no baseline existed at the resumed step, or the check is disabled).
        checked_steps: Steps judged so far.
        max_z: Largest per-step z seen.
        cumulative_z: Sum of z over sqrt(checked_steps).
    """

    at_step: int
    from_step: int
    incarnation: int
    ts_ns: int
    marked: bool = True
    verdict: ContinuityVerdict = "pending"
    checked_steps: int = 0
    max_z: float | None = None
    cumulative_z: float | None = None


class RestartCheck(msgspec.Struct, frozen=True, gc=False):
    """The running check of one resume against the frozen baseline.

    Attributes:
        remaining: Steps still to judge.
        median: Loss median at the resumed step.
        scale: Loss spread at the resumed step.
        n: Steps judged.
        sum_z: Sum of their z.
        max_z: Largest z.
    """

    remaining: int
    median: float
    scale: float
    n: int = 0
    sum_z: float = 0.0
    max_z: float = -math.inf


class CheckOutcome(msgspec.Struct, frozen=True, gc=False):
    """What one judged step did to a check.

    Attributes:
        check: The check afterwards, None when it finished.
        z: The step's z.
        cumulative_z: Stouffer's z so far.
        broken: True when this step broke continuity.
    """

    check: RestartCheck | None
    z: float
    cumulative_z: float
    broken: bool


def judge(check: RestartCheck, loss: float, threshold: float) -> CheckOutcome:
    """Judge one finite post-resume loss against the frozen baseline.

    Args:
        check: The running check.
        loss: The step's loss.
        threshold: ``restart_z_thresh``.

    Returns:
        The outcome; the check is None once broken or once every step is judged.
    """
    z = (loss - check.median) / check.scale
    n = check.n + 1
    sum_z = check.sum_z + z
    cumulative = sum_z / math.sqrt(n)
    broken = z > threshold or cumulative > threshold
    remaining = check.remaining - 1
    if broken or remaining <= 0:
        return CheckOutcome(None, z, cumulative, broken)
    nxt = RestartCheck(remaining, check.median, check.scale, n, sum_z, max(check.max_z, z))
    return CheckOutcome(nxt, z, cumulative, broken)


def record_outcome(record: RestartRecord, outcome: CheckOutcome) -> RestartRecord:
    """The restart record after one judged step."""
    max_z = outcome.z if record.max_z is None else max(record.max_z, outcome.z)
    if outcome.broken:
        verdict: ContinuityVerdict = "broken"
    elif outcome.check is None:
        verdict = "ok"
    else:
        verdict = "pending"
    return msgspec.structs.replace(
        record,
        verdict=verdict,
        checked_steps=record.checked_steps + 1,
        max_z=max_z,
        cumulative_z=outcome.cumulative_z,
    )


def close_record(record: RestartRecord) -> RestartRecord:
    """A pending record whose check was cut short (a new incarnation began)."""
    if record.verdict != "pending":
        return record
    verdict: ContinuityVerdict = "ok" if record.checked_steps else "unchecked"
    return msgspec.structs.replace(record, verdict=verdict)


__all__ = [
    "CheckOutcome",
    "ContinuityVerdict",
    "RestartCheck",
    "RestartRecord",
    "close_record",
    "judge",
    "record_outcome",
]
