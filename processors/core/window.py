"""The hot kernel of the robust baseline: median, MAD and the sliding sorted window.

Plain functions over tuples of floats, with no class and no import outside the standard
library, so that mypyc can compile this one module (``setup.py``; see `processors.core.native`
for which copy runs). The same source runs uncompiled when no compiled copy is installed or
``RUNWATCH_PURE_PYTHON=1`` asks for it, and both give the same floats bit for bit
(``tests/unit/core/test_native.py``): every sum here is a left-to-right loop of float additions
(never ``sum()``, which compensates its rounding on Python 3.12+), so compiled and pure code
round alike.

`processors.core.baseline.RollingBaseline` (a msgspec Struct, which stays uncompiled: mypyc
drops the ``frozen=True, gc=False`` of a Struct it compiles) keeps its window through `slide`
and judges values with `median_of_sorted` and `robust_scale`.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Sequence
from typing import Final

MAD_TO_SIGMA: Final = 1.4826
"""1.4826 * MAD estimates the standard deviation of normally distributed data."""
MEAN_AD_TO_SIGMA: Final = 1.2533
"""1.2533 * mean absolute deviation estimates it too (sqrt(pi / 2)); used when MAD is 0."""


def median_of_sorted(xs: Sequence[float]) -> float:
    """Median of a non-empty sorted sequence (the mean of the two middle values if even)."""
    n = len(xs)
    half = n // 2
    if n % 2:
        return xs[half]
    return (xs[half - 1] + xs[half]) / 2


def _kth_deviation(xs: Sequence[float], split: int, m: float, k: int) -> tuple[float, float]:
    """The k-th and (k+1)-th smallest |x - m| of a sorted sequence, 0-based.

    The deviations form two increasing runs: ``m - xs[split-1-i]`` to the left of the split
    and ``xs[split+j] - m`` to the right; a binary search on how many of the k+1 smallest
    come from the left run finds the k-th smallest of their merge in O(log n).
    """
    n_left = split
    n_right = len(xs) - split
    lo = max(0, k + 1 - n_right)
    hi = min(k + 1, n_left)
    while lo < hi:
        i = (lo + hi) // 2
        j = k + 1 - i
        if j > 0 and m - xs[split - 1 - i] < xs[split + j - 1] - m:
            lo = i + 1
        else:
            hi = i
    i = lo
    j = k + 1 - i
    left_last = m - xs[split - i] if i > 0 else -math.inf
    right_last = xs[split + j - 1] - m if j > 0 else -math.inf
    kth = left_last if left_last >= right_last else right_last
    left_next = m - xs[split - 1 - i] if i < n_left else math.inf
    right_next = xs[split + j] - m if j < n_right else math.inf
    return kth, left_next if left_next <= right_next else right_next


def mad_of_sorted(xs: Sequence[float], m: float) -> float:
    """Median absolute deviation from ``m`` of a non-empty sorted sequence (unscaled)."""
    n = len(xs)
    split = bisect_right(xs, m)
    if n % 2:
        kth, _ = _kth_deviation(xs, split, m, n // 2)
        return kth
    low, high = _kth_deviation(xs, split, m, n // 2 - 1)
    return (low + high) / 2


def mad_lower_bound(xs: Sequence[float], m: float) -> float:
    """A cheap lower bound on the MAD of a sorted sequence (0 for fewer than 4 values).

    At least (n+1)//2 values lie within MAD of the median, but the open interval between
    ``xs[a]`` and ``xs[b]`` (b - a - 1 = (n-1)//2 positions around the middle) holds fewer,
    so MAD >= min(m - xs[a], xs[b] - m). Lets a caller rule out a spike in O(1).
    """
    n = len(xs)
    if n < 4:
        return 0.0
    k = (n - 1) // 2
    a = k - (k + 1) // 2
    b = a + k + 1
    below = m - xs[a]
    above = xs[b] - m
    return below if below <= above else above


def robust_scale(xs: Sequence[float], m: float, min_scale_rel: float) -> float:
    """A spread that is never zero: 1.4826·MAD, else 1.2533·mean |x - m|, else a floor.

    MAD is zero when more than half the window equals the median (quantised or clipped
    values); the mean absolute deviation still sees the rest. When every value is equal
    the floor is ``min_scale_rel * |m|`` (``min_scale_rel`` when that is 0), so a new value
    gets a finite z-score proportional to its relative change, never a division by zero.

    Args:
        xs: The window, sorted, non-empty.
        m: Its median.
        min_scale_rel: The relative floor.

    Returns:
        A positive spread.
    """
    mad = mad_of_sorted(xs, m)
    if mad > 0.0:
        return MAD_TO_SIGMA * mad
    total = 0.0
    for x in xs:
        total += abs(x - m)
    mean_ad = total / len(xs)
    if mean_ad > 0.0:
        return MEAN_AD_TO_SIGMA * mean_ad
    floor = min_scale_rel * abs(m)
    return floor if floor > 0.0 else min_scale_rel


def slide(
    window: int,
    steps: tuple[int, ...],
    values: tuple[float, ...],
    ordered: tuple[float, ...],
    value: float,
    step: int,
) -> tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]]:
    """The window with ``value`` of ``step`` added and, when it was full, its oldest value out.

    Args:
        window: Values kept.
        steps: Step of each value, in arrival order.
        values: The values, in arrival order.
        ordered: The same values, sorted.
        value: The new value (finite: the caller checks).
        step: Its step.

    Returns:
        The new ``(steps, values, ordered)``.
    """
    out = list(ordered)
    insort(out, value)
    if len(values) >= window:
        del out[bisect_left(out, values[0])]
        # Concatenation, not unpacking: ~25 % faster uncompiled (bench/core.py).
        return steps[1:] + (step,), values[1:] + (value,), tuple(out)  # noqa: RUF005
    return steps + (step,), values + (value,), tuple(out)  # noqa: RUF005


__all__ = [
    "MAD_TO_SIGMA",
    "MEAN_AD_TO_SIGMA",
    "mad_lower_bound",
    "mad_of_sorted",
    "median_of_sorted",
    "robust_scale",
    "slide",
]
