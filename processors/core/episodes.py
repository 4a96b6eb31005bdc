"""Spike episodes judged by what happens next (pure; no clock, no I/O).

A loss that jumps far above its trailing median opens an *episode*. Real pretraining runs
have such spikes every few thousand steps and nearly all of them are gone at the next logged
step (docs/core.md, "Real LLM pretraining curves"), so an episode is not paged when it opens:
it is decided by the steps that follow, and decided once. Its one verdict (kind
``loss_spike`` or ``grad_norm_spike``, ``step`` = the episode's first step, so its id is
deterministic) is emitted at the step that decides it, with the peak, the steps it lasted
and whether it recovered.

Loss episode rules, in the order `open_loss_episode` and `advance_loss_episode` apply them:

1. **Magnitude.** The peak's relative rise over the median, ``peak / median - 1``, is at
   least ``spike_page_rel``: decided at once, ``warning``.
2. **Repeat.** At least ``spike_repeat_count`` loss episodes (this one included) started
   within ``spike_repeat_steps`` steps: decided at once, ``warning``.
3. **Recovered.** A later loss back at or below ``median + spike_recover_frac * rise``:
   decided, ``info`` (kept, charted, counted, not paged).
4. **Still rising.** A later loss at or above the peak: decided, ``warning``.
5. **Stays up.** Not recovered ``spike_recover_steps`` steps after the start: decided,
   ``warning``.
6. **Sustained.** The loss CUSUM (`step_checks.loss_shift`) crossing ``loss_shift_h`` in
   an excursion no spike episode opened opens a *CUSUM episode* (a rise too gradual for
   the one-step test); `advance_cusum_episode` decides it ``warning`` when the CUSUM is
   still above ``loss_shift_h`` ``spike_recover_steps`` steps later, or at once when a
   later loss is also a one-step spike (the rise steepens: "still rising"); ``info``
   ("faded") when the CUSUM falls back to ``loss_shift_h`` or below first.
7. **Interrupted.** A resume, a new incarnation or the run's end while it is open:
   decided, ``info``, not recovered (the run's other detectors judge the interruption).

Grad-norm episode rules (`open_grad_episode`, `advance_grad_episode`):

1. **The loss follows.** A loss episode starts at the grad-norm spike's step or within
   ``grad_follow_steps`` steps after it: decided, ``warning``.
2. **Lone.** ``grad_follow_steps`` steps pass without one: decided, ``info``.
3. **Interrupted.** As for the loss: decided, ``info``.
"""

from __future__ import annotations

import math
from typing import Final, Literal

import msgspec

from runwatch.processors.core.config import DetectorConfig
from runwatch.schemas.events import AnomalyKind, Severity

Reason = Literal[
    "magnitude",
    "repeat",
    "recovered",
    "rising",
    "stays_up",
    "sustained",
    "faded",
    "interrupted",
    "loss_followed",
    "lone",
]
"""Which rule decided an episode."""

PAGING_REASONS: Final[frozenset[Reason]] = frozenset(
    {"magnitude", "repeat", "rising", "stays_up", "sustained", "loss_followed"}
)
"""Rules whose decision pages (severity ``warning``); the others decide ``info``."""

_WHY: Final[dict[Reason, str]] = {
    "magnitude": "its rise is past the magnitude floor",
    "repeat": "it repeats an episode started shortly before",
    "recovered": "back below the recovery level",
    "rising": "still rising",
    "stays_up": "not back within the recovery steps",
    "sustained": "a sustained rise: the CUSUM stayed above its alarm level",
    "faded": "the CUSUM fell back to its alarm level",
    "interrupted": "not decided: the run resumed, restarted or ended",
    "loss_followed": "the loss followed it",
    "lone": "the loss did not follow",
}


class SpikeEpisode(msgspec.Struct, frozen=True, gc=False):
    """An open spike episode.

    Attributes:
        kind: ``loss_spike`` or ``grad_norm_spike``.
        start_step: The first spiking step (the verdict's ``step``).
        baseline: The median before the first spiking value (for a grad norm, the
            geometric median).
        scale: The spread it was judged against (ln units for a grad norm).
        threshold: The z threshold crossed.
        peak: The highest value so far.
        peak_step: Its step.
        peak_z: Its z against ``baseline`` and ``scale``.
        last_step: The latest step seen in the episode.
        by_cusum: Opened by the loss CUSUM (loss rule 6): ``peak_z`` is the CUSUM and
            ``threshold`` its alarm level.
    """

    kind: AnomalyKind
    start_step: int
    baseline: float
    scale: float
    threshold: float
    peak: float
    peak_step: int
    peak_z: float
    last_step: int
    by_cusum: bool = False

    @property
    def duration_steps(self) -> int:
        """Steps from the first spiking step to the latest one seen, both included."""
        return self.last_step - self.start_step + 1

    def rise_rel(self) -> float:
        """The peak's rise over the baseline, relative to the baseline's magnitude."""
        return (self.peak - self.baseline) / max(abs(self.baseline), 1e-12)


class Decision(msgspec.Struct, frozen=True, gc=False):
    """How an episode was decided.

    Attributes:
        episode: The episode as it stood when decided.
        reason: The rule that decided it.
        decided_step: The step that decided it.
    """

    episode: SpikeEpisode
    reason: Reason
    decided_step: int

    @property
    def severity(self) -> Severity:
        """``warning`` for a paging rule, else ``info``."""
        return "warning" if self.reason in PAGING_REASONS else "info"

    @property
    def recovered(self) -> bool:
        """True when the loss came back (loss rule 3)."""
        return self.reason == "recovered"

    def detail(self, label: str) -> str:
        """One line for the verdict: the episode's shape and the rule that decided it."""
        ep = self.episode
        ratio = ep.peak / ep.baseline if ep.baseline > 0 else math.nan
        noun = "rise" if ep.by_cusum else "spike"
        z = f"CUSUM of z={ep.peak_z:.3g}" if ep.by_cusum else f"z={ep.peak_z:.3g}"
        return (
            f"{label} {noun} from step {ep.start_step}: peak {ep.peak:.6g} at step "
            f"{ep.peak_step} ({ratio:.3g}x the median {ep.baseline:.6g}, {z}), "
            f"{ep.duration_steps} step(s); {_WHY[self.reason]}"
        )


def _repeats(recent_starts: tuple[int, ...], step: int, cfg: DetectorConfig) -> bool:
    """Loss rule 2: enough episodes (this one at ``step`` included) within the window."""
    within = sum(1 for s in recent_starts if step - s < cfg.spike_repeat_steps)
    return within + 1 >= cfg.spike_repeat_count


def open_loss_episode(
    step: int,
    loss: float,
    spike: tuple[float, float, float],
    threshold: float,
    recent_starts: tuple[int, ...],
    cfg: DetectorConfig,
) -> tuple[SpikeEpisode | None, Decision | None]:
    """Open a loss episode at a spiking step; rules 1 and 2 may decide it at once.

    Args:
        step: The spiking step.
        loss: Its loss.
        spike: ``(median, scale, z)`` of the spike test.
        threshold: The z threshold it crossed.
        recent_starts: Start steps of earlier loss episodes (for the repeat rule).
        cfg: Thresholds.

    Returns:
        ``(open episode, None)``, or ``(None, decision)`` when decided at once.
    """
    median, scale, z = spike
    ep = SpikeEpisode(
        kind="loss_spike",
        start_step=step,
        baseline=median,
        scale=scale,
        threshold=threshold,
        peak=loss,
        peak_step=step,
        peak_z=z,
        last_step=step,
    )
    if ep.rise_rel() >= cfg.spike_page_rel:  # rule 1
        return None, Decision(ep, "magnitude", step)
    if _repeats(recent_starts, step, cfg):  # rule 2
        return None, Decision(ep, "repeat", step)
    return ep, None


def advance_loss_episode(
    ep: SpikeEpisode, step: int, loss: float, cfg: DetectorConfig
) -> tuple[SpikeEpisode | None, Decision | None]:
    """Judge an open loss episode by one later finite loss (rules 3, 4, 1 and 5).

    Returns:
        ``(episode, None)`` while it stays open, ``(None, decision)`` once decided.
    """
    ep = msgspec.structs.replace(ep, last_step=step)
    rise = ep.peak - ep.baseline
    if loss <= ep.baseline + cfg.spike_recover_frac * rise:  # rule 3
        return None, Decision(ep, "recovered", step)
    if loss >= ep.peak:  # rule 4 (the new peak may also be past the floor: rule 1)
        z = (loss - ep.baseline) / ep.scale
        ep = msgspec.structs.replace(ep, peak=loss, peak_step=step, peak_z=z)
        reason: Reason = "magnitude" if ep.rise_rel() >= cfg.spike_page_rel else "rising"
        return None, Decision(ep, reason, step)
    if step - ep.start_step >= cfg.spike_recover_steps:  # rule 5
        return None, Decision(ep, "stays_up", step)
    return ep, None


def open_grad_episode(
    step: int,
    grad: float,
    spike: tuple[float, float, float],
    threshold: float,
    loss_episode_start: int,
) -> tuple[SpikeEpisode | None, Decision | None]:
    """Open a grad-norm episode; grad rule 1 decides it at once when the loss spiked too.

    Args:
        step: The spiking step.
        grad: Its grad norm.
        spike: ``(log median, log scale, log z)`` of the spike test.
        threshold: The z threshold it crossed.
        loss_episode_start: Start step of the latest loss episode (-1: none).

    Returns:
        ``(open episode, None)``, or ``(None, decision)`` when decided at once.
    """
    log_median, log_scale, z = spike
    ep = SpikeEpisode(
        kind="grad_norm_spike",
        start_step=step,
        baseline=math.exp(log_median),
        scale=log_scale,
        threshold=threshold,
        peak=grad,
        peak_step=step,
        peak_z=z,
        last_step=step,
    )
    if loss_episode_start == step:
        return None, Decision(ep, "loss_followed", step)
    return ep, None


def advance_grad_episode(
    ep: SpikeEpisode,
    step: int,
    grad: float | None,
    loss_episode_start: int,
    cfg: DetectorConfig,
) -> tuple[SpikeEpisode | None, Decision | None]:
    """Judge an open grad-norm episode at a later step (grad rules 1 and 2).

    Args:
        ep: The open episode.
        step: The later step.
        grad: Its finite grad norm, None when absent or not finite.
        loss_episode_start: Start step of the latest loss episode (-1: none).
        cfg: Thresholds.

    Returns:
        ``(episode, None)`` while it stays open, ``(None, decision)`` once decided.
    """
    ep = msgspec.structs.replace(ep, last_step=step)
    if grad is not None and grad > ep.peak:
        z = (math.log(grad) - math.log(ep.baseline)) / ep.scale
        ep = msgspec.structs.replace(ep, peak=grad, peak_step=step, peak_z=z)
    if ep.start_step <= loss_episode_start <= step:  # rule 1
        return None, Decision(ep, "loss_followed", step)
    if step - ep.start_step >= cfg.grad_follow_steps:  # rule 2
        return None, Decision(ep, "lone", step)
    return ep, None


def open_cusum_episode(
    step: int, loss: float, crossing: tuple[float, float], cusum: float, cfg: DetectorConfig
) -> SpikeEpisode:
    """Open a CUSUM episode where the loss CUSUM crossed its alarm level (loss rule 6).

    Args:
        step: The step it crossed at.
        loss: Its loss.
        crossing: ``(median, scale)`` of the baseline.
        cusum: The CUSUM after this loss.
        cfg: Thresholds.
    """
    median, scale = crossing
    return SpikeEpisode(
        kind="loss_spike",
        start_step=step,
        baseline=median,
        scale=scale,
        threshold=cfg.loss_shift_h,
        peak=loss,
        peak_step=step,
        peak_z=cusum,
        last_step=step,
        by_cusum=True,
    )


def advance_cusum_episode(
    ep: SpikeEpisode, step: int, loss: float, cusum: float, spiking: bool, cfg: DetectorConfig
) -> tuple[SpikeEpisode | None, Decision | None]:
    """Judge an open CUSUM episode by a later loss and the CUSUM after it (loss rule 6).

    Args:
        ep: The open CUSUM episode.
        step: The later step.
        loss: Its finite loss.
        cusum: The CUSUM after it.
        spiking: The loss is also a one-step spike: the rise steepens, and it pages now.
        cfg: Thresholds.

    Returns:
        ``(episode, None)`` while it stays open, ``(None, decision)`` once decided.
    """
    ep = msgspec.structs.replace(ep, last_step=step)
    if loss > ep.peak:
        ep = msgspec.structs.replace(ep, peak=loss, peak_step=step)
    ep = msgspec.structs.replace(ep, peak_z=max(ep.peak_z, cusum))
    if cusum <= cfg.loss_shift_h:
        return None, Decision(ep, "faded", step)
    if spiking:
        return None, Decision(ep, "rising", step)
    if step - ep.start_step >= cfg.spike_recover_steps:
        return None, Decision(ep, "sustained", step)
    return ep, None


def interrupted(ep: SpikeEpisode | None, step: int) -> Decision | None:
    """Loss rule 7 / grad rule 3: an open episode decided by a resume or the run's end."""
    return None if ep is None else Decision(ep, "interrupted", max(step, ep.last_step))


__all__ = [
    "PAGING_REASONS",
    "Decision",
    "Reason",
    "SpikeEpisode",
    "advance_cusum_episode",
    "advance_grad_episode",
    "advance_loss_episode",
    "interrupted",
    "open_cusum_episode",
    "open_grad_episode",
    "open_loss_episode",
]
