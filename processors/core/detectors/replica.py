"""Replica groups of a per-step fault-tolerant run (`processors.core.replicas`)."""

from __future__ import annotations

from runwatch.processors.core.detectors.base import StepDetector, StepFacts
from runwatch.processors.core.replicas import Floor, ReplicaTally, fold_replicas


def fold_replica(f: StepFacts, s: ReplicaTally) -> ReplicaTally:
    """Rule 1: a step without participants (not a torchft run) changes nothing.

    Rule 2: otherwise the quorum is tallied (`replicas.fold_replicas`) against the run's
    floor (its ``min_replicas`` and ``min_replicas_bound_s`` thresholds).
    """
    if not f.event.participants:
        return s
    floor = Floor(f.cfg.min_replicas, f.cfg.min_replicas_bound_s)
    return fold_replicas(s, f.event, f.emit_replica, floor)


def reset_replica(s: ReplicaTally, from_step: int) -> ReplicaTally:
    """A resume or a new gang keeps the tally (groups outlive restarts)."""
    return s


REPLICAS = StepDetector("replicas", "replicas", fold_replica, reset_replica)
"""The replica-group detector."""

__all__ = ["REPLICAS", "fold_replica", "reset_replica"]
