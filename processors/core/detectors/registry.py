"""The step detectors, in the order they judge a step (and so the order of their verdicts).

Live processors, audit replay and the in-process monitor all fold steps through
`processors.core.steps.fold_step`, which runs this list: adding a detector here adds it
everywhere. See docs/core.md, "Adding a detector".
"""

from __future__ import annotations

from typing import Final

from runwatch.processors.core.detectors.base import AnyStepDetector
from runwatch.processors.core.detectors.ceiling import CEILING
from runwatch.processors.core.detectors.nonfinite import NONFINITE
from runwatch.processors.core.detectors.replica import REPLICAS
from runwatch.processors.core.detectors.restart import CONTINUITY
from runwatch.processors.core.detectors.spikes import GRAD_SPIKE, LOSS_SPIKE

STEP_DETECTORS: Final[tuple[AnyStepDetector, ...]] = (
    NONFINITE,
    CEILING,
    CONTINUITY,
    LOSS_SPIKE,  # after CONTINUITY: reads facts.broke
    GRAD_SPIKE,  # after LOSS_SPIKE: reads facts.loss_start
    REPLICAS,
)
"""Every step detector, in judging order."""

__all__ = ["STEP_DETECTORS"]
