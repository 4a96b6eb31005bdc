"""Step health: the reducer over one run's steps topic (RunStarted, StepCompleted, RunEnded).

``fold_step(state, event, source, cfg) -> (state, verdicts)`` is pure: it reads nothing but
its arguments, returns a new state and never changes the old one. Per step it checks, in
this order:

* a resume: a restart marker (``restart_from_step=S``) or a step number seen again rolls
  the baselines and the kept-step ledger back to S; after a marker the next
  ``restart_check_steps`` steps are judged against the baseline as it stood at S;
* non-finite loss and grad norm (always, also during warmup; once per streak);
* divergence (loss above the ceiling, once per streak) and collapse (loss held near
  ln(vocab) for ``collapse_steps`` after the run had learned);
* upward loss and grad-norm spikes (robust z against the baseline before the value);
* MFU and tokens/s of the step, and the run totals over kept steps.
"""

from __future__ import annotations

import math
from typing import Final

import msgspec

from processors.core.baseline import (
    MAD_TO_SIGMA,
    RollingBaseline,
    mad_lower_bound,
    median_of_sorted,
    robust_scale,
)
from processors.core.config import DetectorConfig, config_hash
from processors.core.continuity import (
    RestartCheck,
    RestartRecord,
    close_record,
    judge,
    record_outcome,
    start_check,
)
from processors.core.ledger import COL_GRAD, COL_LOSS, StepLedger, Totals
from processors.core.mfu import mfu
from processors.core.runinfo import RunInfo
from processors.core.verdicts import make_anomaly
from schemas.events import (
    AnomalyDetected,
    AnomalyKind,
    Provenance,
    RunEnded,
    RunStarted,
    StepCompleted,
)

MAX_RESTART_RECORDS: Final = 64
_NAN: Final = math.nan
_SAFE: Final = 1.0 - 1e-12
"""Keeps the spike shortcut strictly inside the exact test despite rounding."""


class StepHealthState(msgspec.Struct, frozen=True, gc=False):
    """Everything the step-health reducer knows about one run.

    Attributes:
        run_id: The run.
        last_offset: Offset of the last applied event (-1: none); older ones are skipped.
        info: What the run announced (incarnation, model shape, peak, thresholds).
        loss: Loss baseline.
        grad: Grad-norm baseline.
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
        best_loss: Lowest finite loss seen.
        nonfinite_loss_run: Consecutive non-finite losses.
        nonfinite_grad_run: Consecutive non-finite grad norms.
        divergence_run: Consecutive losses above the ceiling.
        collapse_run: Consecutive losses near ln(vocab) after learning.
        loss_spike_run: Consecutive loss spikes (one verdict per streak).
        grad_spike_run: Consecutive grad-norm spikes (one verdict per streak).
        attempt: Resumes seen (verdicts of redone steps get new ids).
        check: The running restart check, if any.
        continuity_ok: False once any resume broke continuity.
        restarts: The latest resumes with their continuity verdicts.
        anomaly_counts: Verdicts raised, by kind.
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
    best_loss: float = math.inf
    nonfinite_loss_run: int = 0
    nonfinite_grad_run: int = 0
    divergence_run: int = 0
    collapse_run: int = 0
    loss_spike_run: int = 0
    grad_spike_run: int = 0
    attempt: int = 0
    check: RestartCheck | None = None
    continuity_ok: bool = True
    restarts: tuple[RestartRecord, ...] = ()
    anomaly_counts: dict[str, int] = {}

    @property
    def incarnation(self) -> int:
        """The gang incarnation of the run's latest RunStarted."""
        return self.info.incarnation

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


def _rebuild(state: StepHealthState, ledger: StepLedger, cfg: DetectorConfig) -> dict[str, object]:
    """Baselines rebuilt from the ledger's kept rows (after a rollback or a new config)."""
    return {
        "loss": RollingBaseline.from_pairs(
            cfg.loss_window,
            cfg.loss_min_periods,
            ledger.recent(COL_LOSS, cfg.loss_window),
            cfg.min_scale_rel,
        ),
        "grad": RollingBaseline.from_pairs(
            cfg.grad_window,
            cfg.grad_min_periods,
            ledger.recent(COL_GRAD, cfg.grad_window),
            cfg.min_scale_rel,
        ),
        "ledger": ledger,
    }


def _on_run_started(
    state: StepHealthState, event: RunStarted, source: Provenance, cfg: DetectorConfig
) -> StepHealthState:
    info = RunInfo.from_event(event)
    old_cfg, new_cfg = state.info.config(cfg), info.config(cfg)
    rebuilt = _rebuild(state, state.ledger, new_cfg) if old_cfg != new_cfg else {}
    restarts = state.restarts
    if restarts and restarts[-1].verdict == "pending":
        restarts = (*restarts[:-1], close_record(restarts[-1]))
    first = state.first_ts_ns if state.first_ts_ns >= 0 else event.ts_ns
    return msgspec.structs.replace(
        state,
        last_offset=source.offset,
        info=info,
        last_ts_ns=max(state.last_ts_ns, event.ts_ns),
        first_ts_ns=first,
        nonfinite_loss_run=0,
        nonfinite_grad_run=0,
        divergence_run=0,
        collapse_run=0,
        loss_spike_run=0,
        grad_spike_run=0,
        check=None,
        restarts=restarts,
        **rebuilt,
    )


def _resume(
    state: StepHealthState, event: StepCompleted, from_step: int, cfg: DetectorConfig
) -> StepHealthState:
    """Roll back to ``from_step``; start the continuity check after a restart marker."""
    marked = event.restart_from_step is not None
    prior = state.ledger.values_after(from_step, COL_LOSS, cfg.restart_check_steps)
    rebuilt = _rebuild(state, state.ledger.rollback(from_step), cfg)
    loss: RollingBaseline = rebuilt["loss"]  # type: ignore[assignment]
    record = RestartRecord(
        at_step=event.step,
        from_step=from_step,
        incarnation=state.info.incarnation,
        ts_ns=event.ts_ns,
        marked=marked,
        verdict="unchecked",
    )
    check = start_check(loss, cfg.restart_check_steps, from_step + 1, prior) if marked else None
    if check is not None:
        record = msgspec.structs.replace(record, verdict="pending")
    restarts = state.restarts
    if restarts and restarts[-1].verdict == "pending":
        restarts = (*restarts[:-1], close_record(restarts[-1]))
    restarts = (*restarts, record)[-MAX_RESTART_RECORDS:]
    return msgspec.structs.replace(
        state,
        attempt=state.attempt + 1,
        check=check,
        restarts=restarts,
        nonfinite_loss_run=0,
        nonfinite_grad_run=0,
        divergence_run=0,
        collapse_run=0,
        loss_spike_run=0,
        grad_spike_run=0,
        **rebuilt,
    )


class _Emitter:
    """Builds the verdicts of one event (same provenance, log time and identity)."""

    __slots__ = ("cfg", "event", "out", "source", "state")

    def __init__(
        self, state: StepHealthState, event: StepCompleted, source: Provenance, cfg: DetectorConfig
    ) -> None:
        self.state = state
        self.event = event
        self.source = source
        self.cfg = cfg
        self.out: list[AnomalyDetected] = []

    def emit(
        self,
        kind: AnomalyKind,
        *,
        value: float | None,
        detail: str,
        baseline: float | None = None,
        scale: float | None = None,
        z: float | None = None,
        threshold: float | None = None,
    ) -> None:
        self.out.append(
            make_anomaly(
                run_id=self.state.run_id,
                kind=kind,
                step=self.event.step,
                ts_ns=self.event.ts_ns,
                source=self.source,
                config_hash=config_hash(self.cfg),
                incarnation=self.state.info.incarnation,
                attempt=self.state.attempt,
                rank=None,  # loss and grad norm are all-reduced: run-wide
                value=value,
                baseline=baseline,
                scale=scale,
                z=z,
                threshold=threshold,
                detail=detail,
            )
        )


def _spike(base: RollingBaseline, value: float, thresh: float) -> tuple[float, float, float] | None:
    """``(median, scale, z)`` when ``value`` is an upward spike against ``base``, else None."""
    ordered = base.ordered
    if len(ordered) < base.min_periods:
        return None
    median = median_of_sorted(ordered)
    if not value > median:
        return None
    # Exact shortcut: scale >= 1.4826 * MAD >= 1.4826 * bound whenever MAD > 0 (bound is 0
    # otherwise), so a value this close cannot be a spike; skip the O(log n) MAD search.
    if value - median < thresh * MAD_TO_SIGMA * mad_lower_bound(ordered, median) * _SAFE:
        return None
    scale = robust_scale(ordered, median, base.min_scale_rel)
    z = (value - median) / scale
    return (median, scale, z) if z > thresh else None


def _count(counts: dict[str, int], verdicts: list[AnomalyDetected]) -> dict[str, int]:
    out = dict(counts)
    for v in verdicts:
        out[v.kind] = out.get(v.kind, 0) + 1
    return out


def _step_accounting(
    info: RunInfo, event: StepCompleted, cfg: DetectorConfig
) -> tuple[float, float, float | None, float | None]:
    """``(step_time_s, tokens, mfu, tokens_per_s)`` of a step (time 0 when unusable)."""
    step_time_s = event.step_time_s
    if not (step_time_s > 0.0 and math.isfinite(step_time_s)):
        step_time_s = 0.0
    tokens = event.tokens
    flop_config = info.flop_config
    if not tokens and event.examples and flop_config is not None:
        tokens = event.examples * flop_config.seq_len
    if not tokens or step_time_s == 0.0:
        return step_time_s, float(tokens), None, None
    per_token = info.flops_per_token(cfg)
    step_mfu = None
    if per_token is not None:
        step_mfu = mfu(per_token * tokens, step_time_s, info.peak_flops_per_s)
    return step_time_s, float(tokens), step_mfu, tokens / step_time_s


def _on_step(
    state: StepHealthState, event: StepCompleted, source: Provenance, cfg: DetectorConfig
) -> tuple[StepHealthState, list[AnomalyDetected]]:
    step = event.step
    if event.restart_from_step is not None:
        state = _resume(state, event, min(event.restart_from_step, step - 1), cfg)
    elif step <= state.last_step:
        state = _resume(state, event, step - 1, cfg)
    info = state.info
    em = _Emitter(state, event, source, cfg)
    loss = event.loss
    loss_ok = math.isfinite(loss)
    nonfinite_loss_run = 0 if loss_ok else state.nonfinite_loss_run + 1
    if nonfinite_loss_run == 1:
        em.emit("nonfinite_loss", value=loss, detail=f"loss is {loss!r} at step {step}")

    grad = event.grad_norm
    grad_ok = grad is not None and math.isfinite(grad)
    nonfinite_grad_run = state.nonfinite_grad_run
    if grad is None or grad_ok:
        nonfinite_grad_run = 0
    elif not event.skipped:
        nonfinite_grad_run += 1
        if nonfinite_grad_run == 1:
            em.emit("nonfinite_grad_norm", value=grad, detail=f"grad norm is {grad!r}")

    loss_base, check, restarts = state.loss, state.check, state.restarts
    continuity_ok, best_loss = state.continuity_ok, state.best_loss
    divergence_run, collapse_run = state.divergence_run, state.collapse_run
    loss_spike_run = state.loss_spike_run
    if loss_ok:
        ceiling = info.loss_ceiling(cfg)
        if ceiling is not None and loss > ceiling:
            divergence_run += 1
            if divergence_run == 1:
                em.emit(
                    "loss_divergence",
                    value=loss,
                    threshold=ceiling,
                    detail=f"loss {loss:.6g} above the ceiling {ceiling:.6g}",
                )
        else:
            divergence_run = 0
        ln_vocab = info.ln_vocab
        if ln_vocab is not None:
            learned = best_loss <= ln_vocab - cfg.collapse_learned_nats
            if learned and abs(loss - ln_vocab) <= cfg.collapse_band_nats:
                collapse_run += 1
                if collapse_run == cfg.collapse_steps:
                    em.emit(
                        "loss_collapse",
                        value=loss,
                        baseline=ln_vocab,
                        threshold=cfg.collapse_band_nats,
                        detail=f"loss held near ln(vocab)={ln_vocab:.4f} for "
                        f"{collapse_run} steps after reaching {best_loss:.4g}",
                    )
            else:
                collapse_run = 0
        best_loss = min(best_loss, loss)
        broke = False
        if check is not None:
            outcome = judge(check, step, loss, cfg.restart_z_thresh)
            restarts = (*restarts[:-1], record_outcome(restarts[-1], outcome))
            if outcome.broken:
                broke = True
                continuity_ok = False
                versus = "its first attempt" if outcome.paired else "the median at the resume"
                em.emit(
                    "restart_discontinuity",
                    value=loss,
                    baseline=outcome.reference,
                    scale=check.scale,
                    z=max(outcome.z, outcome.cumulative_z),
                    threshold=cfg.restart_z_thresh,
                    detail=f"step {step} after resuming from {restarts[-1].from_step}: "
                    f"loss {loss:.6g} vs {versus} {outcome.reference:.6g}, "
                    f"z={outcome.z:.3g}, cumulative z={outcome.cumulative_z:.3g} "
                    f"over {check.n + 1} steps",
                )
            check = outcome.check
        spike = None if broke else _spike(loss_base, loss, cfg.loss_z_thresh)
        if broke:
            loss_spike_run = 1  # the discontinuity opens the episode
        elif spike is None:
            loss_spike_run = 0
        else:
            loss_spike_run += 1
            if loss_spike_run == 1:
                median, scale, z = spike
                em.emit(
                    "loss_spike",
                    value=loss,
                    baseline=median,
                    scale=scale,
                    z=z,
                    threshold=cfg.loss_z_thresh,
                    detail=f"loss {loss:.6g} vs median {median:.6g} (z={z:.3g})",
                )
        loss_base = loss_base.update(loss, step)

    grad_base, grad_spike_run = state.grad, state.grad_spike_run
    if grad_ok:
        assert grad is not None
        spike = _spike(grad_base, grad, cfg.grad_z_thresh)
        if spike is None:
            grad_spike_run = 0
        else:
            grad_spike_run += 1
            if grad_spike_run == 1:
                median, scale, z = spike
                em.emit(
                    "grad_norm_spike",
                    value=grad,
                    baseline=median,
                    scale=scale,
                    z=z,
                    threshold=cfg.grad_z_thresh,
                    detail=f"grad norm {grad:.6g} vs median {median:.6g} (z={z:.3g})",
                )
        grad_base = grad_base.update(grad, step)

    step_time_s, tokens, step_mfu, tokens_per_s = _step_accounting(info, event, cfg)
    ledger = state.ledger.append(
        step,
        loss if loss_ok else _NAN,
        grad if grad_ok else _NAN,  # type: ignore[arg-type]
        step_time_s,
        tokens,
        _NAN if step_mfu is None else step_mfu,
    )
    first_ts_ns = state.first_ts_ns
    if first_ts_ns < 0:
        # The run began when its first step began (an absurd step time cannot push it
        # before the epoch).
        lead_ns = step_time_s * 1e9
        first_ts_ns = event.ts_ns - (int(lead_ns) if lead_ns < event.ts_ns else max(event.ts_ns, 0))
    verdicts = em.out
    # Positional, in field order (a test pins the order): ten times cheaper than replace().
    new = StepHealthState(
        state.run_id,
        source.offset,
        info,
        loss_base,
        grad_base,
        ledger,
        step,
        max(state.last_ts_ns, event.ts_ns),
        first_ts_ns,
        loss,
        grad,
        event.step_time_s,
        step_mfu,
        tokens_per_s,
        state.steps_observed + 1,
        state.skipped_steps + event.skipped,
        best_loss,
        nonfinite_loss_run,
        nonfinite_grad_run,
        divergence_run,
        collapse_run,
        loss_spike_run,
        grad_spike_run,
        state.attempt,
        check,
        continuity_ok,
        restarts,
        _count(state.anomaly_counts, verdicts) if verdicts else state.anomaly_counts,
    )
    return new, verdicts


StepEvent = RunStarted | StepCompleted | RunEnded
"""Events of a run on the steps topic."""


def fold_step(
    state: StepHealthState | None,
    event: StepEvent,
    source: Provenance,
    cfg: DetectorConfig,
) -> tuple[StepHealthState, list[AnomalyDetected]]:
    """Apply one event of a run's steps topic.

    Args:
        state: The run's state, None for a run not seen yet (its id is the event's).
        event: RunStarted, StepCompleted or RunEnded of that run.
        source: The event's log position; an offset at or below the state's last applied
            offset is skipped (no double apply after a crash).
        cfg: The processor's configuration (the run's own thresholds are applied on top).

    Returns:
        The new state and the verdicts the event triggered (in a fixed order).
    """
    if state is None:
        state = new_step_state(event.run_id, cfg)
    elif source.offset <= state.last_offset:
        return state, []
    if type(event) is StepCompleted:
        return _on_step(state, event, source, state.info.config(cfg))
    if isinstance(event, RunStarted):
        return _on_run_started(state, event, source, cfg), []
    if isinstance(event, RunEnded):
        return msgspec.structs.replace(
            state,
            last_offset=source.offset,
            info=state.info.ended(event),
            last_ts_ns=max(state.last_ts_ns, event.ts_ns),
        ), []
    return msgspec.structs.replace(state, last_offset=source.offset), []


__all__ = ["StepEvent", "StepHealthState", "fold_step", "new_step_state"]
