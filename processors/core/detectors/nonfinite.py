"""Non-finite loss and grad norm: one verdict per streak, also during warmup."""

from __future__ import annotations

import msgspec

from runwatch.processors.core.detectors.base import StepDetector, StepFacts


class NonfiniteState(msgspec.Struct, frozen=True, gc=False):
    """Streaks of non-finite values.

    Attributes:
        loss_run: Consecutive non-finite losses.
        grad_run: Consecutive non-finite grad norms (skipped steps do not count).
    """

    loss_run: int = 0
    grad_run: int = 0


CLEAR = NonfiniteState()


def fold_nonfinite(f: StepFacts, s: NonfiniteState) -> NonfiniteState:
    """Rule 1: a non-finite loss opens a streak with one ``nonfinite_loss``.

    Rule 2: a non-finite grad norm on a step whose update was not skipped opens a streak
    with one ``nonfinite_grad_norm``; a finite or missing one ends it.
    """
    loss_run = 0 if f.loss_ok else s.loss_run + 1
    if loss_run == 1:
        f.emit("nonfinite_loss", value=f.loss, detail=f"loss is {f.loss!r} at step {f.step}")
    grad_run = s.grad_run
    if f.grad is None or f.grad_ok:
        grad_run = 0
    elif not f.event.skipped:
        grad_run += 1
        if grad_run == 1:
            f.emit("nonfinite_grad_norm", value=f.grad, detail=f"grad norm is {f.grad!r}")
    if loss_run == s.loss_run and grad_run == s.grad_run:
        return s
    return NonfiniteState(loss_run, grad_run) if loss_run or grad_run else CLEAR


def reset_nonfinite(s: NonfiniteState, from_step: int) -> NonfiniteState:
    """Streaks end at a resume or a new gang."""
    return CLEAR


NONFINITE = StepDetector("nonfinite", "nonfinite", fold_nonfinite, reset_nonfinite)
"""The non-finite detector."""

__all__ = ["NONFINITE", "NonfiniteState", "fold_nonfinite", "reset_nonfinite"]
