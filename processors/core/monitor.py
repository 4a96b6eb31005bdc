"""TrainingHealthMonitor: seed 000's in-process monitor on top of the same reducers.

For users who want receipts without Kafka: call `TrainingHealthMonitor.observe_step` once
per optimizer step, `TrainingHealthMonitor.observe_rank_step` per rank heartbeat, and
`TrainingHealthMonitor.report` at the end. Every call is turned into the event the
emitter would have sent (provenance topic ``inproc``, offsets counted per stream) and
folded by the same reducers the stream processors use, so in-process and Kafka verdicts
agree. Log time is synthetic: it advances by each step's ``step_time_s`` (or follows
``ts_ns`` when the caller gives it); the wall clock is never read.

Import seed 000's names from `processors.core.training_health`, which gathers them
(this class, `Anomaly`, `MFUSample`, `StepRecord`, `ModelFlopConfig`, the mutable
`RollingBaseline`, ``theoretical_flops_per_iter`` and ``flop_config_from_causal_lm``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final

from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.health_records import Anomaly, MFUSample, StepRecord
from runwatch.processors.core.liveness import LivenessState, advance_step, fold_liveness
from runwatch.processors.core.policy import PolicyState, fold_policy
from runwatch.processors.core.report import health_report
from runwatch.processors.core.steps import StepHealthState, fold_step
from runwatch.schemas.events import (
    AnomalyDetected,
    Heartbeat,
    ModelFlopConfig,
    Provenance,
    RestartRequested,
    RunStarted,
    StepCompleted,
)

INPROC_TOPIC: Final = "inproc"
"""Provenance topic of the events the monitor synthesises."""
MAX_RECORDS: Final = 100_000
"""Default number of `StepRecord` and `MFUSample` values kept (the newest)."""


class TrainingHealthMonitor:
    """The run object: ``observe_step(...)`` per optimizer step, ``report()`` at the end.

    The keyword defaults are seed 000's (windows of 20 with a warmup of 5, z threshold 6,
    heartbeat threshold 50); every other setting is `DetectorConfig`'s, as in the stream
    processors. `TrainingHealthMonitor.from_config` takes a whole configuration instead.

    Attributes:
        config: The detector configuration in use.
        anomalies: Every anomaly raised, in order.
        commands: The restart commands the policy would have issued.
        records: The newest observed steps (at most ``max_records``).
        mfu_samples: The newest per-step MFU samples (at most ``max_records``).
    """

    def __init__(
        self,
        *,
        flop_config: ModelFlopConfig | None = None,
        peak_flops_per_sec: float | None = None,
        loss_window: int = 20,
        loss_min_periods: int = 5,
        loss_z_thresh: float = 6.0,
        grad_window: int = 20,
        grad_min_periods: int = 5,
        grad_z_thresh: float = 6.0,
        rank_heartbeat_threshold: int = 50,
        run_id: str = "inproc",
        vocab_size: int | None = None,
        world_size: int = 0,
        dtype: str = "",
        max_records: int = MAX_RECORDS,
    ) -> None:
        """Create a monitor.

        Args:
            flop_config: Model shape for MFU.
            peak_flops_per_sec: Hardware peak of the whole gang for the training dtype.
            loss_window: Loss baseline window.
            loss_min_periods: Loss warmup (no spike verdict before this many values).
            loss_z_thresh: Loss spike threshold (robust z).
            grad_window: Grad-norm baseline window.
            grad_min_periods: Grad-norm warmup.
            grad_z_thresh: Grad-norm spike threshold.
            rank_heartbeat_threshold: Steps of silence that make a rank dead.
            run_id: Run id of the synthesised events.
            vocab_size: Vocabulary size (enables the collapse check and divergence ceiling).
            world_size: Ranks expected to call ``observe_rank_step`` (0: learn them).
            dtype: Training precision (for the report).
            max_records: `StepRecord` and `MFUSample` values kept (the newest); the
                report's totals come from the reducers and do not depend on it.

        Raises:
            ValueError: A setting is invalid (e.g. ``loss_min_periods > loss_window``).
        """
        config = with_overrides(
            DetectorConfig(),
            {
                "loss_window": loss_window,
                "loss_min_periods": loss_min_periods,
                "loss_z_thresh": loss_z_thresh,
                "grad_window": grad_window,
                "grad_min_periods": grad_min_periods,
                "grad_z_thresh": grad_z_thresh,
                "rank_heartbeat_threshold": rank_heartbeat_threshold,
            },
        )
        self._setup(
            config,
            flop_config=flop_config,
            peak_flops_per_sec=peak_flops_per_sec,
            run_id=run_id,
            vocab_size=vocab_size,
            world_size=world_size,
            dtype=dtype,
            max_records=max_records,
        )

    @classmethod
    def from_config(
        cls,
        config: DetectorConfig,
        *,
        flop_config: ModelFlopConfig | None = None,
        peak_flops_per_sec: float | None = None,
        run_id: str = "inproc",
        vocab_size: int | None = None,
        world_size: int = 0,
        dtype: str = "",
        max_records: int = MAX_RECORDS,
    ) -> TrainingHealthMonitor:
        """A monitor with a whole detector configuration (e.g. the processors' own).

        Settings are taken from ``config`` alone; change some with
        ``with_overrides(config, {...})``. The other arguments are `__init__`'s.

        Returns:
            The monitor.
        """
        monitor = cls.__new__(cls)
        monitor._setup(
            config,
            flop_config=flop_config,
            peak_flops_per_sec=peak_flops_per_sec,
            run_id=run_id,
            vocab_size=vocab_size,
            world_size=world_size,
            dtype=dtype,
            max_records=max_records,
        )
        return monitor

    def _setup(
        self,
        config: DetectorConfig,
        *,
        flop_config: ModelFlopConfig | None,
        peak_flops_per_sec: float | None,
        run_id: str,
        vocab_size: int | None,
        world_size: int,
        dtype: str,
        max_records: int,
    ) -> None:
        if max_records < 0:
            raise ValueError(f"max_records must be >= 0, got {max_records}")
        self.config = config
        self.run_id = run_id
        self.flop_config = flop_config
        self.peak_flops_per_sec = peak_flops_per_sec
        self.anomalies: list[Anomaly] = []
        self.commands: list[RestartRequested] = []
        self.records: deque[StepRecord] = deque(maxlen=max_records)
        self.mfu_samples: deque[MFUSample] = deque(maxlen=max_records)
        self._steps: StepHealthState | None = None
        self._liveness: LivenessState | None = None
        self._policy: PolicyState | None = None
        self._offsets = {"steps": -1, "heartbeats": -1, "anomalies": -1}
        self._clock_ns = 0
        self._pending_liveness: list[Anomaly] = []
        self._started = RunStarted(
            run_id=run_id,
            ts_ns=0,
            world_size=world_size,
            flop_config=flop_config,
            peak_flops_per_s=peak_flops_per_sec,
            dtype=dtype or "fp32",
            vocab_size=vocab_size,
        )
        self._start_incarnation(0)

    def _source(self, stream: str) -> Provenance:
        self._offsets[stream] += 1
        return Provenance(topic=INPROC_TOPIC, partition=0, offset=self._offsets[stream])

    def _start_incarnation(self, incarnation: int) -> None:
        started = RunStarted(
            run_id=self._started.run_id,
            ts_ns=self._clock_ns,
            world_size=self._started.world_size or (self._liveness.width if self._liveness else 0),
            flop_config=self._started.flop_config,
            peak_flops_per_s=self._started.peak_flops_per_s,
            dtype=self._started.dtype,
            vocab_size=self._started.vocab_size,
            incarnation=incarnation,
        )
        self._steps, _ = fold_step(self._steps, started, self._source("steps"), self.config)
        self._liveness, _ = fold_liveness(
            self._liveness, started, self._source("heartbeats"), self.config
        )

    def _record(self, verdicts: list[AnomalyDetected], at_step: int) -> list[Anomaly]:
        out = []
        for verdict in verdicts:
            out.append(Anomaly.from_verdict(verdict, at_step))
            self._policy, commands = fold_policy(
                self._policy, verdict, self._source("anomalies"), self.config
            )
            self.commands.extend(commands)
        self.anomalies.extend(out)
        return out

    def _log_time(self, ts_ns: int | None, step_time_s: float | None) -> int:
        if ts_ns is not None:
            self._clock_ns = max(self._clock_ns, ts_ns)
        elif step_time_s is not None and step_time_s > 0:
            self._clock_ns += int(step_time_s * 1e9)
        return self._clock_ns

    def observe_step(
        self,
        step: int,
        loss: float,
        *,
        grad_norm: float | None = None,
        step_time_s: float | None = None,
        batch_size: int | None = None,
        restart: bool = False,
        restart_from_step: int | None = None,
        tokens: int | None = None,
        ts_ns: int | None = None,
    ) -> list[Anomaly]:
        """Record one optimizer step; return the anomalies it raised.

        Args:
            step: The step just completed.
            loss: Its loss (NaN and infinities are reported, never dropped).
            grad_norm: Global grad norm before clipping.
            step_time_s: Wall time of the step (for MFU, tokens/s and log time).
            batch_size: Sequences in the step (whole gang); tokens = batch x seq_len.
            restart: True on the first step after a checkpoint resume: the baselines
                go back to the resume point and the next steps are judged against them
                (``restart_discontinuity`` when the loss jumps).
            restart_from_step: The checkpoint step resumed from (default ``step - 1``).
            tokens: Tokens in the step (whole gang), instead of ``batch_size``.
            ts_ns: Timestamp to use as log time (default: advance by ``step_time_s``).

        Returns:
            The anomalies raised at this step (also appended to ``self.anomalies``).
        """
        if restart or restart_from_step is not None:
            self._start_incarnation(self.incarnation + 1)
            if restart_from_step is None:
                restart_from_step = step - 1
        if tokens is None and batch_size is not None and self.flop_config is not None:
            tokens = batch_size * self.flop_config.seq_len
        event = StepCompleted(
            run_id=self.run_id,
            ts_ns=self._log_time(ts_ns, step_time_s),
            step=step,
            loss=loss,
            grad_norm=grad_norm,
            step_time_s=step_time_s or 0.0,
            tokens=tokens or 0,
            examples=batch_size or 0,
            restart_from_step=restart_from_step,
        )
        self._steps, verdicts = fold_step(self._steps, event, self._source("steps"), self.config)
        self.records.append(StepRecord(step, loss, grad_norm, step_time_s, restart))
        self._sample_mfu(step, event)
        return self._record(verdicts, step)

    def _sample_mfu(self, step: int, event: StepCompleted) -> None:
        """Keep the step's MFU from the numbers the step reducer used for its own figure."""
        state = self._steps
        if state is None or state.last_mfu is None:
            return
        info = state.info
        per_token = info.flops_per_token(info.config(self.config))
        peak = info.peak_flops_per_s
        if per_token is None or peak is None:
            return
        tokens = event.tokens
        if not tokens and info.flop_config is not None:
            tokens = event.examples * info.flop_config.seq_len
        self.mfu_samples.append(MFUSample(step, per_token * tokens, event.step_time_s, peak))

    def observe_rank_step(
        self, rank: int, step: int, *, step_time_s: float = 0.0, ts_ns: int | None = None
    ) -> None:
        """Record a heartbeat: ``rank`` finished its part of ``step``.

        A rank that reports after an outage clears its dead_rank flag. Verdicts raised
        here (a rank left behind, a straggler) are recorded and also returned by the next
        `TrainingHealthMonitor.check_rank_liveness` call.
        """
        event = Heartbeat(
            run_id=self.run_id,
            ts_ns=self._clock_ns if ts_ns is None else self._log_time(ts_ns, None),
            rank=rank,
            step=step,
            step_time_s=step_time_s,
        )
        self._liveness, verdicts = fold_liveness(
            self._liveness, event, self._source("heartbeats"), self.config
        )
        self._pending_liveness.extend(self._record(verdicts, step))

    def check_rank_liveness(self, current_step: int) -> list[Anomaly]:
        """Flag ranks silent for more than ``rank_heartbeat_threshold`` steps, once per outage.

        Args:
            current_step: The run's current step.

        Returns:
            The dead_rank anomalies raised since the previous call: by this one, and by
            heartbeats in between (the log-time rule).
        """
        assert self._liveness is not None
        self._liveness, verdicts = advance_step(
            self._liveness, current_step, self._source("heartbeats"), self.config
        )
        found = self._record(verdicts, current_step)
        pending = [a for a in self._pending_liveness if a.kind == "dead_rank"] + found
        self._pending_liveness = []
        return pending

    def continuity_ok(self) -> bool:
        """True unless a restart_discontinuity was ever flagged."""
        return self._steps.continuity_ok if self._steps is not None else True

    @property
    def incarnation(self) -> int:
        """Restarts observed so far (each starts a new incarnation)."""
        return self._steps.incarnation if self._steps is not None else 0

    @property
    def steps_state(self) -> StepHealthState | None:
        """The step-health reducer's state."""
        return self._steps

    @property
    def liveness_state(self) -> LivenessState | None:
        """The liveness reducer's state."""
        return self._liveness

    def report(self) -> dict[str, Any]:
        """A JSON-serializable summary: steps, MFU, anomalies by kind, restarts, dead ranks."""
        return health_report(
            self._steps,
            self._liveness,
            policy=self._policy,
            anomalies=[a.verdict for a in self.anomalies if a.verdict is not None],
            commands=self.commands,
            cfg=self.config,
        )


__all__ = ["INPROC_TOPIC", "MAX_RECORDS", "TrainingHealthMonitor"]
