"""Divergence (loss above the ceiling) and collapse (loss held near ln(vocab))."""

from __future__ import annotations

import math

import msgspec

from runwatch.processors.core.detectors.base import StepDetector, StepFacts


class CeilingState(msgspec.Struct, frozen=True, gc=False):
    """Streaks of divergent and collapsed losses, and the best loss so far.

    Attributes:
        divergence_run: Consecutive losses above the ceiling.
        collapse_run: Consecutive losses near ln(vocab) after learning.
        best_loss: Lowest finite loss seen.
    """

    divergence_run: int = 0
    collapse_run: int = 0
    best_loss: float = math.inf


def fold_ceiling(f: StepFacts, s: CeilingState) -> CeilingState:
    """Judge a finite loss against the ceiling and ln(vocab).

    Rule 1: a non-finite loss changes nothing (the non-finite detector reports it).
    Rule 2: a loss above the run's ceiling opens a streak with one ``loss_divergence``.
    Rule 3: a loss within ``collapse_band_nats`` of ln(vocab), once the best loss was
    ``collapse_learned_nats`` below it, counts; the ``collapse_steps``-th in a row raises
    ``loss_collapse``.
    """
    if not f.loss_ok:
        return s
    loss, cfg, em = f.loss, f.cfg, f
    divergence_run, collapse_run, best_loss = s.divergence_run, s.collapse_run, s.best_loss
    ceiling = f.info.loss_ceiling(cfg)
    if ceiling is not None and loss > ceiling:
        divergence_run += 1
        if divergence_run == 1:
            em.emit(
                "loss_divergence",
                value=loss,
                threshold=ceiling,
                detail=f"loss {loss:.6g} above the ceiling {ceiling:.6g}",
            )
    else:
        divergence_run = 0
    ln_vocab = f.info.ln_vocab
    if ln_vocab is not None:
        learned = best_loss <= ln_vocab - cfg.collapse_learned_nats
        if learned and abs(loss - ln_vocab) <= cfg.collapse_band_nats:
            collapse_run += 1
            if collapse_run == cfg.collapse_steps:
                em.emit(
                    "loss_collapse",
                    value=loss,
                    baseline=ln_vocab,
                    threshold=cfg.collapse_band_nats,
                    detail=f"loss held near ln(vocab)={ln_vocab:.4f} for "
                    f"{collapse_run} steps after reaching {best_loss:.4g}",
                )
        else:
            collapse_run = 0
    if loss < best_loss:
        best_loss = loss
    elif divergence_run == s.divergence_run and collapse_run == s.collapse_run:
        return s
    return CeilingState(divergence_run, collapse_run, best_loss)


def reset_ceiling(s: CeilingState, from_step: int) -> CeilingState:
    """Streaks end at a resume or a new gang; the best loss stays."""
    if s.divergence_run == 0 and s.collapse_run == 0:
        return s
    return CeilingState(0, 0, s.best_loss)


CEILING = StepDetector("ceiling", "ceiling", fold_ceiling, reset_ceiling)
"""The divergence and collapse detector."""

__all__ = ["CEILING", "CeilingState", "fold_ceiling", "reset_ceiling"]
