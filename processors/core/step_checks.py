"""Building blocks of the step-health fold: verdict emission, spike test, accounting."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final

from runwatch.processors.core.baseline import (
    MAD_TO_SIGMA,
    RollingBaseline,
    mad_lower_bound,
    median_of_sorted,
    robust_scale,
)
from runwatch.processors.core.config import DetectorConfig, config_hash
from runwatch.processors.core.mfu import mfu
from runwatch.processors.core.runinfo import RunInfo
from runwatch.processors.core.step_state import StepHealthState
from runwatch.processors.core.verdicts import make_anomaly
from runwatch.schemas.events import AnomalyDetected, AnomalyKind, Provenance, StepCompleted

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
                launch_id=self.state.info.launch_id,
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

    def emit_replica(self, kind: AnomalyKind, replica_group: int, detail: str) -> None:
        """Record a verdict about one replica group (`processors.core.replicas`)."""
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
                detail=detail,
                replica_group=replica_group,
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


def grad_spike_episode(
    em: Emitter, log_base: RollingBaseline, grad: float, cfg: DetectorConfig, run: int
) -> int:
    """Advance a grad-norm spike episode, scored in log space with a magnitude gate.

    A grad norm is a spike when the robust z of its logarithm against the window of
    logarithms exceeds ``grad_z_thresh`` AND it is at least ``grad_min_ratio`` times the
    window's median. One verdict (severity info, `schemas.kinds.KindSpec`) when the episode opens.

    Args:
        em: Collects the verdict.
        log_base: The baseline of ln(grad norm) before this one.
        grad: The observed grad norm (finite, positive).
        cfg: Thresholds.
        run: Consecutive spiking steps before this one.

    Returns:
        Consecutive spiking steps including this one (0: the episode is over).
    """
    log_grad = math.log(grad)
    spike = spike_of(log_base, log_grad, cfg.grad_z_thresh)
    if spike is None:
        return 0
    log_median, log_scale, z = spike
    ratio = math.exp(log_grad - log_median)
    if ratio < cfg.grad_min_ratio:
        return 0
    if run == 0:
        median = math.exp(log_median)
        em.emit(
            "grad_norm_spike",
            value=grad,
            baseline=median,
            scale=log_scale,
            z=z,
            threshold=cfg.grad_z_thresh,
            detail=f"grad norm {grad:.6g} is {ratio:.3g}x the median {median:.6g} "
            f"(log-space z={z:.3g})",
        )
    return run + 1


def loss_shift(
    em: Emitter,
    base: RollingBaseline,
    loss: float,
    cfg: DetectorConfig,
    cusum: float,
    reported: bool,
) -> tuple[float, bool]:
    """Advance the sustained-loss CUSUM; one ``loss_spike`` when it crosses ``loss_shift_h``.

    A level shift (a learning rate blown up, a model that forgot what it learned) can stay
    under the one-step threshold on every step of a noisy curve. Page's one-sided CUSUM
    ``S = max(0, S + min(z, cap) - loss_shift_k)`` adds the evidence up, where
    ``cap = min(loss_z_thresh, loss_shift_h / 2)``: no single step crosses ``loss_shift_h``
    on its own (that is the one-step test's job). A healthy loss, which mostly lies below
    its trailing median, keeps the sum near 0. An
    excursion already reported by the one-step test (or by this one) is not reported again
    until the CUSUM is back to 0.

    Args:
        em: Collects the verdict.
        base: The loss baseline before ``loss``.
        loss: The finite loss.
        cfg: Thresholds.
        cusum: The CUSUM before this loss.
        reported: True when the current excursion was already reported.

    Returns:
        ``(cusum, reported)`` after this loss.
    """
    if cfg.loss_shift_h == 0.0 or len(base.ordered) < base.min_periods:
        return 0.0, False
    ordered = base.ordered
    median = median_of_sorted(ordered)
    if cusum == 0.0:
        # The common case: z <= k adds nothing to an empty sum. scale >= 1.4826 * bound
        # (see `spike_of`), so a loss this close needs no O(log n) MAD search.
        bound = cfg.loss_shift_k * MAD_TO_SIGMA * mad_lower_bound(ordered, median) * _SAFE
        if loss - median <= bound:
            return 0.0, False
    scale = robust_scale(ordered, median, base.min_scale_rel)
    z = (loss - median) / scale
    cap = min(cfg.loss_z_thresh, cfg.loss_shift_h / 2.0)
    cusum = max(0.0, cusum + min(z, cap) - cfg.loss_shift_k)
    if cusum == 0.0:
        return 0.0, False
    if cusum > cfg.loss_shift_h and not reported:
        em.emit(
            "loss_spike",
            value=loss,
            baseline=median,
            scale=scale,
            z=cusum,
            threshold=cfg.loss_shift_h,
            detail=f"loss {loss:.6g} vs median {median:.6g}: sustained rise "
            f"(CUSUM of z={cusum:.3g} > {cfg.loss_shift_h:g})",
        )
        reported = True
    return cusum, reported


def log_pairs(pairs: Iterable[tuple[int, float]]) -> list[tuple[int, float]]:
    """``(step, ln value)`` of the positive values (grad norms are judged in log space)."""
    return [(s, math.log(v)) for s, v in pairs if v > 0.0 and math.isfinite(v)]


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


__all__ = [
    "Emitter",
    "count_kinds",
    "grad_spike_episode",
    "log_pairs",
    "loss_shift",
    "spike_of",
    "step_accounting",
]
