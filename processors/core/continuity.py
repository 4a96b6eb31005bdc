"""Restart continuity: is a resumed run the run that was checkpointed?

A resume from the checkpoint of step S should continue the loss curve where it stood at S.
A resume that dropped optimizer state (Adam moments back to zero) or RNG state often
matches the first step (same weights) and drifts over the next few. So the first
``restart_check_steps`` steps after a restart marker are each judged with the spread of
the loss baseline frozen as it stood at S:

* a step that the run had already completed before the crash (steps S+1 .. crash are
  redone) is compared with its own first attempt: same weights at S, same data, so the
  difference is noise only (this is how seed 001 verifies a resume, and it removes the lag
  of a median over a trending window). Its spread is that of the window's step-to-step
  differences at S (1.4826·MAD of first differences: the noise of a difference of two
  losses, without the trend that widens the window's own spread), unless
  that first attempt was itself anomalous against the baseline at S (the run was
  diverging before the crash: the crash-time state is no reference, rule 5);
* any other step is compared with the level of the baseline at S (seed 000 compares with
  its median; here the window's trend is taken out first, so the level is where the
  curve stood at S rather than half a window earlier, see `level_at`).

The check fails when one step, or the cumulative evidence of the steps so far (Stouffer's
sum of z over sqrt(n)), rises above the threshold. It is one-sided: a resumed loss below
the reference is what a healthy run produces (and what a resume after a divergence
produces against its poisoned first attempt).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise
from typing import Final, Literal

import msgspec

from runwatch.processors.core.baseline import RollingBaseline, median_of_sorted, robust_scale

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
        paired_steps: Of those, steps compared with their first attempt.
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
    paired_steps: int = 0
    max_z: float | None = None
    cumulative_z: float | None = None


class RestartCheck(msgspec.Struct, frozen=True, gc=False):
    """The running check of one resume against the frozen baseline.

    Attributes:
        remaining: Steps still to judge.
        median: Loss level at the resumed step (trend-corrected median).
        scale: Loss spread at the resumed step (around the trend).
        first_step: The step after the resumed one (S+1).
        pair_scale: Spread of a difference between two attempts of a step.
        prior: First-attempt losses of steps S+1, S+2, ... (NaN where not seen).
        n: Steps judged.
        sum_z: Sum of their z.
        max_z: Largest z.
        pair_n: Judged steps compared with their first attempt.
        pair_sum_z: Sum of their z.
    """

    remaining: int
    median: float
    scale: float
    first_step: int = 0
    prior: tuple[float, ...] = ()
    pair_scale: float = 1.0
    n: int = 0
    sum_z: float = 0.0
    max_z: float = -math.inf
    pair_n: int = 0
    pair_sum_z: float = 0.0


class CheckOutcome(msgspec.Struct, frozen=True, gc=False):
    """What one judged step did to a check.

    Attributes:
        check: The check afterwards, None when it finished.
        z: The step's z.
        cumulative_z: Stouffer's z so far.
        broken: True when this step broke continuity.
        reference: What the loss was compared with (first attempt or median).
        paired: True when the reference was the step's first attempt.
    """

    check: RestartCheck | None
    z: float
    cumulative_z: float
    broken: bool
    reference: float
    paired: bool


SQRT2: Final = math.sqrt(2.0)


def pair_scale(values: Sequence[float], scale: float, min_scale_rel: float) -> float:
    """Spread of the difference between two attempts of one step, from a window at S.

    Args:
        values: The loss window at S, in step order.
        scale: Its robust spread (fallback: sqrt(2) times it, for fewer than 3 values).
        min_scale_rel: Relative floor of the spread.

    Returns:
        1.4826·MAD of the window's first differences (never zero).
    """
    if len(values) < 3:
        return SQRT2 * scale
    diffs = sorted(b - a for a, b in pairwise(values))
    centre = median_of_sorted(diffs)
    floor = min_scale_rel * max(abs(v) for v in values)
    return max(robust_scale(diffs, centre, min_scale_rel), floor)


def level_at(
    steps: Sequence[int], values: Sequence[float], at_step: int, min_scale_rel: float
) -> tuple[float, float]:
    """Robust level and spread of a window at ``at_step``, with its trend taken out.

    The median of a trending window lags half a window behind the curve; the level at S
    is instead the median of the values moved along the Theil-Sen slope (the median of
    every pairwise slope) to step S, and the spread is that of those moved values. A flat
    window gives its median and robust spread back. Computed once per resume (O(w^2)).

    Args:
        steps: Steps of the window's values.
        values: The values.
        at_step: The step to estimate the level at.
        min_scale_rel: Relative floor of the spread.

    Returns:
        ``(level, spread)``.
    """
    n = len(values)
    slopes = sorted(
        (values[j] - values[i]) / (steps[j] - steps[i])
        for i in range(n)
        for j in range(i + 1, n)
        if steps[j] != steps[i]
    )
    slope = median_of_sorted(slopes) if slopes else 0.0
    moved = sorted(v - slope * (s - at_step) for s, v in zip(steps, values, strict=True))
    level = median_of_sorted(moved)
    return level, robust_scale(moved, level, min_scale_rel)


def start_check(
    window: RollingBaseline, steps: int, first_step: int, prior: tuple[float, ...]
) -> RestartCheck | None:
    """The check of a resume whose baseline at S is ``window``; None during warmup.

    Args:
        window: The loss baseline at the resumed step.
        steps: ``restart_check_steps``.
        first_step: The step after the resumed one.
        prior: First-attempt losses of the next ``steps`` steps (NaN where not seen).

    Returns:
        The check, or None when there is nothing to judge against.
    """
    if not window.ready or steps <= 0:
        return None
    level, scale = level_at(window.steps, window.values, first_step - 1, window.min_scale_rel)
    spread = pair_scale(window.values, scale, window.min_scale_rel)
    return RestartCheck(steps, level, scale, first_step, prior, spread)


def judge(
    check: RestartCheck,
    step: int,
    loss: float,
    threshold: float,
    *,
    pair_threshold: float | None = None,
) -> CheckOutcome:
    """Judge one finite post-resume loss.

    Args:
        check: The running check.
        step: The step.
        loss: Its loss.
        threshold: ``restart_z_thresh``.
        pair_threshold: ``restart_pair_z_thresh``: the cumulative z of the paired steps
            alone breaks continuity above it (None: ``threshold``). The paired spread is that
            of two different batches, while a redone step sees the same batch with the same
            weights at S, so a healthy resume's paired z stays near 0 and a lower threshold
            keeps its false-alarm rate (real curves: docs/core.md).

    Returns:
        The outcome; the check is None once broken or once every step is judged.
    """
    index = step - check.first_step
    prior = check.prior[index] if 0 <= index < len(check.prior) else math.nan
    # A first attempt that was itself anomalous against the baseline at S (the run was
    # diverging before the crash) is no reference: fall back to the median at S.
    paired = math.isfinite(prior) and (prior - check.median) / check.scale <= threshold
    if paired:
        reference = prior
        z = (loss - prior) / check.pair_scale
    else:
        reference = check.median
        z = (loss - check.median) / check.scale
    n = check.n + 1
    sum_z = check.sum_z + z
    cumulative = sum_z / math.sqrt(n)
    pair_n = check.pair_n + paired
    pair_sum_z = check.pair_sum_z + (z if paired else 0.0)
    pair_cumulative = pair_sum_z / math.sqrt(pair_n) if pair_n else 0.0
    limit = threshold if pair_threshold is None else pair_threshold
    broken = z > threshold or cumulative > threshold or pair_cumulative > limit
    cumulative = max(cumulative, pair_cumulative)
    remaining = check.remaining - 1
    if broken or remaining <= 0:
        return CheckOutcome(None, z, cumulative, broken, reference, paired)
    nxt = RestartCheck(
        remaining,
        check.median,
        check.scale,
        check.first_step,
        check.prior,
        check.pair_scale,
        n,
        sum_z,
        max(check.max_z, z),
        pair_n,
        pair_sum_z,
    )
    return CheckOutcome(nxt, z, cumulative, broken, reference, paired)


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
        paired_steps=record.paired_steps + outcome.paired,
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
    "SQRT2",
    "CheckOutcome",
    "ContinuityVerdict",
    "RestartCheck",
    "RestartRecord",
    "close_record",
    "judge",
    "pair_scale",
    "record_outcome",
    "start_check",
]
