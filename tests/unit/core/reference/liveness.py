"""Reference copy of the liveness reducer before the rank table (frozen per-rank tuples).

Time is log time only: the largest ``ts_ns`` among the run's heartbeats and the ticks of
its partition, never a clock read here. Three verdicts:

* ``dead_rank``: a known rank is more than ``rank_heartbeat_threshold`` steps behind the
  run's newest step (seed 000's rule), or has been silent for more than
  ``dead_rank_timeout_s`` of log time (DDP ranks block in the all-reduce when a peer dies,
  so no step advances and the step rule alone would never fire). Once per outage: cleared
  when the rank reports again.
* ``hang``: no rank reported for ``hang_timeout_s`` of log time (``startup_timeout_s``
  before the incarnation's first heartbeat). Once per outage.
* ``straggler``: see `tests.unit.core.reference.stragglers`.

A RunEnded suspends every check until the next RunStarted, which starts a new incarnation
with a fresh rank table.
"""

from __future__ import annotations

import msgspec

from runwatch.processors.core.config import DetectorConfig, effective_config
from runwatch.schemas.events import (
    AnomalyDetected,
    Heartbeat,
    Provenance,
    RunEnded,
    RunStarted,
    Tick,
)
from tests.unit.core.reference.liveness_scans import Gang, Verdicts, step_scan, time_scan
from tests.unit.core.reference.liveness_state import NEVER, LivenessState
from tests.unit.core.reference.stragglers import observe


def _incarnation_state(state: LivenessState, event: RunStarted) -> LivenessState:
    step_hint = max(state.step_hint, state.run_step)
    return LivenessState(
        run_id=state.run_id,
        last_offset=state.last_offset,
        incarnation=event.incarnation,
        thresholds=dict(event.thresholds),
        log_time_ns=event.ts_ns,  # the new gang's clock (issue 19, finding 2)
        started_ns=event.ts_ns,
        expected_ranks=event.world_size,
        known_ranks=event.world_size,
        step_hint=step_hint,
        ranks=(NEVER, 0) * event.world_size,
        heartbeats=state.heartbeats,
        raised=state.raised,
        anomaly_counts=state.anomaly_counts,
    )


def _verdict_step(state: LivenessState) -> int:
    return state.run_step if state.run_step >= 0 else state.step_hint


def _on_heartbeat(
    state: LivenessState, event: Heartbeat, source: Provenance, cfg: DetectorConfig
) -> tuple[LivenessState, list[AnomalyDetected]]:
    ts_ns = event.ts_ns
    now_ns = ts_ns if ts_ns > state.log_time_ns else state.log_time_ns
    if not state.live:
        return msgspec.structs.replace(state, last_offset=source.offset, log_time_ns=now_ns), []
    rank, step = event.rank, event.step
    ranks = state.ranks
    i = 2 * rank
    if i >= len(ranks):
        ranks = ranks + (NEVER, 0) * (rank + 1 - len(ranks) // 2)
    previous = ranks[i]
    ranks = ranks[:i] + (step, ts_ns) + ranks[i + 2 :]  # noqa: RUF005 (faster, hot path)
    known = state.known_ranks
    if previous == NEVER and rank >= state.expected_ranks:
        known += 1
    first_step, first_ns = state.first_step, state.first_heartbeat_ns
    if first_step < 0:
        first_step, first_ns = step, ts_ns
    step_scan_at = state.step_scan_at
    if previous != NEVER and step < previous:
        step_scan_at = min(step_scan_at, step + cfg.rank_heartbeat_threshold + 1)
    dead_before = state.dead
    if dead_before and rank in dead_before:
        dead_before = tuple(r for r in dead_before if r != rank)
    last_heartbeat_ns = ts_ns if ts_ns > state.last_heartbeat_ns else state.last_heartbeat_ns
    run_step = step if step > state.run_step else state.run_step
    time_scan_after = state.time_scan_after_ns
    need_step_scan = run_step > state.run_step and run_step >= step_scan_at
    need_time_scan = now_ns - time_scan_after > cfg.dead_rank_timeout_s * 1e9
    out: Verdicts | None = None
    dead = dead_before
    if need_step_scan or need_time_scan:
        out = Verdicts(state, ts_ns, source, cfg)
        gang = Gang(state.expected_ranks, first_step, first_ns, last_heartbeat_ns)
        scratch = list(dead_before)
        if need_step_scan:
            step_scan_at = step_scan(gang, ranks, scratch, run_step, cfg, out)
        if need_time_scan:
            time_scan_after = time_scan(gang, ranks, scratch, now_ns, cfg, out, run_step)
        if len(scratch) != len(dead_before):
            dead = tuple(sorted(scratch))
    stragglers, slow = observe(
        state.stragglers,
        rank,
        step,
        event.step_time_s,
        known - len(dead),
        cfg.straggler_ratio,
        cfg.straggler_steps,
    )
    if slow:
        out = out or Verdicts(state, ts_ns, source, cfg)
        for s in slow:
            out.emit(
                "straggler",
                s.step,
                s.rank,
                s.ratio,
                cfg.straggler_ratio,
                f"rank {s.rank} at {s.ratio:.2f}x its peers' median step time "
                f"{s.peer_median_s:.4g} s for {s.streak} steps",
                baseline=s.peer_median_s,
            )
    verdicts = out.out if out is not None else []
    # Positional, in field order (a test pins the order): much cheaper than replace().
    new = LivenessState(
        state.run_id,
        source.offset,
        state.incarnation,
        True,
        state.status,
        state.thresholds,
        now_ns,
        state.started_ns,
        state.expected_ranks,
        known,
        first_step,
        first_ns,
        run_step,
        state.step_hint,
        last_heartbeat_ns,
        ranks,
        dead,
        False,
        time_scan_after,
        step_scan_at,
        stragglers,
        state.heartbeats + 1,
        out.raised() if verdicts and out is not None else state.raised,
        out.counts() if verdicts and out is not None else state.anomaly_counts,
    )
    return new, verdicts


def _on_tick(
    state: LivenessState, event: Tick, source: Provenance, cfg: DetectorConfig
) -> tuple[LivenessState, list[AnomalyDetected]]:
    if not state.live:  # as the live reducer: a Tick leaves an ended run untouched
        return state, []
    now_ns = max(state.log_time_ns, event.ts_ns)
    out = Verdicts(state, event.ts_ns, source, cfg)
    hung = state.hung
    started = state.first_step >= 0
    if not hung:
        since_ns = state.last_heartbeat_ns if started else state.started_ns
        timeout_s = cfg.hang_timeout_s if started else cfg.startup_timeout_s
        silent_ns = now_ns - since_ns
        if silent_ns > timeout_s * 1e9:
            hung = True
            what = "no rank reported" if started else "no rank reported since the start"
            out.emit(
                "hang",
                _verdict_step(state),
                None,
                silent_ns / 1e9,
                timeout_s,
                f"{what} for {silent_ns / 1e9:.1f} s of log time",
            )
    dead = list(state.dead)
    time_scan_after = state.time_scan_after_ns
    if started and now_ns - time_scan_after > cfg.dead_rank_timeout_s * 1e9:
        gang = Gang(
            state.expected_ranks,
            state.first_step,
            state.first_heartbeat_ns,
            state.last_heartbeat_ns,
        )
        time_scan_after = time_scan(gang, state.ranks, dead, now_ns, cfg, out, _verdict_step(state))
    return msgspec.structs.replace(
        state,
        last_offset=source.offset,
        log_time_ns=now_ns,
        hung=hung,
        dead=tuple(sorted(dead)),
        time_scan_after_ns=time_scan_after,
        raised=out.raised(),
        anomaly_counts=out.counts() if out.out else state.anomaly_counts,
    ), out.out


def advance_step(
    state: LivenessState, step: int, source: Provenance, cfg: DetectorConfig
) -> tuple[LivenessState, list[AnomalyDetected]]:
    """Tell the reducer the run is at ``step`` (seed 000's ``check_rank_liveness``).

    For in-process callers that know the run's step from the training loop itself: every
    known rank more than ``rank_heartbeat_threshold`` steps behind ``step`` is flagged.

    Args:
        state: The run's liveness state.
        step: The run's current step.
        source: A log position for the verdicts' provenance.
        cfg: The processor's configuration.

    Returns:
        The new state and the dead_rank verdicts.
    """
    cfg = _config(state, cfg)
    if not state.live or (state.first_step < 0 and state.expected_ranks == 0):
        return state, []
    run_step = max(state.run_step, step)
    first_step = state.first_step if state.first_step >= 0 else step
    current = msgspec.structs.replace(state, run_step=run_step, first_step=first_step)
    out = Verdicts(current, state.log_time_ns, source, cfg)
    dead = list(state.dead)
    gang = Gang(state.expected_ranks, first_step, state.first_heartbeat_ns, state.last_heartbeat_ns)
    step_scan_at = step_scan(gang, current.ranks, dead, run_step, cfg, out)
    return msgspec.structs.replace(
        current,
        dead=tuple(sorted(dead)),
        step_scan_at=step_scan_at,
        raised=out.raised(),
        anomaly_counts=out.counts() if out.out else state.anomaly_counts,
    ), out.out


def _config(state: LivenessState, cfg: DetectorConfig) -> DetectorConfig:
    return effective_config(cfg, state.thresholds)


LivenessEvent = RunStarted | Heartbeat | Tick | RunEnded
"""Events of a run on the heartbeats topic (a Tick applies to every run of its partition)."""


def fold_liveness(
    state: LivenessState | None,
    event: LivenessEvent,
    source: Provenance,
    cfg: DetectorConfig,
) -> tuple[LivenessState, list[AnomalyDetected]]:
    """Apply one event of a run's heartbeats topic.

    Args:
        state: The run's state; None for a run not seen yet (not allowed for a Tick,
            which names no run: the caller passes each known run's state).
        event: RunStarted, Heartbeat, Tick or RunEnded.
        source: The event's log position; offsets at or below the last applied one are
            skipped.
        cfg: The processor's configuration (the run's own thresholds apply on top).

    Returns:
        The new state and the verdicts the event triggered.

    Raises:
        ValueError: A Tick with no state.
    """
    if state is None:
        if isinstance(event, Tick):
            raise ValueError("a Tick applies to known runs: pass each run's state")
        state = LivenessState(run_id=event.run_id, started_ns=event.ts_ns)
    elif source.offset <= state.last_offset:
        return state, []
    if type(event) is Heartbeat:
        return _on_heartbeat(
            state,
            event,
            source,
            effective_config(cfg, state.thresholds) if state.thresholds else cfg,
        )
    if isinstance(event, Tick):
        return _on_tick(state, event, source, _config(state, cfg))
    if isinstance(event, RunStarted):
        fresh = _incarnation_state(state, event)
        return msgspec.structs.replace(fresh, last_offset=source.offset), []
    if isinstance(event, RunEnded):
        return msgspec.structs.replace(
            state,
            last_offset=source.offset,
            live=False,
            status=event.status,
            hung=False,
            log_time_ns=max(state.log_time_ns, event.ts_ns),
        ), []
    return msgspec.structs.replace(state, last_offset=source.offset), []


__all__ = ["LivenessEvent", "LivenessState", "advance_step", "fold_liveness"]
