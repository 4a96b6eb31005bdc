"""Stragglers: a rank whose step time stays above k times its peers' median.

Its state: ``stragglers`` (which steps the two open buckets hold, a
`processors.core.stragglers.StragglerState`; the buckets, streaks and flags are in the
rank table). The judging is `processors.core.stragglers.observe`.
"""

from __future__ import annotations

from runwatch.processors.core.detectors.base import LivenessDetector
from runwatch.processors.core.liveness_facts import HeartbeatFacts
from runwatch.processors.core.stragglers import observe


def fold_straggler(f: HeartbeatFacts) -> None:
    """Add the heartbeat's step time to its step's bucket; flag ranks that became stragglers.

    Rule 1: the ranks expected to report a step are the known ones not flagged dead
    (after this heartbeat's scans).
    Rule 2: each rank that became a straggler when a bucket closed raises one
    ``straggler`` (`processors.core.stragglers` decides).
    """
    cfg, data = f.cfg, f.data
    f.stragglers, slow = observe(
        f.stragglers,
        data,
        f.journal,
        f.rank,
        f.step,
        f.event.step_time_s,
        f.known - len(data.dead),
        cfg.straggler_ratio,
        cfg.straggler_steps,
    )
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
