"""A packed record of heartbeats folded per record, not per event (issue 23).

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
5. A *plain* heartbeat (the registered heartbeat folds are `PLAIN_FOLDS`, its step within
   `processors.core.bounds`, its rank not negative, no scan due (the rank scans'
   ``fold_scans`` guards) and its step time ignored or added to the newest open
   straggler bucket without filling it (``fold_straggler``'s inline case)) is written
   inline: what `liveness.fold_heartbeat` would write, in its order.
6. Any other heartbeat goes through `liveness.fold_heartbeat` itself, over the state as it
   stands before it (built then) and the pack's journal, with its own provenance
   ``(offset, index)``. If that raises (a `processors.core.bounds.BoundError`, or
   anything else), its writes are taken back (`Journal.rollback`), the state stays as it
   was before the event, and the failure is returned with its index (the caller makes it
   the event's dead letter); the rest of the pack goes on.

So the only detector logic repeated here is the quiet case of each of `PLAIN_FOLDS`; a
registry with other heartbeat folds sends every heartbeat through rule 6 (still exact,
only slower), and a test fails until this module is taught the new fold's quiet case.
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
from runwatch.processors.core.rank_table import ABSENT, NEVER, RankTable
from runwatch.processors.core.retention import live_retention_ns
from runwatch.processors.core.stragglers import StragglerState
from runwatch.schemas.events import AnomalyDetected, EventPack, Heartbeat, Provenance

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
    return _fold_from(state, pack, source, cfg, first)


def _fold_from(
    state: LivenessState, pack: EventPack, source: Provenance, cfg: DetectorConfig, first: int
) -> PackFold:
    """Rules 3-6 from event ``first`` on (the events before it were skipped)."""
    events, offset = pack.events, source.offset
    ecfg = effective_config(cfg, state.thresholds) if state.thresholds else cfg
    threshold, timeout_s = ecfg.rank_heartbeat_threshold, ecfg.dead_rank_timeout_s * 1e9
    inline = liveness._HEARTBEAT_FOLDS == PLAIN_FOLDS
    retention_ns = live_retention_ns(announced=state.expected_ranks > 0)
    expected, started_ns, exit_rank = state.expected_ranks, state.started_ns, state.exit_rank
    hint = state.step_hint or -1
    begun = state.table.begin()
    table, data, journal = begun
    steps, stamps, dead, buckets = data.steps, data.ts, data.dead, data.buckets
    base, applied = state, -1  # the last state built, the last event applied since (-1: none)
    now_ns, known, first_step, first_ns, run_step, last_ns = _scalars(state)
    scan_at, scan_after, stragglers, beats = _detectors(state)
    verdicts: list[AnomalyDetected] = []
    failures: list[tuple[int, Exception]] = []
    stop = len(events)
    for index in range(first, stop):
        event = events[index]
        if type(event) is not Heartbeat:  # rule 3
            stop = index
            break
        ts, rank, step, step_time_s = event.ts_ns, event.rank, event.step, event.step_time_s
        if ts - (last_ns if last_ns > started_ns else started_ns) > retention_ns:
            stop = index
            break
        previous = steps[rank] if 0 <= rank < len(steps) else NEVER
        new_run_step = step if step > run_step else run_step
        now = ts if ts > now_ns else now_ns
        at = scan_at
        if step < previous and previous != NEVER:  # fold_scans rule 1
            at = min(at, step + threshold + 1)
        newest = run_step if run_step >= 0 else hint
        plain = (
            inline
            and rank >= 0
            and step < MAX_STEP
            and step - newest <= MAX_STEP_JUMP
            and (
                exit_rank >= 0
                or not (
                    (new_run_step > run_step and new_run_step >= at) or now - scan_after > timeout_s
                )
            )
        )
        bucket = None  # fold_straggler's quiet cases: time ignored, rank already in, added
        if plain and step_time_s > 0.0 and step > stragglers.closed_upto:
            if step != stragglers.b_step:
                plain = False  # a bucket opens or closes: judged
            else:
                bucket = buckets[1]
                if rank in bucket:
                    bucket = None
                elif len(bucket) + 1 >= (
                    known + (previous == NEVER and rank >= expected) - len(dead) + (rank in dead)
                ):
                    plain = False  # it fills the bucket: judged
        if plain:  # rule 5: fold_heartbeat's writes, in its order
            if rank >= len(steps):
                for _ in range(rank + 1 - len(steps)):
                    journal.push(steps, NEVER)
                    journal.push(stamps, 0)
            journal.append((steps, rank, previous))
            steps[rank] = step
            journal.append((stamps, rank, stamps[rank]))
            stamps[rank] = ts
            if previous == NEVER and rank >= expected:
                known += 1
            if first_step < 0:
                first_step, first_ns = step, ts
            if dead and rank in dead:
                journal.discard(dead, rank)
            if bucket is not None:
                journal.append((bucket, rank, ABSENT))
                bucket[rank] = step_time_s
            last_ns = ts if ts > last_ns else last_ns
            run_step, now_ns, scan_at, beats, applied = new_run_step, now, at, beats + 1, index
            continue
        if applied >= 0:  # rule 6: the state before this event, then the shared fold
            base = _state(
                base,
                table,
                offset,
                applied,
                (now_ns, known, first_step, first_ns, run_step, last_ns),
                (scan_at, scan_after, stragglers, beats),
                len(dead),
            )
            applied = -1
        mark = len(journal)
        at_event = Provenance(
            topic=source.topic, partition=source.partition, offset=offset, index=index
        )
        try:
            base, out = fold_heartbeat(base, event, at_event, cfg, begun)
        except Exception as exc:
            journal.rollback(mark)
            failures.append((index, exc))
            continue
        verdicts.extend(out)
        now_ns, known, first_step, first_ns, run_step, last_ns = _scalars(base)
        scan_at, scan_after, stragglers, beats = _detectors(base)
    if applied >= 0:
        base = _state(
            base,
            table,
            offset,
            applied,
            (now_ns, known, first_step, first_ns, run_step, last_ns),
            (scan_at, scan_after, stragglers, beats),
            len(dead),
        )
    return PackFold(base, verdicts, failures, stop)


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


def _state(
    base: LivenessState,
    table: RankTable,
    offset: int,
    index: int,
    scalars: Scalars,
    detectors: DetectorScalars,
    dead_count: int,
) -> LivenessState:
    """``base`` after plain heartbeats up to ``(offset, index)``: what `fold_heartbeat` builds.

    Positional, in field order, as `liveness.fold_heartbeat` builds it (a test pins the
    order); the fields a heartbeat does not change are ``base``'s.
    """
    now_ns, known, first_step, first_ns, run_step, last_ns = scalars
    scan_at, scan_after, stragglers, beats = detectors
    return LivenessState(
        base.run_id, offset, base.incarnation, True, base.status, base.thresholds,
        now_ns, base.started_ns, base.expected_ranks, known, first_step, first_ns, run_step,
        base.step_hint, last_ns, table, dead_count, False, scan_after, scan_at,
        stragglers, beats, base.raised, base.anomaly_counts,
        base.exit_rank, index, base.launch_id,
    )  # fmt: skip


__all__ = ["PLAIN_FOLDS", "PackFold", "fold_heartbeat_pack"]
