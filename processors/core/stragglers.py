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

This module holds the detector's two values (msgspec Structs, which stay uncompiled); the
bucket arithmetic that adds a time and opens, closes and judges buckets (`observe`) lives
in `processors.core.straggler_buckets`, which the install compiles with mypyc beside the
pack fold that calls it (see `processors.core.native`).
"""

from __future__ import annotations

import msgspec


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


__all__ = ["SlowRank", "StragglerState"]
