"""The step and liveness detectors, in the order they judge an event (and so verdict order).

Live processors, audit replay and the in-process monitor all fold steps through
`processors.core.steps.fold_step` and heartbeats through
`processors.core.liveness.fold_liveness`, which run these lists: adding a detector here
adds it everywhere. See docs/core.md, "Adding a detector".
"""

from __future__ import annotations

from typing import Final

from runwatch.processors.core.detectors.base import AnyStepDetector, LivenessDetector
from runwatch.processors.core.detectors.ceiling import CEILING
from runwatch.processors.core.detectors.exit_evidence import EXIT_EVIDENCE
from runwatch.processors.core.detectors.incarnation import INCARNATION
from runwatch.processors.core.detectors.nonfinite import NONFINITE
from runwatch.processors.core.detectors.rank_scans import RANK_SCANS
from runwatch.processors.core.detectors.replica import REPLICAS
from runwatch.processors.core.detectors.restart import CONTINUITY
from runwatch.processors.core.detectors.spikes import GRAD_SPIKE, LOSS_SPIKE
from runwatch.processors.core.detectors.straggler import STRAGGLERS

STEP_DETECTORS: Final[tuple[AnyStepDetector, ...]] = (
    NONFINITE,
    CEILING,
    CONTINUITY,
    LOSS_SPIKE,  # after CONTINUITY: reads facts.broke
    GRAD_SPIKE,  # after LOSS_SPIKE: reads facts.loss_start
    REPLICAS,
)
"""Every step detector, in judging order."""

LIVENESS_DETECTORS: Final[tuple[LivenessDetector, ...]] = (
    INCARNATION,  # RunStarted, RunEnded; a suspended run folds no heartbeat
    EXIT_EVIDENCE,  # RankExited; its exit_rank silences the scans
    RANK_SCANS,  # reads the reducer's new run step and rows; Tick
    STRAGGLERS,  # after RANK_SCANS: live ranks exclude those it flagged dead
)
"""Every liveness detector, in judging order (a heartbeat's verdicts: scans, then stragglers)."""

__all__ = ["LIVENESS_DETECTORS", "STEP_DETECTORS"]
