"""A robust rolling baseline: median and scaled MAD of a trailing window of values.

Median and MAD rather than mean and standard deviation, so an earlier spike in the window
does not widen the spread that judges the next one. The baseline is an immutable value:
`RollingBaseline.with_value` returns a new baseline and leaves the old one as it was, so a
fold that keeps it in its state never mutates earlier states. There is deliberately no
``update``: seed 000's baseline mutates in place under that name, and ``b.update(v)`` on an
immutable value would drop ``v`` without a word, so the name raises instead. The seed's
mutable baseline is `processors.core.monitor.RollingBaseline`, built on this one.

Scoring is causal: `RollingBaseline.z_score` judges a value against the window as it
stood before the value was added, and the caller adds it afterwards with ``with_value``.

The window is kept twice, in arrival order (to know which value leaves next, and the step
of each value, so a rollback to step S can drop every value after S) and sorted (so the
median is an index and the MAD a binary search, without sorting on every step; for a
window of 50 this is about twenty times faster than numpy's median on the same data).
That arithmetic lives in `processors.core.window`, which the install compiles with mypyc
(this module's Struct stays uncompiled; see that module and `processors.core.native`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NoReturn

import msgspec

from runwatch.processors.core.window import (
    MAD_TO_SIGMA,
    MEAN_AD_TO_SIGMA,
    mad_lower_bound,
    mad_of_sorted,
    median_of_sorted,
    robust_scale,
    slide,
)


class RollingBaseline(msgspec.Struct, frozen=True, gc=False):
    """Median and scaled MAD of the last ``window`` values, each tagged with its step.

    Attributes:
        window: Values kept.
        min_periods: Values needed before the baseline exists (warmup: None before).
        min_scale_rel: Relative floor of the spread (see `robust_scale`).
        steps: Step of each value, in arrival order.
        values: The values, in arrival order.
        ordered: The same values, sorted.
    """

    window: int = 20
    min_periods: int = 5
    min_scale_rel: float = 1e-3
    steps: tuple[int, ...] = ()
    values: tuple[float, ...] = ()
    ordered: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        """Reject a window that cannot produce a baseline."""
        if self.window < 1 or self.min_periods < 1 or self.min_periods > self.window:
            raise ValueError(
                f"need 1 <= min_periods <= window, got window={self.window} "
                f"min_periods={self.min_periods}"
            )

    def __len__(self) -> int:
        """Values currently in the window."""
        return len(self.values)

    @property
    def ready(self) -> bool:
        """True once the window holds ``min_periods`` values."""
        return len(self.values) >= self.min_periods

    @property
    def last_step(self) -> int | None:
        """Step of the newest value, None when empty."""
        return self.steps[-1] if self.steps else None

    def median(self) -> float | None:
        """Median of the window, or None during warmup."""
        if len(self.values) < self.min_periods:
            return None
        return median_of_sorted(self.ordered)

    def baseline(self) -> tuple[float, float] | None:
        """``(median, scaled spread)`` of the window, or None during warmup."""
        if len(self.values) < self.min_periods:
            return None
        m = median_of_sorted(self.ordered)
        return m, robust_scale(self.ordered, m, self.min_scale_rel)

    def z_score(self, value: float) -> float | None:
        """Robust z-score of ``value`` against the window before it is added.

        Args:
            value: The new observation.

        Returns:
            ``(value - median) / scale``, or None during warmup or for a non-finite value.
        """
        stats = self.baseline()
        if stats is None or not math.isfinite(value):
            return None
        m, scale = stats
        return (value - m) / scale

    def with_value(self, value: float, step: int | None = None) -> RollingBaseline:
        """A new baseline with ``value`` added (the oldest value leaves a full window).

        Use as ``b = b.with_value(v, step)``: this baseline is not changed.

        Args:
            value: A finite observation.
            step: Its step; None: one after the newest step in the window (0 if empty).

        Returns:
            A new baseline; this one is unchanged.

        Raises:
            ValueError: ``value`` is NaN or infinite (it would corrupt the order).
        """
        if not math.isfinite(value):
            raise ValueError(f"a baseline only takes finite values, got {value!r}")
        if step is None:
            step = self.steps[-1] + 1 if self.steps else 0
        steps, values, ordered = slide(
            self.window, self.steps, self.values, self.ordered, value, step
        )
        return RollingBaseline(
            self.window, self.min_periods, self.min_scale_rel, steps, values, ordered
        )

    def update(self, *args: object, **kwargs: object) -> NoReturn:
        """Always raises: this baseline is immutable and ``update`` would lose the value.

        Raises:
            TypeError: Always, naming `RollingBaseline.with_value` and the mutable
                seed-compatible `processors.core.monitor.RollingBaseline`.
        """
        raise TypeError(
            "processors.core.baseline.RollingBaseline is immutable, so update() would "
            "silently drop the value: write `b = b.with_value(v)`, or use "
            "processors.core.monitor.RollingBaseline, which updates in place "
            "(seed 000's API)"
        )

    def rollback(self, step: int) -> RollingBaseline:
        """The baseline without the values of steps after ``step`` (a resume from ``step``).

        Values that left the window before the rollback do not come back; a caller that
        remembers more history rebuilds the window with `RollingBaseline.from_pairs`.

        Args:
            step: The step resumed from.

        Returns:
            A new baseline.
        """
        keep = [i for i, s in enumerate(self.steps) if s <= step]
        if len(keep) == len(self.steps):
            return self
        steps = tuple(self.steps[i] for i in keep)
        values = tuple(self.values[i] for i in keep)
        return RollingBaseline(
            self.window, self.min_periods, self.min_scale_rel, steps, values, tuple(sorted(values))
        )

    @classmethod
    def from_pairs(
        cls,
        window: int,
        min_periods: int,
        pairs: Iterable[tuple[int, float]],
        min_scale_rel: float = 1e-3,
    ) -> RollingBaseline:
        """A baseline holding the last ``window`` finite values of ``(step, value)`` pairs.

        Args:
            window: Values kept.
            min_periods: Warmup length.
            pairs: ``(step, value)`` in arrival order; non-finite values are skipped.
            min_scale_rel: Relative floor of the spread.

        Returns:
            The baseline.
        """
        kept = [(s, v) for s, v in pairs if math.isfinite(v)][-window:]
        steps = tuple(s for s, _ in kept)
        values = tuple(v for _, v in kept)
        return cls(window, min_periods, min_scale_rel, steps, values, tuple(sorted(values)))

    def state(self) -> dict[str, Any]:
        """A JSON-serializable snapshot; `RollingBaseline.restore` rebuilds the baseline."""
        return {
            "window": self.window,
            "min_periods": self.min_periods,
            "min_scale_rel": self.min_scale_rel,
            "steps": list(self.steps),
            "values": list(self.values),
        }

    @classmethod
    def restore(cls, state: dict[str, Any]) -> RollingBaseline:
        """Rebuild a baseline from `RollingBaseline.state`'s snapshot.

        Args:
            state: The snapshot.

        Returns:
            A baseline equal to the one that produced the snapshot.
        """
        steps = tuple(int(s) for s in state["steps"])
        values = tuple(float(v) for v in state["values"])
        if len(steps) != len(values):
            raise ValueError("baseline snapshot has as many steps as values")
        return cls(
            int(state["window"]),
            int(state["min_periods"]),
            float(state.get("min_scale_rel", 1e-3)),
            steps,
            values,
            tuple(sorted(values)),
        )


__all__ = [
    "MAD_TO_SIGMA",
    "MEAN_AD_TO_SIGMA",
    "RollingBaseline",
    "mad_lower_bound",
    "mad_of_sorted",
    "median_of_sorted",
    "robust_scale",
]
