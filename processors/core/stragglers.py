"""Stragglers: a rank whose step time stays above k times its peers' median.

Heartbeats of one step arrive from every rank, in any order and interleaved with the next
step's. They are gathered per step in at most two open buckets; a bucket closes when every
live rank has reported that step, or when a heartbeat two steps later shows the gang has
moved on (a late heartbeat of a closed step is then ignored for this check). When a bucket
closes each rank's time is divided by the median of the *other* ranks' times; a rank is a
straggler once that ratio stays above ``straggler_ratio`` for ``straggler_steps``
consecutive closed steps, and is flagged once per episode (until a closed step shows it
back under the ratio).

Note: the check needs a per-rank time that differs when a rank is slow, e.g. its compute
time before the gradient all-reduce; a wall time that includes the collective is the same
on every rank of a synchronous gang.

Cost: the buckets and streaks live in the run's `processors.core.rank_table.RankTable`
(dicts keyed by rank, written through the fold's journal), so adding a heartbeat is O(1)
and closing a bucket costs O(ranks in it): amortised O(1) per heartbeat at any world size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

from runwatch.processors.core.baseline import median_of_sorted
from runwatch.processors.core.rank_table import ABSENT, Journal, TableData


class StragglerState(msgspec.Struct, frozen=True, gc=False):
    """Which steps the two open buckets hold (their contents are in the rank table).

    Attributes:
        a_step: Step of the older open bucket (-1: none); ranks and times in
            ``TableData.buckets[0]``.
        b_step: Step of the newer open bucket (-1: none); ``TableData.buckets[1]``.
        closed_upto: Buckets at or below this step are closed.
    """

    a_step: int = -1
    b_step: int = -1
    closed_upto: int = -1


class SlowRank(msgspec.Struct, frozen=True, gc=False):
    """A rank that just became a straggler.

    Attributes:
        rank: The rank.
        step: The closed step that completed the streak.
        ratio: Its time over the peers' median at that step.
        peer_median_s: The peers' median step time.
        streak: Consecutive slow steps.
    """

    rank: int
    step: int
    ratio: float
    peer_median_s: float
    streak: int


_NONE: Final[tuple[SlowRank, ...]] = ()
"""No new straggler (shared: the common answer allocates nothing)."""


def median_without(ordered: list[float], index: int) -> float:
    """Median of a sorted list without the element at ``index`` (needs 2+ elements)."""
    n = len(ordered) - 1

    def at(k: int) -> float:
        return ordered[k] if k < index else ordered[k + 1]

    half = n // 2
    if n % 2:
        return at(half)
    return (at(half - 1) + at(half)) / 2


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


__all__ = ["SlowRank", "StragglerState", "median_without", "observe"]
