"""Building blocks of the step-health fold: verdict emission, spike test, accounting."""

from __future__ import annotations

import math
from typing import Final

from processors.core.baseline import (
    MAD_TO_SIGMA,
    RollingBaseline,
    mad_lower_bound,
    median_of_sorted,
    robust_scale,
)
from processors.core.config import DetectorConfig, config_hash
from processors.core.mfu import mfu
from processors.core.runinfo import RunInfo
from processors.core.step_state import StepHealthState
from processors.core.verdicts import make_anomaly
from schemas.events import AnomalyDetected, AnomalyKind, Provenance, StepCompleted

_SAFE: Final = 1.0 - 1e-12
"""Keeps the spike shortcut strictly inside the exact test despite rounding."""


class Emitter:
    """Builds the verdicts of one event (same provenance, log time and identity)."""

    __slots__ = ("cfg", "event", "out", "source", "state")

    def __init__(
        self, state: StepHealthState, event: StepCompleted, source: Provenance, cfg: DetectorConfig
    ) -> None:
        self.state = state
        self.event = event
        self.source = source
        self.cfg = cfg
        self.out: list[AnomalyDetected] = []

    def emit(
        self,
        kind: AnomalyKind,
        *,
        value: float | None,
        detail: str,
        baseline: float | None = None,
        scale: float | None = None,
        z: float | None = None,
        threshold: float | None = None,
    ) -> None:
        """Record one verdict about the current step (the keywords are its fields)."""
        self.out.append(
            make_anomaly(
                run_id=self.state.run_id,
                kind=kind,
                step=self.event.step,
                ts_ns=self.event.ts_ns,
                source=self.source,
                config_hash=config_hash(self.cfg),
                incarnation=self.state.info.incarnation,
                attempt=self.state.attempt,
                rank=None,  # loss and grad norm are all-reduced: run-wide
                value=value,
                baseline=baseline,
                scale=scale,
                z=z,
                threshold=threshold,
                detail=detail,
            )
        )


def spike_episode(
    em: Emitter,
    kind: AnomalyKind,
    label: str,
    base: RollingBaseline,
    value: float,
    thresh: float,
    run: int,
) -> int:
    """Advance a spike episode: one verdict when it opens, none while it lasts.

    Args:
        em: Collects the verdict.
        kind: ``loss_spike`` or ``grad_norm_spike``.
        label: The value's name in the verdict's detail.
        base: The baseline before ``value``.
        value: The observed value.
        thresh: The z threshold.
        run: Consecutive spiking steps before this one.

    Returns:
        Consecutive spiking steps including this one (0: the episode is over).
    """
    spike = spike_of(base, value, thresh)
    if spike is None:
        return 0
    if run == 0:
        median, scale, z = spike
        em.emit(
            kind,
            value=value,
            baseline=median,
            scale=scale,
            z=z,
            threshold=thresh,
            detail=f"{label} {value:.6g} vs median {median:.6g} (z={z:.3g})",
        )
    return run + 1


def spike_of(
    base: RollingBaseline, value: float, thresh: float
) -> tuple[float, float, float] | None:
    """``(median, scale, z)`` when ``value`` is an upward spike against ``base``, else None."""
    ordered = base.ordered
    if len(ordered) < base.min_periods:
        return None
    median = median_of_sorted(ordered)
    if not value > median:
        return None
    # Exact shortcut: scale >= 1.4826 * MAD >= 1.4826 * bound whenever MAD > 0 (bound is 0
    # otherwise), so a value this close cannot be a spike; skip the O(log n) MAD search.
    if value - median < thresh * MAD_TO_SIGMA * mad_lower_bound(ordered, median) * _SAFE:
        return None
    scale = robust_scale(ordered, median, base.min_scale_rel)
    z = (value - median) / scale
    return (median, scale, z) if z > thresh else None


def count_kinds(counts: dict[str, int], verdicts: list[AnomalyDetected]) -> dict[str, int]:
    """``counts`` plus one per verdict, by kind (a new dict)."""
    out = dict(counts)
    for v in verdicts:
        out[v.kind] = out.get(v.kind, 0) + 1
    return out


def step_accounting(
    info: RunInfo, event: StepCompleted, cfg: DetectorConfig
) -> tuple[float, float, float | None, float | None]:
    """``(step_time_s, tokens, mfu, tokens_per_s)`` of a step (time 0 when unusable)."""
    step_time_s = event.step_time_s
    if not (step_time_s > 0.0 and math.isfinite(step_time_s)):
        step_time_s = 0.0
    tokens = event.tokens
    flop_config = info.flop_config
    if not tokens and event.examples and flop_config is not None:
        tokens = event.examples * flop_config.seq_len
    if not tokens or step_time_s == 0.0:
        return step_time_s, float(tokens), None, None
    per_token = info.flops_per_token(cfg)
    step_mfu = None
    if per_token is not None:
        step_mfu = mfu(per_token * tokens, step_time_s, info.peak_flops_per_s)
    return step_time_s, float(tokens), step_mfu, tokens / step_time_s


__all__ = ["Emitter", "count_kinds", "spike_of", "step_accounting"]
