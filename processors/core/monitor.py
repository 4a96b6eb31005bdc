"""The in-process monitor: runwatch's verdicts inside a training script, without Kafka.

Its API is seed 000's, names and signatures, all importable from here (and the monitor
from `runwatch` itself)::

    from runwatch.processors.core.monitor import (
        Anomaly, MFUSample, ModelFlopConfig, RollingBaseline, StepRecord,
        TrainingHealthMonitor, flop_config_from_causal_lm, theoretical_flops_per_iter,
    )

For users who want receipts without Kafka: call `TrainingHealthMonitor.observe_step` once
per optimizer step, `TrainingHealthMonitor.observe_rank_step` per rank heartbeat, and
`TrainingHealthMonitor.report` at the end. Every call is turned into the event the
emitter would have sent (provenance topic ``inproc``, offsets counted per stream) and
folded by the same reducers the stream processors use, so in-process and Kafka verdicts
agree. Log time is synthetic: it advances by each step's ``step_time_s`` (or follows
``ts_ns`` when the caller gives it); the wall clock is never read.

Nothing here detects anything by itself. `RollingBaseline` is the seed's mutable
baseline, a thin holder of the core's immutable `processors.core.baseline.RollingBaseline`.
Where the engine knowingly differs from the seed (spikes are upward and once per streak,
the restart check looks at 20 steps, dead ranks also have a log-time rule, ...), see
"Differences from the seeds" in ``docs/core.md``.

This module imports no torch: ``flop_config_from_causal_lm`` imports
``runwatch.producers.torch_helpers`` (and so torch) when it is called.
"""

from __future__ import annotations

import importlib
from collections import deque
from collections.abc import Callable
from typing import Any, Final, cast

from runwatch.processors.core.baseline import RollingBaseline as BaselineValue
from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.health_records import Anomaly, MFUSample, StepRecord
from runwatch.processors.core.liveness import LivenessState, advance_step, fold_liveness
from runwatch.processors.core.mfu import theoretical_flops_per_iter
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
from runwatch.schemas.topics import FOLD_ORDER, TopicRole

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
        self._offsets = dict.fromkeys(FOLD_ORDER, -1)  # per stream, as if it were a topic
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

    def _source(self, stream: TopicRole) -> Provenance:
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
        self._steps, _ = fold_step(self._steps, started, self._source(TopicRole.STEPS), self.config)
        self._liveness, _ = fold_liveness(
            self._liveness, started, self._source(TopicRole.HEARTBEATS), self.config
        )

    def _record(self, verdicts: list[AnomalyDetected], at_step: int) -> list[Anomaly]:
        out = []
        for verdict in verdicts:
            out.append(Anomaly.from_verdict(verdict, at_step))
            self._policy, commands = fold_policy(
                self._policy, verdict, self._source(TopicRole.ANOMALIES), self.config
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
        self._steps, verdicts = fold_step(
            self._steps, event, self._source(TopicRole.STEPS), self.config
        )
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
            self._liveness, event, self._source(TopicRole.HEARTBEATS), self.config
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
            self._liveness, current_step, self._source(TopicRole.HEARTBEATS), self.config
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
    "INPROC_TOPIC",
    "MAX_RECORDS",
    "Anomaly",
    "MFUSample",
    "ModelFlopConfig",
    "RollingBaseline",
    "StepRecord",
    "TrainingHealthMonitor",
    "flop_config_from_causal_lm",
    "theoretical_flops_per_iter",
]
