"""The straggler detector's bucket arithmetic: add a rank's step time, open, close, judge.

`processors.core.stragglers` says what a straggler is and holds the detector's values (its
`StragglerState` and the `SlowRank` it reports); this module is the arithmetic over the
rank table's buckets, streaks and flags, written through the fold's journal. It defines no
class, so that mypyc compiles it in the group of `processors.core.native` (beside the pack
fold, which calls `observe` whenever a bucket opens or closes: once or twice a step per
run); the same source runs uncompiled when the group does, and both give the same floats
bit for bit (``tests/unit/core/test_native.py``): the only arithmetic is a median of two
middle values and one division per rank, the same C double operations either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from runwatch.processors.core.rank_table import ABSENT, Journal, TableData
from runwatch.processors.core.stragglers import SlowRank, StragglerState
from runwatch.processors.core.window import median_of_sorted

_NONE: Final[tuple[SlowRank, ...]] = ()
"""No new straggler (shared: the common answer allocates nothing)."""


def median_without(ordered: list[float], index: int) -> float:
    """Median of a sorted list without the element at ``index`` (needs 2+ elements)."""
    n = len(ordered) - 1
    half = n // 2
    upper = ordered[half] if half < index else ordered[half + 1]
    if n % 2:
        return upper
    below = half - 1
    lower = ordered[below] if below < index else ordered[below + 1]
    return (lower + upper) / 2


def _judge(
    data: TableData,
    journal: Journal,
    bucket: dict[int, float],
    step: int,
    ratio_thresh: float,
    steps_thresh: int,
    found: list[SlowRank],
) -> None:
    """Judge one closed bucket: update streaks and flags, collect new stragglers."""
    if len(bucket) < 2:
        return
    if not data.flagged and not data.streaks:
        # Healthy fast path: if even the slowest rank is under the ratio, nothing changes
        # (its peers are every other time: the sorted times without the last).
        ordered = sorted(bucket.values())
        if ordered[-1] <= ratio_thresh * median_of_sorted(ordered[:-1]):
            return
    ranks = list(bucket)
    times = list(bucket.values())
    order = sorted(range(len(times)), key=times.__getitem__)
    ordered = [times[i] for i in order]
    position = {i: p for p, i in enumerate(order)}
    streaks, flagged = data.streaks, data.flagged
    new: list[SlowRank] = []
    for i, rank in enumerate(ranks):
        peer = median_without(ordered, position[i])
        ratio = times[i] / peer if peer > 0 else 1.0
        if ratio > ratio_thresh:
            streak = streaks.get(rank, 0) + 1
            journal.put(streaks, rank, streak)
            if streak >= steps_thresh and rank not in flagged:
                journal.put(flagged, rank, None)
                new.append(SlowRank(rank, step, ratio, peer, streak))
        else:
            journal.discard(streaks, rank)
            journal.discard(flagged, rank)
    new.sort(key=lambda s: s.rank)
    found.extend(new)


def observe(
    state: StragglerState,
    data: TableData,
    journal: Journal,
    rank: int,
    step: int,
    step_time_s: float,
    live_ranks: int,
    ratio_thresh: float,
    steps_thresh: int,
) -> tuple[StragglerState, Sequence[SlowRank]]:
    """Add one rank's step time; close buckets that are complete or left behind.

    Args:
        state: Which steps the open buckets hold.
        data: The run's rank table (buckets, streaks, flags), written through ``journal``.
        journal: The fold's journal.
        rank: The reporting rank.
        step: Its step.
        step_time_s: Its step time (non-positive: not measured, ignored).
        live_ranks: Ranks expected to report (known and not dead).
        ratio_thresh: ``straggler_ratio``.
        steps_thresh: ``straggler_steps``.

    Returns:
        The new bucket steps (the same object when no bucket opened or closed) and the
        ranks that just became stragglers.
    """
    if not step_time_s > 0.0 or step <= state.closed_upto:
        return state, _NONE
    buckets = data.buckets
    a_step, b_step, closed_upto = state.a_step, state.b_step, state.closed_upto
    if step == b_step:
        bucket = buckets[1]
        if rank in bucket:
            return state, _NONE
        journal.append((bucket, rank, ABSENT))  # inline put: the per-heartbeat path
        bucket[rank] = step_time_s
        if len(bucket) < live_ranks:
            return state, _NONE
    elif step == a_step:
        bucket = buckets[0]
        if rank in bucket:
            return state, _NONE
        journal.put(bucket, rank, step_time_s)
    elif step > b_step:
        found: list[SlowRank] = []
        if a_step >= 0:
            _judge(data, journal, buckets[0], a_step, ratio_thresh, steps_thresh, found)
            closed_upto = max(closed_upto, a_step)
        if step == b_step + 1:
            journal.set(buckets, 0, buckets[1])
            a_step = b_step
        else:
            if b_step >= 0:
                _judge(data, journal, buckets[1], b_step, ratio_thresh, steps_thresh, found)
                closed_upto = max(closed_upto, b_step)
            journal.set(buckets, 0, {})
            a_step = -1
        journal.set(buckets, 1, {rank: step_time_s})
        b_step = step
        return _close_full(
            data,
            journal,
            a_step,
            b_step,
            closed_upto,
            live_ranks,
            ratio_thresh,
            steps_thresh,
            found,
        )
    elif step == b_step - 1 and a_step < 0:
        journal.set(buckets, 0, {rank: step_time_s})
        a_step = step
    else:
        return state, _NONE
    return _close_full(
        data, journal, a_step, b_step, closed_upto, live_ranks, ratio_thresh, steps_thresh, []
    )


def _close_full(
    data: TableData,
    journal: Journal,
    a_step: int,
    b_step: int,
    closed_upto: int,
    live_ranks: int,
    ratio_thresh: float,
    steps_thresh: int,
    found: list[SlowRank],
) -> tuple[StragglerState, list[SlowRank]]:
    """Close the open buckets every live rank has reported (the newer closes the older)."""
    buckets = data.buckets
    if a_step >= 0 and len(buckets[0]) >= live_ranks:
        _judge(data, journal, buckets[0], a_step, ratio_thresh, steps_thresh, found)
        closed_upto = max(closed_upto, a_step)
        journal.set(buckets, 0, {})
        a_step = -1
    if b_step >= 0 and len(buckets[1]) >= live_ranks:
        if a_step >= 0:
            _judge(data, journal, buckets[0], a_step, ratio_thresh, steps_thresh, found)
            closed_upto = max(closed_upto, a_step)
            journal.set(buckets, 0, {})
            a_step = -1
        _judge(data, journal, buckets[1], b_step, ratio_thresh, steps_thresh, found)
        closed_upto = max(closed_upto, b_step)
        journal.set(buckets, 1, {})
        b_step = -1
    return StragglerState(a_step, b_step, closed_upto), found


__all__ = ["median_without", "observe"]
