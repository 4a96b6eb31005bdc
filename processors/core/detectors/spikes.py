"""Loss and grad-norm spikes, judged as episodes by what happens next (`episodes`)."""

from __future__ import annotations

import msgspec

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.detectors.base import StepDetector, StepFacts
from runwatch.processors.core.episodes import (
    SpikeEpisode,
    advance_cusum_episode,
    open_cusum_episode,
)
from runwatch.processors.core.step_checks import (
    Emits,
    grad_spike_step,
    loss_shift,
    loss_spike_step,
)


class LossSpikeState(msgspec.Struct, frozen=True, gc=False):
    """The one-step loss spike test, the sustained-rise CUSUM and their episode.

    Attributes:
        run: Consecutive loss spikes (one episode per streak).
        cusum: One-sided CUSUM of the loss's robust z (sustained loss spikes).
        cusum_reported: The current CUSUM excursion was already reported.
        episode: The open loss spike episode, if any.
        starts: Start steps of the latest loss spike episodes (at most
            ``spike_repeat_count``; the repeat rule and "the loss followed" read them).
    """

    run: int = 0
    cusum: float = 0.0
    cusum_reported: bool = False
    episode: SpikeEpisode | None = None
    starts: tuple[int, ...] = ()


class GradSpikeState(msgspec.Struct, frozen=True, gc=False):
    """The grad-norm spike test and its episode.

    Attributes:
        run: Consecutive grad-norm spikes (one episode per streak).
        episode: The open grad-norm spike episode, if any.
    """

    run: int = 0
    episode: SpikeEpisode | None = None


_QUIET_LOSS = LossSpikeState()
_QUIET_GRAD = GradSpikeState()


def _cusum_episode(
    em: Emits,
    ep: SpikeEpisode | None,
    loss: float,
    cusum: float,
    crossing: tuple[float, float] | None,
    spiking: bool,
    cfg: DetectorConfig,
) -> SpikeEpisode | None:
    """Advance an open CUSUM episode, or open one at a crossing (episode loss rule 6)."""
    step = em.step
    if ep is not None and ep.by_cusum and ep.start_step < step:
        ep, decision = advance_cusum_episode(ep, step, loss, cusum, spiking, cfg)
        if decision is not None:
            em.emit_episode(decision, "loss")
    if crossing is not None and ep is None:
        ep = open_cusum_episode(step, loss, crossing, cusum, cfg)
    return ep


def fold_loss_spike(f: StepFacts, s: LossSpikeState) -> LossSpikeState:
    """Judge a finite loss for spikes; publish the latest episode start in ``facts``.

    Rule 1: a non-finite loss changes nothing.
    Rule 2: a step where the restart check broke counts as spiking but opens no episode
    (the discontinuity stands for the spike).
    Rule 3: otherwise the one-step test advances the open episode or opens one
    (`step_checks.loss_spike_step`).
    Rule 4: the CUSUM adds the step's evidence up; a crossing opens a CUSUM episode when
    none is open.
    """
    if not f.loss_ok:
        if s.starts:  # the facts start at -1; a write costs ten reads
            f.loss_start = s.starts[-1]
        return s
    em, base, loss, cfg = f, f.loss_base, f.loss, f.cfg
    if f.broke:
        run, episode, starts = 1, s.episode, s.starts
    else:
        run, episode, starts = loss_spike_step(em, base, loss, cfg, s.run, s.episode, s.starts)
    cusum, reported, crossing = loss_shift(base, loss, cfg, s.cusum, s.cusum_reported or run > 0)
    if episode is not None or crossing is not None:
        episode = _cusum_episode(em, episode, loss, cusum, crossing, run > 0, cfg)
    if starts:  # the facts start at -1; a write costs ten reads
        f.loss_start = starts[-1]
    if (
        episode is s.episode
        and run == s.run
        and cusum == s.cusum
        and starts is s.starts
        and reported == s.cusum_reported
    ):
        return s
    return LossSpikeState(run, cusum, reported, episode, starts)


def reset_loss_spike(s: LossSpikeState, from_step: int) -> LossSpikeState:
    """Streaks and the CUSUM end; episode starts after ``from_step`` are forgotten.

    The open episode must have been decided already (`steps` closes it as interrupted).
    """
    starts = tuple(x for x in s.starts if x <= from_step)
    return LossSpikeState(starts=starts) if starts else _QUIET_LOSS


def fold_grad_spike(f: StepFacts, s: GradSpikeState) -> GradSpikeState:
    """Judge the grad norm for spikes in log space (`step_checks.grad_spike_step`).

    Rule 1: the open episode ages on every step, a usable grad norm or not.
    Rule 2: a finite positive grad norm may open an episode, which asks whether the loss
    followed (``facts.loss_start``, written by the loss spike detector before it).
    """
    run, episode = grad_spike_step(
        f, f.grad_base, f.usable_grad, f.cfg, s.run, s.episode, f.loss_start
    )
    if run == s.run and episode is s.episode:
        return s
    return GradSpikeState(run, episode) if run or episode is not None else _QUIET_GRAD


def reset_grad_spike(s: GradSpikeState, from_step: int) -> GradSpikeState:
    """The streak ends (the open episode was decided already, as for the loss)."""
    return _QUIET_GRAD


LOSS_SPIKE = StepDetector("loss spike", "loss_spike", fold_loss_spike, reset_loss_spike)
"""The loss spike and sustained-rise detector."""

GRAD_SPIKE = StepDetector("grad-norm spike", "grad_spike", fold_grad_spike, reset_grad_spike)
"""The grad-norm spike detector (after the loss spike detector: it reads ``loss_start``)."""

__all__ = [
    "GRAD_SPIKE",
    "LOSS_SPIKE",
    "GradSpikeState",
    "LossSpikeState",
    "fold_grad_spike",
    "fold_loss_spike",
    "reset_grad_spike",
    "reset_loss_spike",
]
