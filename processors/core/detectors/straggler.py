"""Stragglers: a rank whose step time stays above k times its peers' median.

Its state: ``stragglers`` (which steps the two open buckets hold, a
`processors.core.stragglers.StragglerState`; the buckets, streaks and flags are in the
rank table). The judging is `processors.core.straggler_buckets.observe`.
"""

from __future__ import annotations

from runwatch.processors.core.detectors.base import LivenessDetector
from runwatch.processors.core.liveness_facts import HeartbeatFacts
from runwatch.processors.core.rank_table import ABSENT
from runwatch.processors.core.straggler_buckets import observe


def fold_straggler(f: HeartbeatFacts) -> None:
    """Add the heartbeat's step time to its step's bucket; flag ranks that became stragglers.

    Rule 1: the ranks expected to report a step are the known ones not flagged dead
    (after this heartbeat's scans).
    Rule 2: each rank that became a straggler when a bucket closed raises one
    ``straggler`` (`processors.core.straggler_buckets` decides).

    Most heartbeats add a new rank's time to the newest open bucket without completing
    it: that case of `observe` is done here inline (no call), with its checks in the same
    order; every other case is `observe`'s.
    """
    before, data, step = f.stragglers, f.data, f.step
    live_ranks = f.known - len(data.dead)
    step_time_s = f.event.step_time_s
    if step == before.b_step and step_time_s > 0.0 and step > before.closed_upto:
        bucket = data.buckets[1]
        if f.rank in bucket:
            return
        if len(bucket) + 1 < live_ranks:
            f.journal.append((bucket, f.rank, ABSENT))  # Journal.put of a new key
            bucket[f.rank] = step_time_s
            return
    cfg = f.cfg
    stragglers, slow = observe(
        before,
        data,
        f.journal,
        f.rank,
        step,
        step_time_s,
        live_ranks,
        cfg.straggler_ratio,
        cfg.straggler_steps,
    )
    if stragglers is not before:  # a bucket opened or closed (the facts' writes are dear)
        f.stragglers = stragglers
    for s in slow:
        f.emit(
            "straggler",
            s.step,
            s.rank,
            s.ratio,
            cfg.straggler_ratio,
            f"rank {s.rank} at {s.ratio:.2f}x its peers' median step time "
            f"{s.peer_median_s:.4g} s for {s.streak} steps",
            baseline=s.peer_median_s,
        )


STRAGGLERS = LivenessDetector("stragglers", ("stragglers",), heartbeat=fold_straggler)
"""The straggler detector."""

__all__ = ["STRAGGLERS", "fold_straggler"]
