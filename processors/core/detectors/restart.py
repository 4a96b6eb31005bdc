"""Continuity after a restart: the losses after a resume judged against the run before it."""

from __future__ import annotations

from typing import Final

import msgspec

from runwatch.processors.core.baseline import RollingBaseline
from runwatch.processors.core.continuity import (
    RestartCheck,
    RestartRecord,
    close_record,
    judge,
    record_outcome,
    start_check,
)
from runwatch.processors.core.detectors.base import StepDetector, StepFacts

MAX_RESTART_RECORDS: Final = 64
"""Restart records kept (the latest)."""


class ContinuityState(msgspec.Struct, frozen=True, gc=False):
    """The running restart check and the latest resumes.

    Attributes:
        check: The running restart check, if any.
        ok: False once any resume broke continuity.
        restarts: The latest resumes with their continuity verdicts.
    """

    check: RestartCheck | None = None
    ok: bool = True
    restarts: tuple[RestartRecord, ...] = ()


def fold_continuity(f: StepFacts, s: ContinuityState) -> ContinuityState:
    """Judge a finite loss while a restart check runs (`processors.core.continuity`).

    Rule 1: no running check, or a non-finite loss: nothing changes.
    Rule 2: the loss is judged and its outcome recorded on the latest restart record; a
    broken check raises ``restart_discontinuity`` and sets ``facts.broke`` (the loss
    spike detector then opens no episode for this step).
    """
    check = s.check
    if check is None or not f.loss_ok:
        return s
    cfg, loss, step = f.cfg, f.loss, f.step
    outcome = judge(
        check, step, loss, cfg.restart_z_thresh, pair_threshold=cfg.restart_pair_z_thresh
    )
    restarts = (*s.restarts[:-1], record_outcome(s.restarts[-1], outcome))
    ok = s.ok
    if outcome.broken:
        f.broke = True
        ok = False
        versus = "its first attempt" if outcome.paired else "the median at the resume"
        f.emit(
            "restart_discontinuity",
            value=loss,
            baseline=outcome.reference,
            scale=check.scale,
            z=max(outcome.z, outcome.cumulative_z),
            threshold=cfg.restart_z_thresh,
            detail=f"step {step} after resuming from {restarts[-1].from_step}: "
            f"loss {loss:.6g} vs {versus} {outcome.reference:.6g}, "
            f"z={outcome.z:.3g}, cumulative z={outcome.cumulative_z:.3g} "
            f"over {check.n + 1} steps",
        )
    return ContinuityState(outcome.check, ok, restarts)


def reset_continuity(s: ContinuityState, from_step: int) -> ContinuityState:
    """A resume or a new gang ends the running check (its pending record is closed)."""
    restarts = s.restarts
    if restarts and restarts[-1].verdict == "pending":
        restarts = (*restarts[:-1], close_record(restarts[-1]))
    elif s.check is None:
        return s
    return ContinuityState(None, s.ok, restarts)


def begin_resume(
    s: ContinuityState,
    record: RestartRecord,
    loss_at_resume: RollingBaseline,
    prior: tuple[float, ...],
    check_steps: int,
) -> ContinuityState:
    """Record a resume; after a restart marker, start its check (state already `reset`).

    Args:
        s: The state after `reset_continuity`.
        record: The resume (``verdict`` "unchecked").
        loss_at_resume: The loss baseline rolled back to the resumed step.
        prior: First-attempt losses of the next ``check_steps`` steps (NaN where not seen).
        check_steps: ``restart_check_steps``.

    Returns:
        The state with the record appended (the latest `MAX_RESTART_RECORDS` kept).
    """
    check = None
    if record.marked:
        check = start_check(loss_at_resume, check_steps, record.from_step + 1, prior)
    if check is not None:
        record = msgspec.structs.replace(record, verdict="pending")
    restarts = (*s.restarts, record)[-MAX_RESTART_RECORDS:]
    return ContinuityState(check, s.ok, restarts)


CONTINUITY = StepDetector("continuity", "continuity", fold_continuity, reset_continuity)
"""The restart continuity detector."""

__all__ = [
    "CONTINUITY",
    "MAX_RESTART_RECORDS",
    "ContinuityState",
    "begin_resume",
    "fold_continuity",
    "reset_continuity",
]
