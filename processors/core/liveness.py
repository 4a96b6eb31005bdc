"""Liveness: the reducer over one run's heartbeats topic (heartbeats, ticks, exits, starts, ends).

Time is log time only: the largest ``ts_ns`` among the run's heartbeats and the ticks of
its partition, never a clock read here. Three verdicts:

* ``dead_rank``: a known rank is more than ``rank_heartbeat_threshold`` steps behind the
  run's newest step (seed 000's rule), or has been silent for more than
  ``dead_rank_timeout_s`` of log time (DDP ranks block in the all-reduce when a peer dies,
  so no step advances and the step rule alone would never fire). Once per outage: cleared
  when the rank reports again.
* ``hang``: no rank reported for ``hang_timeout_s`` of log time (``startup_timeout_s``
  before the incarnation's first heartbeat). Once per outage.
* ``straggler``: see `processors.core.stragglers`.

Exit evidence: a `schemas.events.RankExited` (the node agent saw a rank process end) of
the current incarnation with a non-zero exit code, a signal or an unknown status raises
``dead_rank`` for that rank at once, its detail naming the rank, host, pid and exit
status (the culprit; ``value`` is the status as a shell reports it, 128+N for signal N,
-1 unknown; ``threshold`` 0), and, when the rank's ``@record`` entry point left one, its
root cause (``RankExited.root_cause``: the exception's type and message). It is the
incarnation's one exit verdict: afterwards the silence and step scans and the hang check
raise nothing more for the incarnation (its other ranks block in a collective on the dead
peer, or exit because of it: consequences, not separate faults), and later RankExited
events of it raise nothing. A rank the scans had already flagged dead gets no second
verdict. A clean exit (code 0) raises nothing; the rank is flagged not live, so it is not
reported silent while its peers finish. RankExited of another incarnation (an older gang,
or one whose RunStarted is not in yet) and while the run is suspended are ignored. The
next RunStarted clears the culprit.

A RunEnded suspends every check until the next RunStarted, which starts a new incarnation
with a fresh rank table.

Cost: a heartbeat writes O(1) entries of the run's `processors.core.rank_table.RankTable`
(its last step and time, its straggler bucket) through the fold's journal; the dead-rank
scans and bucket closes are periodic and amortised O(1) per heartbeat (see
`processors.core.liveness_scans` and `processors.core.stragglers`), so the per-event cost
does not grow with the world size. States stay values: folding never changes what an
earlier state reads (the rank table's ownership rule), and verdicts are those of the
frozen-tuple reducer this replaced, byte for byte.
"""

from __future__ import annotations

from typing import Final

import msgspec

from runwatch.processors.core.bounds import MAX_STEP, MAX_STEP_JUMP, check_incarnation, check_step
from runwatch.processors.core.config import DetectorConfig, effective_config
from runwatch.processors.core.liveness_scans import Gang, Verdicts, step_scan, time_scan
from runwatch.processors.core.liveness_state import NEVER, LivenessState
from runwatch.processors.core.rank_table import RankTable
from runwatch.processors.core.stragglers import observe
from runwatch.schemas.events import (
    AnomalyDetected,
    Heartbeat,
    Provenance,
    RankExited,
    RunEnded,
    RunStarted,
    Tick,
)


def _incarnation_state(state: LivenessState, event: RunStarted) -> LivenessState:
    step_hint = max(state.step_hint, state.run_step)
    return LivenessState(
        run_id=state.run_id,
        last_offset=state.last_offset,
        last_index=state.last_index,
        incarnation=event.incarnation,
        thresholds=dict(event.thresholds),
        # The new gang's clock, not the old incarnation's log time: a time one bad record
        # pushed ahead must not carry into the next incarnation (issue 19, finding 2).
        log_time_ns=event.ts_ns,
        started_ns=event.ts_ns,
        expected_ranks=event.world_size,
        known_ranks=event.world_size,
        step_hint=step_hint,
        table=RankTable.of_width(event.world_size),
        heartbeats=state.heartbeats,
        raised=state.raised,
        anomaly_counts=state.anomaly_counts,
        launch_id=event.launch_id,
    )


def _verdict_step(state: LivenessState) -> int:
    return state.run_step if state.run_step >= 0 else state.step_hint


def _on_heartbeat(
    state: LivenessState, event: Heartbeat, source: Provenance, cfg: DetectorConfig
) -> tuple[LivenessState, list[AnomalyDetected]]:
    ts_ns = event.ts_ns
    now_ns = ts_ns if ts_ns > state.log_time_ns else state.log_time_ns
    if not state.live:
        return msgspec.structs.replace(
            state, last_offset=source.offset, last_index=source.index, log_time_ns=now_ns
        ), []
    rank, step = event.rank, event.step
    newest = state.run_step if state.run_step >= 0 else state.step_hint or -1
    if step >= MAX_STEP or step - newest > MAX_STEP_JUMP:  # before any write (bounds.py)
        check_step(step, newest if newest >= 0 else -1, "heartbeat step")
    table, data, journal = state.table.begin()
    steps, stamps = data.steps, data.ts
    if rank >= len(steps):
        for _ in range(rank + 1 - len(steps)):
            journal.push(steps, NEVER)
            journal.push(stamps, 0)
    previous = steps[rank]
    log = journal  # inline journal writes: this is the per-heartbeat path
    log.append((steps, rank, previous))
    steps[rank] = step
    log.append((stamps, rank, stamps[rank]))
    stamps[rank] = ts_ns
    known = state.known_ranks
    if previous == NEVER and rank >= state.expected_ranks:
        known += 1
    first_step, first_ns = state.first_step, state.first_heartbeat_ns
    if first_step < 0:
        first_step, first_ns = step, ts_ns
    step_scan_at = state.step_scan_at
    if previous != NEVER and step < previous:
        step_scan_at = min(step_scan_at, step + cfg.rank_heartbeat_threshold + 1)
    dead = data.dead
    if dead and rank in dead:
        journal.discard(dead, rank)
    last_heartbeat_ns = ts_ns if ts_ns > state.last_heartbeat_ns else state.last_heartbeat_ns
    run_step = step if step > state.run_step else state.run_step
    time_scan_after = state.time_scan_after_ns
    blamed = state.exit_rank >= 0  # the incarnation's culprit is named: peers are blocked
    need_step_scan = run_step > state.run_step and run_step >= step_scan_at and not blamed
    need_time_scan = now_ns - time_scan_after > cfg.dead_rank_timeout_s * 1e9 and not blamed
    out: Verdicts | None = None
    if need_step_scan or need_time_scan:
        out = Verdicts(state, ts_ns, source, cfg)
        gang = Gang(state.expected_ranks, first_step, first_ns, last_heartbeat_ns)
        if need_step_scan:
            step_scan_at = step_scan(gang, data, journal, run_step, cfg, out)
        if need_time_scan:
            time_scan_after = time_scan(gang, data, journal, now_ns, cfg, out, run_step)
    stragglers, slow = observe(
        state.stragglers,
        data,
        journal,
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
        table,
        len(dead),
        False,
        time_scan_after,
        step_scan_at,
        stragglers,
        state.heartbeats + 1,
        out.raised() if verdicts and out is not None else state.raised,
        out.counts() if verdicts and out is not None else state.anomaly_counts,
        state.exit_rank,
        source.index,
        state.launch_id,
    )
    return new, verdicts


def _on_tick(
    state: LivenessState, event: Tick, source: Provenance, cfg: DetectorConfig
) -> tuple[LivenessState, list[AnomalyDetected]]:
    if not state.live:
        # An ended run has nothing to age: the Tick leaves its state as it is (the same
        # object), so the table is not rewritten for it. A fleet's state is mostly ended
        # runs; rewriting each of them on every Tick made the changelog, and a successor's
        # replay, grow with uptime instead of with the fleet.
        return state, []
    now_ns = max(state.log_time_ns, event.ts_ns)
    out = Verdicts(state, event.ts_ns, source, cfg)
    hung = state.hung
    started = state.first_step >= 0
    blamed = state.exit_rank >= 0  # the culprit is named: the rest of the gang is blocked
    if not hung and not blamed:
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
    table, dead_count = state.table, state.dead_count
    time_scan_after = state.time_scan_after_ns
    if started and not blamed and now_ns - time_scan_after > cfg.dead_rank_timeout_s * 1e9:
        gang = Gang(
            state.expected_ranks,
            state.first_step,
            state.first_heartbeat_ns,
            state.last_heartbeat_ns,
        )
        table, data, journal = table.begin()
        time_scan_after = time_scan(gang, data, journal, now_ns, cfg, out, _verdict_step(state))
        dead_count = len(data.dead)
    return msgspec.structs.replace(
        state,
        last_offset=source.offset,
        last_index=source.index,
        log_time_ns=now_ns,
        hung=hung,
        table=table,
        dead_count=dead_count,
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
    if not state.live or state.exit_rank >= 0:
        return state, []
    if state.first_step < 0 and state.expected_ranks == 0:
        return state, []
    run_step = max(state.run_step, step)
    first_step = state.first_step if state.first_step >= 0 else step
    current = msgspec.structs.replace(state, run_step=run_step, first_step=first_step)
    out = Verdicts(current, state.log_time_ns, source, cfg)
    table, data, journal = state.table.begin()
    gang = Gang(state.expected_ranks, first_step, state.first_heartbeat_ns, state.last_heartbeat_ns)
    step_scan_at = step_scan(gang, data, journal, run_step, cfg, out)
    return msgspec.structs.replace(
        current,
        table=table,
        dead_count=len(data.dead),
        step_scan_at=step_scan_at,
        raised=out.raised(),
        anomaly_counts=out.counts() if out.out else state.anomaly_counts,
    ), out.out


SIGNAL_NAMES: Final[dict[int, str]] = {
    1: "SIGHUP",
    2: "SIGINT",
    3: "SIGQUIT",
    4: "SIGILL",
    6: "SIGABRT",
    7: "SIGBUS",
    8: "SIGFPE",
    9: "SIGKILL",
    11: "SIGSEGV",
    13: "SIGPIPE",
    15: "SIGTERM",
}
"""Linux signal names for verdict details (a fixed table: replay on any OS says the same)."""


def exit_status(event: RankExited) -> str:
    """How the rank ended, in words: ``exit code 1``, ``signal 9 (SIGKILL)``, ``unknown``."""
    if event.signal is not None:
        name = SIGNAL_NAMES.get(event.signal)
        return f"signal {event.signal}" + (f" ({name})" if name else "")
    if event.exit_code is not None:
        return f"exit code {event.exit_code}"
    return "unknown exit status"


def _on_rank_exited(
    state: LivenessState, event: RankExited, source: Provenance, cfg: DetectorConfig
) -> tuple[LivenessState, list[AnomalyDetected]]:
    now_ns = max(state.log_time_ns, event.ts_ns)
    if not state.live or event.incarnation != state.incarnation or state.exit_rank >= 0:
        return msgspec.structs.replace(
            state, last_offset=source.offset, last_index=source.index, log_time_ns=now_ns
        ), []
    clean = event.exit_code == 0 and event.signal is None
    table, data, journal = state.table.begin()
    rank = event.rank
    steps = data.steps
    if rank >= len(steps):
        for _ in range(rank + 1 - len(steps)):
            journal.push(steps, NEVER)
            journal.push(data.ts, 0)
    already = rank in data.dead
    journal.put(data.dead, rank, None)
    out = Verdicts(state, event.ts_ns, source, cfg)
    exit_rank = state.exit_rank
    if not clean:
        exit_rank = rank
        if not already:
            last = steps[rank]
            where = f"after step {last}" if last != NEVER else "before its first report"
            host = f" on {event.host}" if event.host else ""
            pid = f", pid {event.pid}" if event.pid else ""
            code = event.exit_code if event.signal is None else 128 + event.signal
            cause = f"; root cause: {event.root_cause}" if event.root_cause else ""
            out.emit(
                "dead_rank",
                _verdict_step(state),
                rank,
                float(code) if code is not None else -1.0,
                0.0,
                f"rank {rank}{host} exited ({exit_status(event)}{pid}) {where}; "
                f"its peers are blocked on it{cause}",
            )
    return msgspec.structs.replace(
        state,
        last_offset=source.offset,
        last_index=source.index,
        log_time_ns=now_ns,
        table=table,
        dead_count=len(data.dead),
        exit_rank=exit_rank,
        raised=out.raised(),
        anomaly_counts=out.counts() if out.out else state.anomaly_counts,
    ), out.out


def _config(state: LivenessState, cfg: DetectorConfig) -> DetectorConfig:
    return effective_config(cfg, state.thresholds)


LivenessEvent = RunStarted | Heartbeat | Tick | RunEnded | RankExited
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
        event: RunStarted, Heartbeat, Tick, RunEnded or RankExited.
        source: The event's log position; positions ``(offset, index)`` at or below the
            last applied one are skipped (no double apply after a crash, a pack's events
            included).
        cfg: The processor's configuration (the run's own thresholds apply on top).

    Returns:
        The new state and the verdicts the event triggered.

    Raises:
        ValueError: A Tick with no state.
        BoundError: A step or incarnation past a bound of `processors.core.bounds`
            (the shared fold makes the record a dead letter).
    """
    if state is None:
        if isinstance(event, Tick):
            raise ValueError("a Tick applies to known runs: pass each run's state")
        state = LivenessState(run_id=event.run_id, started_ns=event.ts_ns)
    elif source.offset <= state.last_offset and (
        source.offset < state.last_offset or source.index <= state.last_index
    ):  # at or before the last applied (offset, index): a pack's events are (o, 0), (o, 1)...
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
    if isinstance(event, RankExited):
        return _on_rank_exited(state, event, source, _config(state, cfg))
    if isinstance(event, RunStarted):
        check_incarnation(event.incarnation, state.incarnation, "RunStarted incarnation")
        fresh = _incarnation_state(state, event)
        return msgspec.structs.replace(
            fresh, last_offset=source.offset, last_index=source.index
        ), []
    if isinstance(event, RunEnded):
        return msgspec.structs.replace(
            state,
            last_offset=source.offset,
            last_index=source.index,
            live=False,
            status=event.status,
            hung=False,
            log_time_ns=max(state.log_time_ns, event.ts_ns),
        ), []
    return msgspec.structs.replace(state, last_offset=source.offset, last_index=source.index), []


__all__ = [
    "SIGNAL_NAMES",
    "LivenessEvent",
    "LivenessState",
    "advance_step",
    "exit_status",
    "fold_liveness",
]
