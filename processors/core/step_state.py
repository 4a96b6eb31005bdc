"""The step-health reducer's state: what it knows about one run's steps."""

from __future__ import annotations

import msgspec

from runwatch.processors.core.baseline import RollingBaseline
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.continuity import RestartRecord
from runwatch.processors.core.detectors.ceiling import CeilingState
from runwatch.processors.core.detectors.nonfinite import NonfiniteState
from runwatch.processors.core.detectors.restart import ContinuityState
from runwatch.processors.core.detectors.spikes import GradSpikeState, LossSpikeState
from runwatch.processors.core.ledger import StepLedger, Totals
from runwatch.processors.core.replicas import ReplicaTally
from runwatch.processors.core.runinfo import RunInfo


class StepHealthState(msgspec.Struct, frozen=True, gc=False):
    """Everything the step-health reducer knows about one run.

    Attributes:
        run_id: The run.
        last_offset: Offset of the last applied event (-1: none); older ones are skipped.
        info: What the run announced (incarnation, model shape, peak, thresholds).
        loss: Loss baseline.
        grad: Baseline of ln(grad norm) (grad norms are judged in log space).
        ledger: Kept steps and run totals.
        last_step: Step of the last applied StepCompleted (-1: none).
        last_ts_ns: Log time of the last applied event.
        first_ts_ns: Start of the run's wall time (-1: unknown).
        last_loss: Loss of the last step.
        last_grad_norm: Grad norm of the last step.
        last_step_time_s: Step time of the last step.
        last_mfu: MFU of the last step (convention: ``mfu_convention``).
        last_tokens_per_s: Tokens/s of the last step (whole gang).
        steps_observed: StepCompleted events applied, redone steps included.
        skipped_steps: Steps whose optimizer update was skipped.
        attempt: Resumes seen (verdicts of redone steps get new ids).
        anomaly_counts: Verdicts raised, by kind.
        last_index: Index in its pack of the last applied event (-1: the record at
            ``last_offset`` was the event); with ``last_offset`` the position that older
            ones are skipped below.
        nonfinite: State of the non-finite detector (`detectors.nonfinite`).
        ceiling: State of the divergence and collapse detector (`detectors.ceiling`).
        continuity: State of the restart continuity detector (`detectors.restart`).
        loss_spike: State of the loss spike detector (`detectors.spikes`).
        grad_spike: State of the grad-norm spike detector (`detectors.spikes`).
        replicas: The run's replica groups and degraded steps (a torchft run's
            participants, `detectors.replica`).

    Each detector of `detectors.registry.STEP_DETECTORS` owns the field its ``field``
    names.
    """

    run_id: str
    last_offset: int = -1
    info: RunInfo = RunInfo()
    loss: RollingBaseline = RollingBaseline()
    grad: RollingBaseline = RollingBaseline()
    ledger: StepLedger = StepLedger()
    last_step: int = -1
    last_ts_ns: int = 0
    first_ts_ns: int = -1
    last_loss: float | None = None
    last_grad_norm: float | None = None
    last_step_time_s: float | None = None
    last_mfu: float | None = None
    last_tokens_per_s: float | None = None
    steps_observed: int = 0
    skipped_steps: int = 0
    attempt: int = 0
    anomaly_counts: dict[str, int] = {}
    last_index: int = -1
    nonfinite: NonfiniteState = NonfiniteState()
    ceiling: CeilingState = CeilingState()
    continuity: ContinuityState = ContinuityState()
    loss_spike: LossSpikeState = LossSpikeState()
    grad_spike: GradSpikeState = GradSpikeState()
    replicas: ReplicaTally = ReplicaTally()

    @property
    def incarnation(self) -> int:
        """The gang incarnation of the run's latest RunStarted."""
        return self.info.incarnation

    @property
    def best_loss(self) -> float:
        """Lowest finite loss seen."""
        return self.ceiling.best_loss

    @property
    def continuity_ok(self) -> bool:
        """False once any resume broke continuity."""
        return self.continuity.ok

    @property
    def restarts(self) -> tuple[RestartRecord, ...]:
        """The latest resumes with their continuity verdicts."""
        return self.continuity.restarts

    @property
    def totals(self) -> Totals:
        """Sums over kept steps."""
        return self.ledger.totals

    @property
    def kept_steps(self) -> int:
        """Steps kept (not dropped by a later rollback)."""
        return self.ledger.totals.steps

    @property
    def mfu_avg(self) -> float | None:
        """Run MFU over kept steps, weighted by step time (total FLOPs / total peak FLOPs)."""
        t = self.ledger.totals
        return t.mfu_time_weighted / t.mfu_time_s if t.mfu_time_s > 0 else None

    @property
    def mfu_mean(self) -> float | None:
        """Unweighted mean of per-step MFU over kept steps (seed 002's ``avg_mfu``)."""
        t = self.ledger.totals
        return t.mfu_sum / t.mfu_steps if t.mfu_steps > 0 else None

    @property
    def tokens_per_s_avg(self) -> float | None:
        """Run tokens/s over kept steps (total tokens / total step time)."""
        t = self.ledger.totals
        return t.tokens / t.time_s if t.time_s > 0 and t.tokens > 0 else None

    @property
    def wall_time_s(self) -> float | None:
        """Log time from the run's start to its latest event."""
        if self.first_ts_ns < 0 or self.last_ts_ns <= self.first_ts_ns:
            return None
        return (self.last_ts_ns - self.first_ts_ns) / 1e9

    @property
    def effective_training_time_ratio(self) -> float | None:
        """Share of wall time spent on kept steps (capped at 1 against clock skew)."""
        wall = self.wall_time_s
        if wall is None:
            return None
        return min(1.0, self.ledger.totals.time_s / wall)


def new_step_state(run_id: str, cfg: DetectorConfig) -> StepHealthState:
    """An empty state for a run, sized by ``cfg``."""
    return StepHealthState(
        run_id=run_id,
        loss=RollingBaseline(cfg.loss_window, cfg.loss_min_periods, cfg.min_scale_rel),
        grad=RollingBaseline(cfg.grad_window, cfg.grad_min_periods, cfg.min_scale_rel),
        ledger=StepLedger.with_horizon(cfg.history_steps),
    )


__all__ = ["StepHealthState", "new_step_state"]
