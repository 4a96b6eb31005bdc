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
"""

from __future__ import annotations

import msgspec

from runwatch.processors.core.baseline import median_of_sorted


class StragglerState(msgspec.Struct, frozen=True, gc=False):
    """Two open step buckets (the newest step and the one before) and per-rank streaks.

    Attributes:
        a_step: Step of the older open bucket (-1: none).
        a_ranks: Ranks that reported it.
        a_times: Their step times.
        b_step: Step of the newer open bucket (-1: none).
        b_ranks: Ranks that reported it.
        b_times: Their step times.
        closed_upto: Buckets at or below this step are closed.
        streaks: Consecutive slow closed steps, per rank (index = rank).
        flagged: Ranks currently flagged as stragglers.
    """

    a_step: int = -1
    a_ranks: tuple[int, ...] = ()
    a_times: tuple[float, ...] = ()
    b_step: int = -1
    b_ranks: tuple[int, ...] = ()
    b_times: tuple[float, ...] = ()
    closed_upto: int = -1
    streaks: tuple[int, ...] = ()
    flagged: tuple[int, ...] = ()


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


def median_without(ordered: list[float], index: int) -> float:
    """Median of a sorted list without the element at ``index`` (needs 2+ elements)."""
    n = len(ordered) - 1

    def at(k: int) -> float:
        return ordered[k] if k < index else ordered[k + 1]

    half = n // 2
    if n % 2:
        return at(half)
    return (at(half - 1) + at(half)) / 2


def _close(
    state: StragglerState,
    ranks: tuple[int, ...],
    times: tuple[float, ...],
    step: int,
    ratio_thresh: float,
    steps_thresh: int,
) -> tuple[StragglerState, list[SlowRank]]:
    """Judge one closed bucket: update streaks and flags, report new stragglers."""
    closed_upto = step if step > state.closed_upto else state.closed_upto
    if len(ranks) < 2:
        return msgspec.structs.replace(state, closed_upto=closed_upto), []
    if not state.flagged and not any(state.streaks):
        # Healthy fast path: if even the slowest rank is under the ratio, nothing changes.
        slowest = max(range(len(times)), key=times.__getitem__)
        peers = sorted(times[:slowest] + times[slowest + 1 :])
        if times[slowest] <= ratio_thresh * median_of_sorted(peers):
            return msgspec.structs.replace(state, closed_upto=closed_upto), []
    order = sorted(range(len(times)), key=times.__getitem__)
    ordered = [times[i] for i in order]
    position = {i: p for p, i in enumerate(order)}
    width = max(max(ranks) + 1, len(state.streaks))
    streaks = list(state.streaks) + [0] * (width - len(state.streaks))
    flagged = set(state.flagged)
    found: list[SlowRank] = []
    for i, rank in enumerate(ranks):
        peer = median_without(ordered, position[i])
        ratio = times[i] / peer if peer > 0 else 1.0
        if ratio > ratio_thresh:
            streaks[rank] += 1
            if streaks[rank] >= steps_thresh and rank not in flagged:
                flagged.add(rank)
                found.append(SlowRank(rank, step, ratio, peer, streaks[rank]))
        else:
            streaks[rank] = 0
            flagged.discard(rank)
    found.sort(key=lambda s: s.rank)
    new = msgspec.structs.replace(
        state,
        streaks=tuple(streaks),
        flagged=tuple(sorted(flagged)),
        closed_upto=closed_upto,
    )
    return new, found


class _Buckets:
    """Mutable scratch copy of the open buckets while one heartbeat is applied."""

    __slots__ = ("a_ranks", "a_step", "a_times", "b_ranks", "b_step", "b_times", "found", "state")

    def __init__(self, state: StragglerState) -> None:
        self.state = state
        self.a_step, self.a_ranks, self.a_times = state.a_step, state.a_ranks, state.a_times
        self.b_step, self.b_ranks, self.b_times = state.b_step, state.b_ranks, state.b_times
        self.found: list[SlowRank] = []

    def close_a(self, ratio_thresh: float, steps_thresh: int) -> None:
        if self.a_step >= 0:
            self.state, slow = _close(
                self.state, self.a_ranks, self.a_times, self.a_step, ratio_thresh, steps_thresh
            )
            self.found.extend(slow)
        self.a_step, self.a_ranks, self.a_times = -1, (), ()

    def close_b(self, ratio_thresh: float, steps_thresh: int) -> None:
        self.close_a(ratio_thresh, steps_thresh)
        if self.b_step >= 0:
            self.state, slow = _close(
                self.state, self.b_ranks, self.b_times, self.b_step, ratio_thresh, steps_thresh
            )
            self.found.extend(slow)
        self.b_step, self.b_ranks, self.b_times = -1, (), ()

    def result(self) -> StragglerState:
        st = self.state
        return StragglerState(
            self.a_step,
            self.a_ranks,
            self.a_times,
            self.b_step,
            self.b_ranks,
            self.b_times,
            st.closed_upto,
            st.streaks,
            st.flagged,
        )


def observe(
    state: StragglerState,
    rank: int,
    step: int,
    step_time_s: float,
    live_ranks: int,
    ratio_thresh: float,
    steps_thresh: int,
) -> tuple[StragglerState, list[SlowRank]]:
    """Add one rank's step time; close buckets that are complete or left behind.

    Args:
        state: The straggler state.
        rank: The reporting rank.
        step: Its step.
        step_time_s: Its step time (non-positive: not measured, ignored).
        live_ranks: Ranks expected to report (known and not dead).
        ratio_thresh: ``straggler_ratio``.
        steps_thresh: ``straggler_steps``.

    Returns:
        The new state and the ranks that just became stragglers.
    """
    if not step_time_s > 0.0 or step <= state.closed_upto:
        return state, []
    if step == state.b_step:
        if rank in state.b_ranks:
            return state, []
        b_ranks = (*state.b_ranks, rank)
        if len(b_ranks) < live_ranks:
            return StragglerState(
                state.a_step,
                state.a_ranks,
                state.a_times,
                step,
                b_ranks,
                (*state.b_times, step_time_s),
                state.closed_upto,
                state.streaks,
                state.flagged,
            ), []
    buckets = _Buckets(state)
    if step == buckets.b_step:
        buckets.b_ranks = (*buckets.b_ranks, rank)
        buckets.b_times = (*buckets.b_times, step_time_s)
    elif step == buckets.a_step:
        if rank in buckets.a_ranks:
            return state, []
        buckets.a_ranks = (*buckets.a_ranks, rank)
        buckets.a_times = (*buckets.a_times, step_time_s)
    elif step > buckets.b_step:
        if step == buckets.b_step + 1:
            buckets.close_a(ratio_thresh, steps_thresh)
            buckets.a_step, buckets.a_ranks, buckets.a_times = (
                buckets.b_step,
                buckets.b_ranks,
                buckets.b_times,
            )
        else:
            buckets.close_b(ratio_thresh, steps_thresh)
        buckets.b_step, buckets.b_ranks, buckets.b_times = step, (rank,), (step_time_s,)
    elif step == buckets.b_step - 1 and buckets.a_step < 0:
        buckets.a_step, buckets.a_ranks, buckets.a_times = step, (rank,), (step_time_s,)
    else:
        return state, []
    if buckets.a_step >= 0 and len(buckets.a_ranks) >= live_ranks:
        buckets.close_a(ratio_thresh, steps_thresh)
    if buckets.b_step >= 0 and len(buckets.b_ranks) >= live_ranks:
        buckets.close_b(ratio_thresh, steps_thresh)
    return buckets.result(), buckets.found


__all__ = ["SlowRank", "StragglerState", "median_without", "observe"]
