"""Seed 000's ``training_health`` API, in one module, on runwatch's verdict engine.

Everything seed 000 documents is importable from here, under its name and signature::

    from runwatch.processors.core.training_health import (
        Anomaly, MFUSample, ModelFlopConfig, RollingBaseline, StepRecord,
        TrainingHealthMonitor, flop_config_from_causal_lm, theoretical_flops_per_iter,
    )

Nothing here detects anything by itself. `TrainingHealthMonitor` turns each call into the
event a `producers.RunEmitter` would have sent and folds it through the same reducers as
the stream processors and ``runwatch audit``; `RollingBaseline` is the seed's mutable
baseline, a thin holder of the core's immutable `processors.core.baseline.RollingBaseline`.
Where the engine knowingly differs from the seed (spikes are upward and once per streak,
the restart check looks at 20 steps, dead ranks also have a log-time rule, ...), see
"Differences from the seeds" in ``docs/core.md``.

This module imports no torch: ``flop_config_from_causal_lm`` imports
``producers.torch_helpers`` (and so torch) when it is called.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, cast

from runwatch.processors.core.baseline import RollingBaseline as BaselineValue
from runwatch.processors.core.health_records import Anomaly, MFUSample, StepRecord
from runwatch.processors.core.mfu import theoretical_flops_per_iter
from runwatch.processors.core.monitor import TrainingHealthMonitor
from runwatch.schemas.events import ModelFlopConfig


class RollingBaseline:
    """A robust rolling baseline (median and scaled MAD of a trailing window) that mutates.

    Seed 000's class: `RollingBaseline.update` adds a value to *this* baseline. Score first,
    then update, so a value is never part of its own baseline::

        b = RollingBaseline(window=20, min_periods=5)
        for x in losses:
            z = b.z_score(x)  # None during warmup
            b.update(x)

    Each update replaces the immutable `processors.core.baseline.RollingBaseline` held in
    `RollingBaseline.value`, so the arithmetic is exactly the stream processors'.
    """

    __slots__ = ("_value",)

    def __init__(
        self, window: int = 20, min_periods: int = 5, *, min_scale_rel: float = 1e-3
    ) -> None:
        """Create an empty baseline.

        Args:
            window: Values kept (the newest).
            min_periods: Values needed before `baseline` and `z_score` return numbers.
            min_scale_rel: Relative floor of the spread when the whole window is one value.

        Raises:
            ValueError: Unless ``1 <= min_periods <= window``.
        """
        self._value = BaselineValue(window, min_periods, min_scale_rel)

    @classmethod
    def from_value(cls, value: BaselineValue) -> RollingBaseline:
        """A mutable baseline starting from a core (immutable) baseline."""
        out = cls(value.window, value.min_periods, min_scale_rel=value.min_scale_rel)
        out._value = value
        return out

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RollingBaseline:
        """Rebuild a baseline from `RollingBaseline.state` (e.g. after a checkpoint resume).

        Args:
            state: The snapshot.

        Returns:
            A baseline scoring exactly as the one that made the snapshot.
        """
        return cls.from_value(BaselineValue.restore(state))

    @property
    def value(self) -> BaselineValue:
        """The current window as a core baseline (a snapshot: later updates do not touch it)."""
        return self._value

    @property
    def window(self) -> int:
        """Values kept."""
        return self._value.window

    @property
    def min_periods(self) -> int:
        """Warmup length."""
        return self._value.min_periods

    @property
    def ready(self) -> bool:
        """True once the warmup is over."""
        return self._value.ready

    def __len__(self) -> int:
        """Values in the window."""
        return len(self._value)

    def __repr__(self) -> str:
        """Window size, warmup and fill."""
        return (
            f"RollingBaseline(window={self.window}, min_periods={self.min_periods}, "
            f"len={len(self)})"
        )

    def baseline(self) -> tuple[float, float] | None:
        """``(median, scaled MAD)`` of the current window, or None during warmup.

        The scaled MAD is 1.4826·MAD; when the MAD is 0 it falls back to 1.2533 times the
        mean absolute deviation, then to a relative floor, so it is always positive.
        """
        return self._value.baseline()

    def z_score(self, value: float) -> float | None:
        """Robust z-score of ``value`` against the window before ``value`` is added.

        Args:
            value: The new observation.

        Returns:
            ``(value - median) / scaled MAD``; None during warmup or when ``value`` is
            NaN or infinite (check those yourself: they are anomalies, not scores).
        """
        return self._value.z_score(value)

    def update(self, value: float) -> None:
        """Add ``value`` to this baseline (the oldest value leaves a full window).

        Args:
            value: A finite observation.

        Raises:
            ValueError: ``value`` is NaN or infinite; the baseline is unchanged.
        """
        self._value = self._value.with_value(value)

    def state(self) -> dict[str, Any]:
        """A JSON-serializable snapshot; `RollingBaseline.from_state` rebuilds it."""
        return self._value.state()


def flop_config_from_causal_lm(model: Any, seq_len: int) -> ModelFlopConfig:
    """Derive a `ModelFlopConfig` from a real decoder-only model (needs torch).

    Position-embedding parameters are excluded from ``n_params`` (a lookup, not a matmul),
    as nanoGPT's ``get_num_params(non_embedding=True)``. Shape attributes are read from the
    model or its ``config`` under the usual names; see
    ``producers.torch_helpers.flop_config_from_causal_lm``, which this calls.

    Args:
        model: A ``torch.nn.Module``, possibly wrapped in DDP, FSDP or ``torch.compile``.
        seq_len: Tokens per training sequence.

    Returns:
        The model's FLOP shape.

    Raises:
        ValueError: A shape attribute cannot be found.
    """
    helpers = importlib.import_module("runwatch.producers.torch_helpers")
    derive = cast(Callable[[Any, int], ModelFlopConfig], helpers.flop_config_from_causal_lm)
    return derive(model, seq_len)


__all__ = [
    "Anomaly",
    "MFUSample",
    "ModelFlopConfig",
    "RollingBaseline",
    "StepRecord",
    "TrainingHealthMonitor",
    "flop_config_from_causal_lm",
    "theoretical_flops_per_iter",
]
