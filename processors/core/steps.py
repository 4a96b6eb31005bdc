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
* upward loss spikes (robust z against the baseline before the value, or a run of
  ``loss_shift_steps`` losses each above ``loss_shift_z``) and grad-norm spikes (robust z
  of the logarithm, and at least ``grad_min_ratio`` times the median);
* MFU and tokens/s of the step, and the run totals over kept steps.
"""

from __future__ import annotations

import math
from typing import Final

import msgspec

from runwatch.processors.core.baseline import (
    RollingBaseline,
)
from runwatch.processors.core.bounds import MAX_STEP, MAX_STEP_JUMP, check_incarnation, check_step
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.continuity import (
    RestartRecord,
    close_record,
    judge,
    record_outcome,
    start_check,
)
from runwatch.processors.core.episodes import (
    SpikeEpisode,
    advance_cusum_episode,
    interrupted,
    open_cusum_episode,
)
from runwatch.processors.core.ledger import COL_GRAD, COL_LOSS, StepLedger
from runwatch.processors.core.replicas import fold_replicas
from runwatch.processors.core.runinfo import RunInfo
from runwatch.processors.core.step_checks import (
    Emitter,
    count_kinds,
    grad_spike_step,
    log_pairs,
    loss_shift,
    loss_spike_step,
    step_accounting,
)
from runwatch.processors.core.step_state import StepHealthState, new_step_state
from runwatch.schemas.events import (
    AnomalyDetected,
    Provenance,
    RunEnded,
    RunStarted,
    StepCompleted,
)

MAX_RESTART_RECORDS: Final = 64
_NAN: Final = math.nan


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
            log_pairs(ledger.recent(COL_GRAD, cfg.grad_window)),
            cfg.min_scale_rel,
        ),
        "ledger": ledger,
    }


def _close_episodes(state: StepHealthState, em: Emitter) -> StepHealthState:
    """Decide the open spike episodes as interrupted (episode rule 7), emitting their verdicts."""
    if state.loss_episode is None and state.grad_episode is None:
        return state
    for ep, label in ((state.loss_episode, "loss"), (state.grad_episode, "grad norm")):
        decision = interrupted(ep, state.last_step)
        if decision is not None:
            em.emit_episode(decision, label)
    return msgspec.structs.replace(
        state,
        loss_episode=None,
        grad_episode=None,
        anomaly_counts=count_kinds(state.anomaly_counts, em.out),
    )


def _on_run_started(
    state: StepHealthState, event: RunStarted, source: Provenance, cfg: DetectorConfig
) -> tuple[StepHealthState, list[AnomalyDetected]]:
    em = Emitter(state, event, source, state.info.config(cfg))
    state = _close_episodes(state, em)
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
        last_index=source.index,
        info=info,
        last_ts_ns=max(state.last_ts_ns, event.ts_ns),
        first_ts_ns=first,
        nonfinite_loss_run=0,
        nonfinite_grad_run=0,
        divergence_run=0,
        collapse_run=0,
        loss_spike_run=0,
        grad_spike_run=0,
        loss_cusum=0.0,
        loss_cusum_reported=False,
        check=None,
        restarts=restarts,
        **rebuilt,
    ), em.out


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
        loss_cusum=0.0,
        loss_cusum_reported=False,
        loss_episode=None,
        grad_episode=None,
        loss_episode_starts=tuple(s for s in state.loss_episode_starts if s <= from_step),
        **rebuilt,
    )


def _cusum_episode(
    em: Emitter,
    ep: SpikeEpisode | None,
    loss: float,
    cusum: float,
    crossing: tuple[float, float] | None,
    spiking: bool,
    cfg: DetectorConfig,
) -> SpikeEpisode | None:
    """Advance an open CUSUM episode, or open one at a crossing (episode loss rule 6)."""
    step = em.step
    if ep is not None and ep.by_cusum and ep.start_step < step:
        ep, decision = advance_cusum_episode(ep, step, loss, cusum, spiking, cfg)
        if decision is not None:
            em.emit_episode(decision, "loss")
    if crossing is not None and ep is None:
        ep = open_cusum_episode(step, loss, crossing, cusum, cfg)
    return ep


def _on_step(
    state: StepHealthState, event: StepCompleted, source: Provenance, cfg: DetectorConfig
) -> tuple[StepHealthState, list[AnomalyDetected]]:
    step = event.step
    closed: list[AnomalyDetected] = []
    if event.restart_from_step is not None or step <= state.last_step:
        from_step = step - 1
        if event.restart_from_step is not None:
            from_step = min(event.restart_from_step, from_step)
        closing = Emitter(state, event, source, cfg)
        state = _resume(_close_episodes(state, closing), event, from_step, cfg)
        closed = closing.out
    info = state.info
    em = Emitter(state, event, source, cfg)
    em.out = closed
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
    loss_spike_run, loss_ep, starts = (
        state.loss_spike_run,
        state.loss_episode,
        state.loss_episode_starts,
    )
    loss_cusum, loss_cusum_reported = state.loss_cusum, state.loss_cusum_reported
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
            outcome = judge(
                check, step, loss, cfg.restart_z_thresh, pair_threshold=cfg.restart_pair_z_thresh
            )
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
        if broke:
            loss_spike_run = 1  # the discontinuity stands for the spike: no episode opens
        else:
            loss_spike_run, loss_ep, starts = loss_spike_step(
                em, loss_base, loss, cfg, loss_spike_run, loss_ep, starts
            )
        loss_cusum, loss_cusum_reported, crossing = loss_shift(
            loss_base, loss, cfg, loss_cusum, loss_cusum_reported or loss_spike_run > 0
        )
        loss_ep = _cusum_episode(em, loss_ep, loss, loss_cusum, crossing, loss_spike_run > 0, cfg)
        loss_base = loss_base.with_value(loss, step)

    grad_base, grad_spike_run = state.grad, state.grad_spike_run
    usable_grad = grad if grad_ok and grad > 0.0 else None  # type: ignore[operator]
    grad_spike_run, grad_ep = grad_spike_step(
        em,
        grad_base,
        usable_grad,
        cfg,
        grad_spike_run,
        state.grad_episode,
        starts[-1] if starts else -1,
    )
    if usable_grad is not None:
        grad_base = grad_base.with_value(math.log(usable_grad), step)

    step_time_s, tokens, step_mfu, tokens_per_s = step_accounting(info, event, cfg)
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
    replicas = state.replicas
    if event.participants:  # a per-step fault-tolerant run: who was in the quorum
        replicas = fold_replicas(replicas, event, em.emit_replica)
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
        count_kinds(state.anomaly_counts, verdicts) if verdicts else state.anomaly_counts,
        loss_cusum,
        loss_cusum_reported,
        source.index,
        replicas,
        loss_ep,
        grad_ep,
        starts,
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
        source: The event's log position; a position ``(offset, index)`` at or below the
            state's last applied one is skipped (no double apply after a crash, a pack's
            events included).
        cfg: The processor's configuration (the run's own thresholds are applied on top).

    Returns:
        The new state and the verdicts the event triggered (in a fixed order).

    Raises:
        BoundError: A step or incarnation past a bound of `processors.core.bounds`
            (the shared fold makes the record a dead letter).
    """
    if state is None:
        state = new_step_state(event.run_id, cfg)
    elif source.offset <= state.last_offset and (
        source.offset < state.last_offset or source.index <= state.last_index
    ):  # at or before the last applied (offset, index): a pack's events are (o, 0), (o, 1)...
        return state, []
    if type(event) is StepCompleted:
        step = event.step
        if step >= MAX_STEP or step - state.last_step > MAX_STEP_JUMP:  # bounds.py
            check_step(step, state.last_step)
        if event.restart_from_step is not None:
            check_step(event.restart_from_step, -1, "restart_from_step")
        return _on_step(state, event, source, state.info.config(cfg))
    if isinstance(event, RunStarted):
        check_incarnation(event.incarnation, state.info.incarnation, "RunStarted incarnation")
        return _on_run_started(state, event, source, cfg)
    if isinstance(event, RunEnded):
        em = Emitter(state, event, source, state.info.config(cfg))
        state = _close_episodes(state, em)
        return msgspec.structs.replace(
            state,
            last_offset=source.offset,
            last_index=source.index,
            info=state.info.ended(event),
            last_ts_ns=max(state.last_ts_ns, event.ts_ns),
        ), em.out
    return msgspec.structs.replace(state, last_offset=source.offset, last_index=source.index), []


__all__ = ["StepEvent", "StepHealthState", "fold_step", "new_step_state"]
