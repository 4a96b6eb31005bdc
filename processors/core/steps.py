"""Step health: the reducer over one run's steps topic (RunStarted, StepCompleted, RunEnded).

``fold_step(state, event, source, cfg) -> (state, verdicts)`` is pure: it reads nothing but
its arguments, returns a new state and never changes the old one. Per step it:

* handles a resume: a restart marker (``restart_from_step=S``) or a step number seen again
  rolls the baselines and the kept-step ledger back to S and resets every detector; after
  a marker the next ``restart_check_steps`` steps are judged against the baseline as it
  stood at S;
* runs every detector of `processors.core.detectors.registry.STEP_DETECTORS`, in order:
  non-finite loss and grad norm (always, also during warmup; once per streak); divergence
  (loss above the ceiling) and collapse (loss held near ln(vocab) after the run had
  learned); restart continuity; upward loss spikes (robust z against the baseline before
  the value, or a CUSUM of sustained rise) and grad-norm spikes (robust z of the
  logarithm, and at least ``grad_min_ratio`` times the median), judged as episodes; the
  replica groups of a fault-tolerant run;
* adds the values to the baselines and accounts the step's MFU and tokens/s and the run
  totals over kept steps.
"""

from __future__ import annotations

import math
from typing import Final

import msgspec

from runwatch.processors.core.baseline import (
    RollingBaseline,
)
from runwatch.processors.core.bounds import MAX_STEP, MAX_STEP_JUMP, check_incarnation, check_step
from runwatch.processors.core.config import DetectorConfig, effective_config
from runwatch.processors.core.continuity import RestartRecord
from runwatch.processors.core.detectors.base import StepFacts
from runwatch.processors.core.detectors.registry import STEP_DETECTORS
from runwatch.processors.core.detectors.restart import begin_resume
from runwatch.processors.core.episodes import interrupted
from runwatch.processors.core.ledger import COL_GRAD, COL_LOSS, StepLedger
from runwatch.processors.core.runinfo import RunInfo
from runwatch.processors.core.step_checks import (
    Emitter,
    count_kinds,
    log_pairs,
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

_NAN: Final = math.nan


def _rebuild(ledger: StepLedger, cfg: DetectorConfig) -> dict[str, object]:
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


def _reset_detectors(state: StepHealthState, from_step: int) -> dict[str, object]:
    """Every detector's state after a rollback to ``from_step`` (or a new gang)."""
    return {d.field: d.reset(getattr(state, d.field), from_step) for d in STEP_DETECTORS}


def _close_episodes(state: StepHealthState, em: Emitter) -> StepHealthState:
    """Decide the open spike episodes as interrupted (episode rule 7), emitting their verdicts."""
    loss_ep, grad_ep = state.loss_spike.episode, state.grad_spike.episode
    if loss_ep is None and grad_ep is None:
        return state
    for ep, label in ((loss_ep, "loss"), (grad_ep, "grad norm")):
        decision = interrupted(ep, state.last_step)
        if decision is not None:
            em.emit_episode(decision, label)
    return msgspec.structs.replace(
        state,
        loss_spike=msgspec.structs.replace(state.loss_spike, episode=None),
        grad_spike=msgspec.structs.replace(state.grad_spike, episode=None),
        anomaly_counts=count_kinds(state.anomaly_counts, em.out),
    )


def _on_run_started(
    state: StepHealthState, event: RunStarted, source: Provenance, cfg: DetectorConfig
) -> tuple[StepHealthState, list[AnomalyDetected]]:
    em = Emitter(state, event, source, state.info.config(cfg))
    state = _close_episodes(state, em)
    info = RunInfo.from_event(event)
    old_cfg, new_cfg = state.info.config(cfg), info.config(cfg)
    rebuilt = _rebuild(state.ledger, new_cfg) if old_cfg != new_cfg else {}
    first = state.first_ts_ns if state.first_ts_ns >= 0 else event.ts_ns
    return msgspec.structs.replace(
        state,
        last_offset=source.offset,
        last_index=source.index,
        info=info,
        last_ts_ns=max(state.last_ts_ns, event.ts_ns),
        first_ts_ns=first,
        **_reset_detectors(state, state.last_step),
        **rebuilt,
    ), em.out


def _resume(
    state: StepHealthState, event: StepCompleted, from_step: int, cfg: DetectorConfig
) -> StepHealthState:
    """Roll back to ``from_step``; start the continuity check after a restart marker."""
    prior = state.ledger.values_after(from_step, COL_LOSS, cfg.restart_check_steps)
    rebuilt = _rebuild(state.ledger.rollback(from_step), cfg)
    record = RestartRecord(
        at_step=event.step,
        from_step=from_step,
        incarnation=state.info.incarnation,
        ts_ns=event.ts_ns,
        marked=event.restart_from_step is not None,
        verdict="unchecked",
    )
    reset = _reset_detectors(state, from_step)
    reset["continuity"] = begin_resume(
        reset["continuity"],  # type: ignore[arg-type]
        record,
        rebuilt["loss"],  # type: ignore[arg-type]
        prior,
        cfg.restart_check_steps,
    )
    return msgspec.structs.replace(state, attempt=state.attempt + 1, **reset, **rebuilt)


_FIELD: Final = {name: i for i, name in enumerate(StepHealthState.__struct_fields__)}
"""`StepHealthState` field -> its position (the order the state's constructor takes)."""

_FOLDS: Final = tuple((_FIELD[d.field], d.fold) for d in STEP_DETECTORS)
"""``(field position, fold)`` of each registered detector, in judging order."""

_LAST_OFFSET, _LOSS, _GRAD, _LEDGER = (_FIELD[f] for f in ("last_offset", "loss", "grad", "ledger"))
_LAST_STEP, _LAST_TS_NS, _FIRST_TS_NS = (
    _FIELD[f] for f in ("last_step", "last_ts_ns", "first_ts_ns")
)
_LAST_LOSS, _LAST_GRAD_NORM = _FIELD["last_loss"], _FIELD["last_grad_norm"]
_LAST_STEP_TIME_S, _LAST_MFU = _FIELD["last_step_time_s"], _FIELD["last_mfu"]
_LAST_TOKENS_PER_S, _STEPS_OBSERVED = _FIELD["last_tokens_per_s"], _FIELD["steps_observed"]
_SKIPPED_STEPS, _ANOMALY_COUNTS = _FIELD["skipped_steps"], _FIELD["anomaly_counts"]
_LAST_INDEX = _FIELD["last_index"]
_astuple: Final = msgspec.structs.astuple


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
    loss, grad = event.loss, event.grad_norm  # classified once for every detector
    grad_ok = grad is not None and math.isfinite(grad)
    facts = StepFacts(
        state, event, step, source, cfg, closed, state.info, loss, math.isfinite(loss),
        grad, grad_ok, grad if grad_ok and grad > 0.0 else None, state.loss, state.grad,  # type: ignore[operator]
    )  # fmt: skip
    # The new state's fields, by position: every registered detector folds its own in
    # place of the old value, then the step's own fields. One construction at the end
    # (no replace(): it costs per keyword, and a step changes about half the fields).
    values = list(_astuple(state))
    for index, fold in _FOLDS:  # every registered detector, in order
        values[index] = fold(facts, values[index])
    if facts.loss_ok:
        values[_LOSS] = facts.loss_base.with_value(loss, step)
    if facts.usable_grad is not None:
        values[_GRAD] = facts.grad_base.with_value(math.log(facts.usable_grad), step)
    step_time_s, tokens, step_mfu, tokens_per_s = step_accounting(facts.info, event, cfg)
    values[_LEDGER] = state.ledger.append(
        step,
        loss if facts.loss_ok else _NAN,
        grad if facts.grad_ok else _NAN,  # type: ignore[arg-type]
        step_time_s,
        tokens,
        _NAN if step_mfu is None else step_mfu,
    )
    verdicts = facts.out
    if verdicts:
        values[_ANOMALY_COUNTS] = count_kinds(state.anomaly_counts, verdicts)
    if event.skipped:
        values[_SKIPPED_STEPS] = state.skipped_steps + 1
    ts_ns = event.ts_ns
    if state.first_ts_ns < 0:  # the run began when its first step began (not before 1970)
        lead_ns = step_time_s * 1e9
        values[_FIRST_TS_NS] = ts_ns - (int(lead_ns) if lead_ns < ts_ns else max(ts_ns, 0))
    values[_LAST_OFFSET] = source.offset
    values[_LAST_STEP] = step
    if ts_ns > state.last_ts_ns:
        values[_LAST_TS_NS] = ts_ns
    values[_LAST_LOSS] = loss
    values[_LAST_GRAD_NORM] = grad
    values[_LAST_STEP_TIME_S] = event.step_time_s
    values[_LAST_MFU] = step_mfu
    values[_LAST_TOKENS_PER_S] = tokens_per_s
    values[_STEPS_OBSERVED] = state.steps_observed + 1
    values[_LAST_INDEX] = source.index
    return StepHealthState(*values), verdicts


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
        thresholds = state.info.thresholds  # most runs announce none: no config lookup
        return _on_step(
            state, event, source, effective_config(cfg, thresholds) if thresholds else cfg
        )
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
