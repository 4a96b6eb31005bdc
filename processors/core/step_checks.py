"""Building blocks of the step-health fold: verdict emission, spike test, accounting."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final, Protocol

from runwatch.processors.core.baseline import (
    MAD_TO_SIGMA,
    RollingBaseline,
    mad_lower_bound,
    median_of_sorted,
    robust_scale,
)
from runwatch.processors.core.config import DetectorConfig, config_hash, is_shadow
from runwatch.processors.core.episodes import (
    Decision,
    SpikeEpisode,
    advance_grad_episode,
    advance_loss_episode,
    open_grad_episode,
    open_loss_episode,
)
from runwatch.processors.core.mfu import mfu
from runwatch.processors.core.runinfo import RunInfo
from runwatch.processors.core.verdicts import EpisodeFields, make_anomaly
from runwatch.schemas.events import (
    AnomalyDetected,
    AnomalyKind,
    Provenance,
    RunEnded,
    RunStarted,
    Severity,
    StepCompleted,
)

if TYPE_CHECKING:  # step_state imports the detectors, which import this module
    from runwatch.processors.core.step_state import StepHealthState

_SAFE: Final = 1.0 - 1e-12
"""Keeps the spike shortcut strictly inside the exact test despite rounding."""


class Emits(Protocol):
    """What judges call to raise verdicts: an `Emitter`, or a step's facts that make one.

    Attributes:
        step: The event's step (the verdicts' unless they name another).
    """

    step: int

    def emit_episode(self, decision: Decision, label: str) -> None:
        """Record the one verdict of a decided spike episode."""

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
        step: int | None = None,
        severity: Severity | None = None,
        episode: EpisodeFields | None = None,
    ) -> None:
        """Record one verdict."""

    def emit_replica(self, kind: AnomalyKind, replica_group: int | None, detail: str) -> None:
        """Record a verdict about a replica group."""


class Emitter:
    """Builds the verdicts of one event (same provenance, log time and identity)."""

    __slots__ = ("cfg", "event", "out", "source", "state", "step")

    def __init__(
        self,
        state: StepHealthState,
        event: StepCompleted | RunStarted | RunEnded,
        source: Provenance,
        cfg: DetectorConfig,
        out: list[AnomalyDetected] | None = None,
    ) -> None:
        self.state = state
        self.event = event
        self.step = event.step if isinstance(event, StepCompleted) else state.last_step
        self.source = source
        self.cfg = cfg
        self.out: list[AnomalyDetected] = out if out is not None else []

    def emit_episode(self, decision: Decision, label: str) -> None:
        """Record the one verdict of a decided spike episode (``step``: its first step)."""
        ep = decision.episode
        self.emit(
            ep.kind,
            value=ep.peak,
            baseline=ep.baseline,
            scale=ep.scale,
            z=ep.peak_z,
            threshold=ep.threshold,
            detail=decision.detail(label),
            step=ep.start_step,
            severity=decision.severity,
            episode=EpisodeFields(
                ep.peak_step, ep.duration_steps, decision.recovered, decision.decided_step
            ),
        )

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
        step: int | None = None,
        severity: Severity | None = None,
        episode: EpisodeFields | None = None,
    ) -> None:
        """Record one verdict (the keywords are its fields; ``step``: the event's)."""
        self.out.append(
            make_anomaly(
                run_id=self.state.run_id,
                kind=kind,
                step=self.step if step is None else step,
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
                severity=severity,
                episode=episode,
                shadow=is_shadow(self.cfg, kind),
            )
        )

    def emit_replica(self, kind: AnomalyKind, replica_group: int | None, detail: str) -> None:
        """Record a verdict about a replica group, or None: the run's replica groups."""
        self.out.append(
            make_anomaly(
                run_id=self.state.run_id,
                kind=kind,
                step=self.step,
                ts_ns=self.event.ts_ns,
                source=self.source,
                config_hash=config_hash(self.cfg),
                incarnation=self.state.info.incarnation,
                launch_id=self.state.info.launch_id,
                attempt=self.state.attempt,
                detail=detail,
                replica_group=replica_group,
                shadow=is_shadow(self.cfg, kind),
            )
        )


def loss_spike_step(
    em: Emits,
    base: RollingBaseline,
    loss: float,
    cfg: DetectorConfig,
    run: int,
    episode: SpikeEpisode | None,
    starts: tuple[int, ...],
) -> tuple[int, SpikeEpisode | None, tuple[int, ...]]:
    """Advance the loss spike test and its episode by one finite loss (`episodes` rules).

    An open episode is judged by this loss first (a CUSUM episode is the caller's); a spike
    then opens a new episode when it starts a streak of spiking steps and none is open. A
    decided episode's one verdict is emitted now.

    Args:
        em: Collects the verdict.
        base: The loss baseline before ``loss``.
        loss: The finite loss.
        cfg: Thresholds.
        run: Consecutive spiking steps before this one.
        episode: The open loss episode, if any.
        starts: Start steps of the latest loss episodes (at most ``spike_repeat_count``).

    Returns:
        ``(run, episode, starts)`` after this loss.
    """
    step = em.step
    decision = None
    if episode is not None and not episode.by_cusum:
        episode, decision = advance_loss_episode(episode, step, loss, cfg)
        if decision is not None:
            em.emit_episode(decision, "loss")
    spike = spike_of(base, loss, cfg.loss_z_thresh)
    if spike is None:
        return 0, episode, starts
    if run == 0 and episode is None and decision is None:
        episode, decision = open_loss_episode(step, loss, spike, cfg.loss_z_thresh, starts, cfg)
        starts = (*starts, step)[-cfg.spike_repeat_count :]
        if decision is not None:
            em.emit_episode(decision, "loss")
    return run + 1, episode, starts


def grad_spike_step(
    em: Emits,
    log_base: RollingBaseline,
    grad: float | None,
    cfg: DetectorConfig,
    run: int,
    episode: SpikeEpisode | None,
    loss_start: int,
) -> tuple[int, SpikeEpisode | None]:
    """Advance the grad-norm spike test and its episode by one step (`episodes` rules).

    A grad norm is a spike when the robust z of its logarithm against the window of
    logarithms exceeds ``grad_z_thresh`` AND it is at least ``grad_min_ratio`` times the
    window's median. The episode it opens is information unless the loss follows.

    Args:
        em: Collects the verdict.
        log_base: The baseline of ln(grad norm) before this one.
        grad: The grad norm when finite and positive, else None (the episode still ages).
        cfg: Thresholds.
        run: Consecutive spiking steps before this one.
        episode: The open grad-norm episode, if any.
        loss_start: Start step of the latest loss episode (-1: none).

    Returns:
        ``(run, episode)`` after this step.
    """
    step = em.step
    decision = None
    if episode is not None:
        episode, decision = advance_grad_episode(episode, step, grad, loss_start, cfg)
        if decision is not None:
            em.emit_episode(decision, "grad norm")
    if grad is None:
        return run, episode
    spike = spike_of(log_base, math.log(grad), cfg.grad_z_thresh)
    if spike is None or math.exp(math.log(grad) - spike[0]) < cfg.grad_min_ratio:
        return 0, episode
    if run == 0 and episode is None and decision is None:
        episode, decision = open_grad_episode(step, grad, spike, cfg.grad_z_thresh, loss_start)
        if decision is not None:
            em.emit_episode(decision, "grad norm")
    return run + 1, episode


def loss_shift(
    base: RollingBaseline,
    loss: float,
    cfg: DetectorConfig,
    cusum: float,
    reported: bool,
) -> tuple[float, bool, tuple[float, float] | None]:
    """Advance the sustained-loss CUSUM; say when it crosses ``loss_shift_h``.

    A level shift (a learning rate blown up, a model that forgot what it learned) can stay
    under the one-step threshold on every step of a noisy curve. Page's one-sided CUSUM
    ``S = max(0, S + min(z, cap) - loss_shift_k)`` adds the evidence up, where
    ``cap = min(loss_z_thresh, loss_shift_h / 2)``: no single step crosses ``loss_shift_h``
    on its own (that is the one-step test's job). A healthy loss, which mostly lies below
    its trailing median, keeps the sum near 0. An excursion already reported (by a spike
    episode or by a crossing) is not reported again until the CUSUM is back to 0. The
    caller opens a CUSUM episode at a crossing (`episodes`, loss rule 6).

    Args:
        base: The loss baseline before ``loss``.
        loss: The finite loss.
        cfg: Thresholds.
        cusum: The CUSUM before this loss.
        reported: True when the current excursion was already reported.

    Returns:
        ``(cusum, reported, crossing)`` after this loss; ``crossing`` is ``(median,
        scale)`` of the baseline when the CUSUM crossed now, else None.
    """
    if cfg.loss_shift_h == 0.0 or len(base.ordered) < base.min_periods:
        return 0.0, False, None
    ordered = base.ordered
    median = median_of_sorted(ordered)
    if cusum == 0.0:
        # The common case: z <= k adds nothing to an empty sum. scale >= 1.4826 * bound
        # (see `spike_of`), so a loss this close needs no O(log n) MAD search.
        bound = cfg.loss_shift_k * MAD_TO_SIGMA * mad_lower_bound(ordered, median) * _SAFE
        if loss - median <= bound:
            return 0.0, False, None
    scale = robust_scale(ordered, median, base.min_scale_rel)
    z = (loss - median) / scale
    cap = min(cfg.loss_z_thresh, cfg.loss_shift_h / 2.0)
    cusum = max(0.0, cusum + min(z, cap) - cfg.loss_shift_k)
    if cusum == 0.0:
        return 0.0, False, None
    if cusum > cfg.loss_shift_h and not reported:
        return cusum, True, (median, scale)
    return cusum, reported, None


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
    "Emits",
    "Emitter",
    "count_kinds",
    "grad_spike_step",
    "log_pairs",
    "loss_shift",
    "loss_spike_step",
    "spike_of",
    "step_accounting",
]
