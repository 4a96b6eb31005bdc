"""Many heartbeats of a run folded at once, not per event: a pack's, or a batch's loose ones.

Trainer nodes send their ranks' heartbeats as one `schemas.events.EventPack` per node and
interval, so most events a worker folds are heartbeats inside packs. `fold_liveness`
applies each inner event as a record of its own: a `Provenance`, a rank-table version, a
`HeartbeatFacts` and a 27-field `LivenessState` per heartbeat. `fold_heartbeat_pack`
gives the same states, verdicts (ids included) and failures, per record:

1. The state must be live (a suspended run's heartbeats go event by event).
2. Events at or before the state's position ``(last_offset, last_index)`` are skipped,
   one by one, as `fold_liveness` skips them.
3. The fold stops, for the caller to go on event by event, at the first event that is
   not a `Heartbeat`, or at which the state is past its retention
   (`processors.core.retention.live_retention_ns`: the caller evicts it first).
4. One `RankTable.begin` for the whole pack: every write of every event goes through one
   journal, and the state keeps its scalars in locals between events; a `LivenessState`
   is built at the end, and before an event that is not plain (rule 6).
5. A *plain* heartbeat is written inline, as `liveness.fold_heartbeat` would write it and
   in its order: the registered heartbeat folds are `PLAIN_FOLDS`; its rank is in the
   table, not flagged dead and has reported in this incarnation; its step is within
   `processors.core.bounds`; no dead-rank scan is due (``fold_scans``' guards: only its
   rule 1 applies); and the straggler detector ignores its step time, adds it to the
   newest open bucket without filling it (``fold_straggler``'s inline case), or opens or
   closes buckets with `processors.core.straggler_buckets.observe` flagging no straggler (its
   writes are taken back when it flags one: rule 6 then does the event).
6. Any other heartbeat goes through `liveness.fold_heartbeat` itself, over the state as it
   stands before it (built then) and the pack's journal, with its own provenance
   ``(offset, index)``. If that raises (a `processors.core.bounds.BoundError`, or
   anything else), its writes are taken back (`Journal.rollback`), the state stays as it
   was before the event, and the failure is returned with its index (the caller makes it
   the event's dead letter); the rest of the pack goes on.

Loose heartbeats, each a record of its own, fold the same way (`fold_heartbeat_run`): the
`processors.core.replay.Replayer` queues a batch's loose heartbeats per run and folds each
run's at once, every event at its own position (rule 2 is then the caller's: each position
is past the state's and they increase). Most records of a deployment without packs are
such heartbeats, and a run's ranks write them side by side with other runs'.

So the only detector logic repeated here is the quiet case of each of `PLAIN_FOLDS`; a
registry with other heartbeat folds sends every heartbeat through rule 6 (still exact,
only slower), and a test fails until this module is taught the new fold's quiet case.
A state is built only at the pack's end and before a rule-6 event (a verdict, a scan, a
bound, a new or returning rank, a wider table).
"""

from __future__ import annotations

from typing import Final, NamedTuple

from runwatch.processors.core import liveness
from runwatch.processors.core.bounds import MAX_STEP, MAX_STEP_JUMP
from runwatch.processors.core.config import DetectorConfig, effective_config
from runwatch.processors.core.detectors.rank_scans import fold_scans
from runwatch.processors.core.detectors.straggler import fold_straggler
from runwatch.processors.core.liveness import fold_heartbeat
from runwatch.processors.core.liveness_state import LivenessState
from runwatch.processors.core.rank_table import ABSENT, NEVER, Journal, RankTable, TableData
from runwatch.processors.core.retention import live_retention_ns
from runwatch.processors.core.straggler_buckets import observe
from runwatch.processors.core.stragglers import StragglerState
from runwatch.schemas.events import (
    AnomalyDetected,
    EventPack,
    Heartbeat,
    PackableEvent,
    Provenance,
)

PLAIN_FOLDS: Final = (fold_scans, fold_straggler)
"""The registered heartbeat folds whose quiet case rule 5 writes inline."""


class PackFold(NamedTuple):
    """What folding a pack's heartbeats gave.

    Attributes:
        state: The run's state after the events before ``stop`` (the input state itself
            when none of them changed it).
        verdicts: Their verdicts, in order (each names its event: ``source.index``).
        failures: ``(index, exception)`` of each event whose fold raised (its dead letter).
        stop: Index of the first event left to the caller (rule 3); ``len(events)``: none.
    """

    state: LivenessState
    verdicts: list[AnomalyDetected]
    failures: list[tuple[int, Exception]]
    stop: int


def fold_heartbeat_pack(
    state: LivenessState, pack: EventPack, source: Provenance, cfg: DetectorConfig
) -> PackFold:
    """Fold a pack's heartbeats into a run's state at once (the module's rules).

    Args:
        state: The run's liveness state (the caller handles a run with none).
        pack: The record, one run's.
        source: The record's log position (each event's is it plus its index).
        cfg: The processor's configuration (the run's own thresholds apply on top).

    Returns:
        The state, the verdicts and failures of the events folded, and where it stopped.
    """
    events = pack.events
    if not state.live:  # rule 1
        return PackFold(state, [], [], 0)
    first = 0  # rule 2: positions are increasing inside a pack
    if source.offset <= state.last_offset:
        first = len(events) if source.offset < state.last_offset else state.last_index + 1
        first = min(first, len(events))
    retention_ns = live_retention_ns(announced=state.expected_ranks > 0)
    alive_ns = max(state.last_heartbeat_ns, state.started_ns)
    for index in range(first):  # skipped, but an expiry still stops them (rule 3)
        event = events[index]
        if type(event) is not Heartbeat or event.ts_ns - alive_ns > retention_ns:
            return PackFold(state, [], [], index)
    if first == len(events):
        return PackFold(state, [], [], first)
    return _fold_from(state, events, source, None, cfg, first)


def fold_heartbeat_run(
    state: LivenessState,
    events: tuple[Heartbeat, ...],
    sources: tuple[Provenance, ...],
    cfg: DetectorConfig,
) -> PackFold:
    """Fold loose heartbeats of one run, each a record of its own, at once (rules 1, 3-6).

    A batch's loose heartbeats of a run are folded as a pack's are, each at its own
    position (``sources``): what `liveness.fold_heartbeat` gives them one by one. Rule 2
    is the caller's: every position is past the state's, and they increase.

    Args:
        state: The run's liveness state (the caller handles a run with none).
        events: The heartbeats, in log order.
        sources: Their positions, one per event, increasing.
        cfg: The processor's configuration (the run's own thresholds apply on top).

    Returns:
        As `fold_heartbeat_pack`, with indexes into ``events``.
    """
    if not state.live:  # rule 1
        return PackFold(state, [], [], 0)
    return _fold_from(state, events, sources[0], sources, cfg, 0)


def _fold_from(
    state: LivenessState,
    events: tuple[PackableEvent, ...],
    source: Provenance,
    sources: tuple[Provenance, ...] | None,
    cfg: DetectorConfig,
    first: int,
) -> PackFold:
    """Rules 3-6 from event ``first`` on (the events before it were skipped).

    ``sources`` None: the events are a pack's, each at ``source`` plus its index;
    otherwise each event's own position.
    """
    ecfg = effective_config(cfg, state.thresholds) if state.thresholds else cfg
    threshold, timeout_ns = ecfg.rank_heartbeat_threshold, ecfg.dead_rank_timeout_s * 1e9
    ratio, slow_steps = ecfg.straggler_ratio, ecfg.straggler_steps
    inline = liveness.HEARTBEAT_FOLDS == PLAIN_FOLDS
    retention_ns = live_retention_ns(announced=state.expected_ranks > 0)
    started_ns, quiet_scans = state.started_ns, state.exit_rank >= 0
    begun = state.table.begin()
    data, journal = begun[1], begun[2]
    steps, stamps, dead, buckets = data.steps, data.ts, data.dead, data.buckets
    base, applied = state, -1  # the last state built, the last event applied since (-1: none)
    now_ns, known, first_step, first_ns, run_step, last_ns = _scalars(state)
    scan_at, scan_after, stragglers, beats = _detectors(state)
    width, cap, live = _limits(state, steps, dead) if inline else (0, -1, 0)
    out = _Out([], [])
    stop = len(events)
    for index in range(first, stop):
        event = events[index]
        if type(event) is not Heartbeat:  # rule 3
            stop = index
            break
        ts, rank, step = event.ts_ns, event.rank, event.step
        if ts - (last_ns if last_ns > started_ns else started_ns) > retention_ns:
            stop = index
            break
        now = ts if ts > now_ns else now_ns
        # Rule 5: a reporting rank of the table, no bound, scan or verdict in reach (width
        # and cap are 0 and -1 when the folds are not PLAIN_FOLDS: nothing is plain).
        if 0 <= rank < width and step <= cap and not (dead and rank in dead):
            previous, at = steps[rank], scan_at
            if step < previous:  # fold_scans rule 1
                at = min(at, step + threshold + 1)
            if previous != NEVER and (
                quiet_scans
                or not ((step > run_step and step >= at) or now - scan_after > timeout_ns)
            ):
                mark, step_time_s, plain = len(journal), event.step_time_s, True
                journal.append((steps, rank, previous))  # fold_heartbeat's writes, in order
                steps[rank] = step
                journal.append((stamps, rank, stamps[rank]))
                stamps[rank] = ts
                if not step_time_s > 0.0 or step <= stragglers.closed_upto:
                    pass  # fold_straggler ignores it
                elif step == stragglers.b_step and (
                    rank in (bucket := buckets[1]) or len(bucket) + 1 < live
                ):
                    if rank not in bucket:  # fold_straggler's inline case
                        journal.append((bucket, rank, ABSENT))
                        bucket[rank] = step_time_s
                else:  # a bucket opens or closes: fold_straggler's `observe`, if it flags none
                    turned = _quiet_turn(
                        stragglers, data, journal, mark, rank, step, step_time_s,
                        (live, ratio, slow_steps),
                    )  # fmt: skip
                    plain = turned is not None
                    if turned is not None:
                        stragglers = turned
                if plain:
                    if ts > last_ns:
                        last_ns = ts
                    if step > run_step:
                        run_step, cap = step, min(MAX_STEP - 1, step + MAX_STEP_JUMP)
                    now_ns, scan_at, beats, applied = now, at, beats + 1, index
                    continue
        if applied >= 0:  # rule 6: the state before this event, then the shared fold
            scalars = (now_ns, known, first_step, first_ns, run_step, last_ns)
            detectors = (scan_at, scan_after, stragglers, beats)
            here = _position(source, sources, applied)
            base = _state(base, begun[0], here, scalars, detectors, len(dead))
            applied = -1
        base = _judge(base, event, _position(source, sources, index), index, cfg, begun, out)
        now_ns, known, first_step, first_ns, run_step, last_ns = _scalars(base)
        scan_at, scan_after, stragglers, beats = _detectors(base)
        width, cap, live = _limits(base, steps, dead) if inline else (0, -1, 0)
    if applied >= 0:
        scalars = (now_ns, known, first_step, first_ns, run_step, last_ns)
        detectors = (scan_at, scan_after, stragglers, beats)
        here = _position(source, sources, applied)
        base = _state(base, begun[0], here, scalars, detectors, len(dead))
    return PackFold(base, out.verdicts, out.failures, stop)


def _quiet_turn(
    stragglers: StragglerState,
    data: TableData,
    journal: Journal,
    mark: int,
    rank: int,
    step: int,
    step_time_s: float,
    judging: tuple[int, float, int],
) -> StragglerState | None:
    """Rule 5's bucket open or close: `observe` in the pack's journal, if it flags no one.

    Args:
        stragglers: The straggler detector's state before the heartbeat.
        data: The rank table's containers (written through ``journal`` only).
        journal: The pack's journal.
        mark: The journal's length before this heartbeat's writes.
        rank: The heartbeat's rank.
        step: Its step.
        step_time_s: Its step time.
        judging: ``(live ranks, straggler_ratio, straggler_steps)``.

    Returns:
        The detector's new state; None when it flagged a straggler or raised: every write
        of the heartbeat since ``mark`` is taken back, and rule 6 folds it (a verdict, or
        its dead letter).
    """
    live, ratio, slow_steps = judging
    try:
        judged, slow = observe(
            stragglers, data, journal, rank, step, step_time_s, live, ratio, slow_steps
        )
    except Exception:
        judged, slow = None, ()  # rule 6 folds it again and makes it its dead letter
    if judged is None or slow:
        journal.rollback(mark)
        return None
    return judged


class _Out(NamedTuple):
    verdicts: list[AnomalyDetected]
    failures: list[tuple[int, Exception]]


def _judge(
    state: LivenessState,
    event: Heartbeat,
    at: Provenance,
    index: int,
    cfg: DetectorConfig,
    begun: tuple[RankTable, TableData, Journal],
    out: _Out,
) -> LivenessState:
    """Rule 6: `fold_heartbeat` of event ``index`` at ``at`` over ``state``, in the journal.

    Returns:
        The state after the event; ``state`` when its fold raised (its writes taken back,
        the failure in ``out``).
    """
    journal = begun[2]
    mark = len(journal)
    try:
        after, verdicts = fold_heartbeat(state, event, at, cfg, begun)
    except Exception as exc:
        journal.rollback(mark)
        out.failures.append((index, exc))
        return state
    out.verdicts.extend(verdicts)
    return after


def _limits(state: LivenessState, steps: list[int], dead: dict[int, None]) -> tuple[int, int, int]:
    """The table's width, the highest step within the bounds, and the live ranks.

    The bound is `liveness.fold_heartbeat`'s check: a step of ``MAX_STEP`` or more than
    ``MAX_STEP_JUMP`` past the run's newest (its step hint before any) is refused. Live
    ranks are `fold_straggler`'s: known ones not flagged dead.
    """
    newest = state.run_step if state.run_step >= 0 else state.step_hint or -1
    return len(steps), min(MAX_STEP - 1, newest + MAX_STEP_JUMP), state.known_ranks - len(dead)


Scalars = tuple[int, int, int, int, int, int]
"""``log_time_ns, known_ranks, first_step, first_heartbeat_ns, run_step, last_heartbeat_ns``."""
DetectorScalars = tuple[int, int, StragglerState, int]
"""``step_scan_at, time_scan_after_ns, stragglers, heartbeats``."""


def _scalars(state: LivenessState) -> Scalars:
    return (
        state.log_time_ns,
        state.known_ranks,
        state.first_step,
        state.first_heartbeat_ns,
        state.run_step,
        state.last_heartbeat_ns,
    )


def _detectors(state: LivenessState) -> DetectorScalars:
    return state.step_scan_at, state.time_scan_after_ns, state.stragglers, state.heartbeats


def _position(source: Provenance, sources: tuple[Provenance, ...] | None, index: int) -> Provenance:
    """Event ``index``'s position: its own (loose records), or the pack's plus its index."""
    if sources is not None:
        return sources[index]
    return Provenance(
        topic=source.topic, partition=source.partition, offset=source.offset, index=index
    )


def _state(
    base: LivenessState,
    table: RankTable,
    at: Provenance,
    scalars: Scalars,
    detectors: DetectorScalars,
    dead_count: int,
) -> LivenessState:
    """``base`` after plain heartbeats up to position ``at``: what `fold_heartbeat` builds.

    Positional, in field order, as `liveness.fold_heartbeat` builds it (a test pins the
    order); the fields a heartbeat does not change are ``base``'s.
    """
    now_ns, known, first_step, first_ns, run_step, last_ns = scalars
    scan_at, scan_after, stragglers, beats = detectors
    return LivenessState(
        base.run_id, at.offset, base.incarnation, True, base.status, base.thresholds,
        now_ns, base.started_ns, base.expected_ranks, known, first_step, first_ns, run_step,
        base.step_hint, last_ns, table, dead_count, False, scan_after, scan_at,
        stragglers, beats, base.raised, base.anomaly_counts,
        base.exit_rank, at.index, base.launch_id,
    )  # fmt: skip


__all__ = ["PLAIN_FOLDS", "PackFold", "fold_heartbeat_pack", "fold_heartbeat_run"]
