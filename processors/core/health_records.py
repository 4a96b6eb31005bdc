"""Seed 000's value types: `Anomaly`, `MFUSample`, `StepRecord`.

They are what `processors.core.monitor.TrainingHealthMonitor` hands back to a training
loop. Each one is a thin, frozen view of something the reducers computed: an `Anomaly`
carries the `schemas.events.AnomalyDetected` verdict it was made from (``verdict``), and
an `MFUSample` holds the step FLOPs the step reducer used for its own MFU figure, so the
in-process numbers and the stream processors' numbers are the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from runwatch.processors.core.mfu import achieved_flops_per_s, mfu
from runwatch.schemas.events import AnomalyDetected, AnomalyKind


def _json_num(value: float | None) -> float | str | None:
    """A float for JSON: non-finite values as the strings the wire format uses."""
    if value is None or math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


@dataclass(frozen=True)
class Anomaly:
    """One flagged anomaly: what kind, at which step, and the baseline it was judged against.

    The first six fields are seed 000's, in its order; the rest are additions with
    defaults.

    Attributes:
        step: The step the anomaly concerns (for ``dead_rank``: the run's step when the
            rank was found behind).
        kind: What was detected (``loss_spike``, ``nonfinite_loss``, ``dead_rank``, ...).
        value: The observed value (loss, grad norm, steps behind, ...).
        baseline: The median it was judged against, if any.
        z_score: Its robust z-score, if any.
        detected_at_step: The step the training loop was at when it was raised.
        rank: The rank concerned, None for run-wide anomalies.
        detail: One human-readable line.
        verdict: The core's verdict it was made from (the same event the stream
            processors publish); not compared by ``==``.
    """

    step: int
    kind: AnomalyKind
    value: float | None
    baseline: float | None
    z_score: float | None
    detected_at_step: int
    rank: int | None = None
    detail: str = ""
    verdict: AnomalyDetected | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_verdict(cls, verdict: AnomalyDetected, detected_at_step: int | None = None) -> Anomaly:
        """The seed's view of a core verdict.

        Args:
            verdict: The verdict.
            detected_at_step: The loop's step when it was raised (default: its step).

        Returns:
            The anomaly.
        """
        return cls(
            step=verdict.step,
            kind=verdict.kind,
            value=verdict.value,
            baseline=verdict.baseline,
            z_score=verdict.z,
            detected_at_step=verdict.step if detected_at_step is None else detected_at_step,
            rank=verdict.rank,
            detail=verdict.detail,
            verdict=verdict,
        )

    def latency(self, injected_at_step: int) -> int:
        """Steps between the true anomaly step and detection; 0 means caught on that step.

        Args:
            injected_at_step: The step the fault really happened at.

        Returns:
            ``detected_at_step - injected_at_step`` (negative: raised before the fault,
            so not caused by it).
        """
        return self.detected_at_step - injected_at_step

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict (non-finite floats as ``"NaN"``/``"Infinity"``)."""
        return {
            "step": self.step,
            "kind": self.kind,
            "value": _json_num(self.value),
            "baseline": _json_num(self.baseline),
            "z_score": _json_num(self.z_score),
            "detected_at_step": self.detected_at_step,
            "rank": self.rank,
            "detail": self.detail,
            "verdict_id": self.verdict.verdict_id if self.verdict is not None else None,
        }


@dataclass(frozen=True)
class MFUSample:
    """One step's MFU: real wall-clock time against the step's theoretical FLOPs.

    Attributes:
        step: The step.
        step_flops: Theoretical FLOPs of the step (whole gang), under the monitor's MFU
            convention (``6N+attn`` unless configured otherwise).
        step_time_s: Measured wall time of the step.
        peak_flops_per_sec: Hardware peak (whole gang) for the training dtype.
    """

    step: int
    step_flops: float
    step_time_s: float
    peak_flops_per_sec: float

    @property
    def achieved_flops_per_sec(self) -> float | None:
        """``step_flops / step_time_s``; None when the time is not positive."""
        return achieved_flops_per_s(self.step_flops, self.step_time_s)

    @property
    def mfu(self) -> float | None:
        """Achieved over peak, as a fraction; None when time or peak is not positive."""
        return mfu(self.step_flops, self.step_time_s, self.peak_flops_per_sec)


@dataclass(frozen=True)
class StepRecord:
    """One observed training step, as passed to ``observe_step``.

    Attributes:
        step: The optimizer step.
        loss: Its loss (NaN and infinities are kept).
        grad_norm: Global grad norm, if given.
        step_time_s: Wall time of the step, if given.
        restart: True on the first step after a checkpoint resume.
    """

    step: int
    loss: float
    grad_norm: float | None = None
    step_time_s: float | None = None
    restart: bool = False


__all__ = ["Anomaly", "MFUSample", "StepRecord"]
