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
verdict. A clean exit (code 0, or any status once the rank had finished its training:
``RankExited.finished``) raises nothing; the rank is flagged not live, so it is not
reported silent while its peers finish. RankExited of another incarnation (an older gang,
or one whose RunStarted is not in yet) and while the run is suspended are ignored. The
next RunStarted clears the culprit.

A RunEnded suspends every check until the next RunStarted, which starts a new incarnation
with a fresh rank table.

Detectors: each part is a `processors.core.detectors.base.LivenessDetector` in
`processors.core.detectors` (incarnation, exit_evidence, rank_scans, stragglers), listed
in `processors.core.detectors.registry.LIVENESS_DETECTORS`. A heartbeat is first recorded
by this module's own last-seen bookkeeping (the rank's last step and time, the run's newest
step), then runs every registered heartbeat fold in the registry's order over one
`processors.core.liveness_facts.HeartbeatFacts`; every other event type is folded by the
one detector that registered it.

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

from runwatch.processors.core.bounds import MAX_STEP, MAX_STEP_JUMP, check_step
from runwatch.processors.core.config import DetectorConfig, effective_config
from runwatch.processors.core.detectors.base import LivenessHandler
from runwatch.processors.core.detectors.exit_evidence import SIGNAL_NAMES, exit_status
from runwatch.processors.core.detectors.registry import LIVENESS_DETECTORS
from runwatch.processors.core.liveness_facts import HeartbeatFacts
from runwatch.processors.core.liveness_scans import Gang, Verdicts, step_scan
from runwatch.processors.core.liveness_state import LivenessState
from runwatch.processors.core.rank_table import NEVER, Journal, RankTable, TableData
from runwatch.schemas.events import (
    AnomalyDetected,
    Heartbeat,
    Provenance,
    RankExited,
    RunEnded,
    RunStarted,
    Tick,
)

HEARTBEAT_FOLDS: Final = tuple(d.heartbeat for d in LIVENESS_DETECTORS if d.heartbeat)
"""Each registered detector's heartbeat fold, in judging order."""


def _handlers() -> dict[type, LivenessHandler]:
    """Event type -> the one registered detector that folds it (other than Heartbeat)."""
    handlers: dict[type, LivenessHandler] = {}
    for detector in LIVENESS_DETECTORS:
        for kind, handler in detector.events:
            if kind in handlers or kind is Heartbeat:
                raise ValueError(f"{detector.name}: {kind.__name__} has another detector")
            handlers[kind] = handler
    return handlers


_HANDLERS: Final = _handlers()


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

    A heartbeat is recorded by the reducer itself (last-seen), then judged by the detectors:
    Rule 1: a suspended run (the incarnation detector's ``live``) only advances log time.
    Rule 2: a step past a bound (`processors.core.bounds`) is refused before any write.
    Rule 3: a rank past the table's width widens it (ranks in between have not reported).
    Rule 4: the rank's last step and time are the heartbeat's; a rank not expected by the
    RunStarted that reports for the first time is known.
    Rule 5: the incarnation's first heartbeat sets its first step and time.
    Rule 6: a rank flagged dead that reports again is live (its outage ended).
    Rule 7: the run's newest step and heartbeat time only grow.
    Rule 8: every registered heartbeat fold runs, in the registry's order, over one
    `HeartbeatFacts`; the new state is built once from it.
    """
    if state is None:
        if isinstance(event, Tick):
            raise ValueError("a Tick applies to known runs: pass each run's state")
        state = LivenessState(run_id=event.run_id, started_ns=event.ts_ns)
    elif source.offset <= state.last_offset and (
        source.offset < state.last_offset or source.index <= state.last_index
    ):  # at or before the last applied (offset, index): a pack's events are (o, 0), (o, 1)...
        return state, []
    if type(event) is Heartbeat:  # the hot path
        if not state.live:
            ts_ns = event.ts_ns
            now_ns = ts_ns if ts_ns > state.log_time_ns else state.log_time_ns
            return msgspec.structs.replace(
                state, last_offset=source.offset, last_index=source.index, log_time_ns=now_ns
            ), []
        return fold_heartbeat(state, event, source, cfg, None)
    handler = _HANDLERS.get(type(event))
    if handler is None:
        return msgspec.structs.replace(
            state, last_offset=source.offset, last_index=source.index
        ), []
    return handler(state, event, source, _config(state, cfg))


def fold_heartbeat(
    state: LivenessState,
    event: Heartbeat,
    source: Provenance,
    cfg: DetectorConfig,
    begun: tuple[RankTable, TableData, Journal] | None,
) -> tuple[LivenessState, list[AnomalyDetected]]:
    """Apply one heartbeat of a live run whose position is past the state's (rules 2-8).

    `fold_liveness`'s heartbeat path, inline: no call but the detectors' folds.

    Args:
        state: The run's state (live; ``(source.offset, source.index)`` not applied yet).
        event: The heartbeat.
        source: Its log position.
        cfg: The processor's configuration (the run's own thresholds apply on top).
        begun: None: the fold begins its own version of ``state.table``. Otherwise the
            output version, containers and journal of a fold already under way over the
            same containers (`processors.core.liveness_pack`: many heartbeats, one
            version); the new state then holds that output version.

    Returns:
        The new state and the verdicts.

    Raises:
        BoundError: The step is past a bound (before any write).
    """
    ts_ns = event.ts_ns
    now_ns = ts_ns if ts_ns > state.log_time_ns else state.log_time_ns
    rank, step = event.rank, event.step
    newest = state.run_step if state.run_step >= 0 else state.step_hint or -1
    if step >= MAX_STEP or step - newest > MAX_STEP_JUMP:
        check_step(step, newest if newest >= 0 else -1, "heartbeat step")
    table, data, journal = state.table.begin() if begun is None else begun
    steps, stamps = data.steps, data.ts
    if rank >= len(steps):
        for _ in range(rank + 1 - len(steps)):
            journal.push(steps, NEVER)
            journal.push(stamps, 0)
    previous = steps[rank]
    journal.append((steps, rank, previous))  # inline journal writes (Journal.set)
    steps[rank] = step
    journal.append((stamps, rank, stamps[rank]))
    stamps[rank] = ts_ns
    known = state.known_ranks
    if previous == NEVER and rank >= state.expected_ranks:
        known += 1
    first_step, first_ns = state.first_step, state.first_heartbeat_ns
    if first_step < 0:
        first_step, first_ns = step, ts_ns
    dead = data.dead
    if dead and rank in dead:
        journal.discard(dead, rank)
    last_ns = ts_ns if ts_ns > state.last_heartbeat_ns else state.last_heartbeat_ns
    run_step = step if step > state.run_step else state.run_step
    if state.thresholds:
        cfg = effective_config(cfg, state.thresholds)
    f = HeartbeatFacts(
        state, event, source, cfg, now_ns, rank, step, previous, data, journal, known,
        first_step, first_ns, run_step, last_ns, state.step_scan_at,
        state.time_scan_after_ns, state.stragglers,
    )  # fmt: skip
    for fold in HEARTBEAT_FOLDS:
        fold(f)
    out = f.out
    verdicts = out.out if out is not None else []
    # Positional, in field order (a test pins the order): much cheaper than replace().
    return LivenessState(
        state.run_id, source.offset, state.incarnation, True, state.status, state.thresholds,
        now_ns, state.started_ns, state.expected_ranks, known, first_step, first_ns, run_step,
        state.step_hint, last_ns, table, len(dead), False, f.time_scan_after, f.step_scan_at,
        f.stragglers, state.heartbeats + 1,
        out.raised() if verdicts and out is not None else state.raised,
        out.counts() if verdicts and out is not None else state.anomaly_counts,
        state.exit_rank, source.index, state.launch_id,
    ), verdicts  # fmt: skip


__all__ = [
    "HEARTBEAT_FOLDS",
    "SIGNAL_NAMES",
    "LivenessEvent",
    "LivenessState",
    "advance_step",
    "exit_status",
    "fold_heartbeat",
    "fold_liveness",
]
