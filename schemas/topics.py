"""The topic catalogue: every topic runwatch uses, in one place.

All topics are keyed by ``run_id`` and created with the same partition count, so a run's
events share one partition number across topics (co-partitioning): a processor that owns
partition p of the input topics owns every event of the runs hashed to p.
"""

from __future__ import annotations

from typing import Final

import msgspec

DEFAULT_PARTITIONS: Final = 8
"""Partitions per topic; the ceiling on processor workers that share the work."""

WEEK_MS: Final = 7 * 24 * 3600 * 1000


MAX_REPLICATION_FACTOR: Final = 3
"""The replication factor runwatch chooses on clusters of this many brokers or more."""


class Replication(msgspec.Struct, frozen=True, kw_only=True):
    """How many copies of each partition a cluster keeps, and how many must acknowledge.

    Attributes:
        factor: Replicas per partition (``replication_factor``).
        min_insync: ``min.insync.replicas``: in-sync replicas an ``acks=all`` write needs.
    """

    factor: int
    min_insync: int


def replication_for(brokers: int, factor: int | None = None) -> Replication:
    """The replication of runwatch's topics on a cluster of ``brokers`` brokers.

    The factor is ``min(3, brokers)`` unless given. ``min.insync.replicas`` is 2 from a
    factor of 3 up (an acknowledged write is on two brokers, and one broker may be down
    without stopping writes) and 1 below (a factor of 2 with 2 in sync would stop every
    write while either broker is down).

    Args:
        brokers: Brokers in the cluster (at least 1).
        factor: An explicit replication factor, overriding the choice (1..``brokers``).

    Raises:
        ValueError: ``brokers`` < 1, or ``factor`` outside 1..``brokers``.
    """
    if brokers < 1:
        raise ValueError(f"a cluster has at least 1 broker, got {brokers}")
    chosen = min(MAX_REPLICATION_FACTOR, brokers) if factor is None else factor
    if not 1 <= chosen <= brokers:
        raise ValueError(
            f"replication factor {chosen} needs 1..{brokers} (the cluster has {brokers} "
            f"broker{'s' if brokers != 1 else ''})"
        )
    return Replication(factor=chosen, min_insync=2 if chosen >= 3 else 1)


class TopicSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One topic: its name, partitions and retention policy.

    Attributes:
        name: Full topic name (prefix included).
        partitions: Partition count.
        compacted: True: ``cleanup.policy=compact`` (keep the latest record per key).
        retention_ms: ``retention.ms``; None keeps the broker's default; -1 keeps forever.
        carries: What the topic carries, for humans.
    """

    name: str
    partitions: int
    compacted: bool
    retention_ms: int | None
    carries: str

    def configs(self) -> dict[str, str]:
        """Topic configs to create it with."""
        out = {"cleanup.policy": "compact" if self.compacted else "delete"}
        if self.retention_ms is not None and not self.compacted:
            out["retention.ms"] = str(self.retention_ms)
        return out


class TopicNames(msgspec.Struct, frozen=True, kw_only=True):
    """The names of the catalogue's topics for one prefix."""

    runs: str
    steps: str
    heartbeats: str
    checkpoints: str
    anomalies: str
    commands: str
    controller: str
    deadletter: str


_CATALOGUE: Final[tuple[tuple[str, bool, int | None, str], ...]] = (
    ("runs", True, None, "RunStarted / RunEnded: model FLOP config, plan, peak, thresholds"),
    ("steps", False, -1, "StepCompleted: loss, grad norm, step time, tokens, restart marker"),
    ("heartbeats", False, 4 * WEEK_MS, "Heartbeat per rank per step, and Tick from the clock"),
    ("checkpoints", False, -1, "CheckpointCommitted / CheckpointFailed"),
    ("anomalies", False, -1, "AnomalyDetected verdicts"),
    ("commands", False, -1, "RestartRequested, signed, from the policy to the controller"),
    ("controller", False, -1, "RestartCompleted / RestartFailed / CommandRejected"),
    ("deadletter", False, 4 * WEEK_MS, "DeadLetter: undecodable records with the reason"),
)


def names(prefix: str = "runwatch") -> TopicNames:
    """Topic names for ``prefix`` (``runwatch.steps`` and so on)."""
    return TopicNames(**{short: f"{prefix}.{short}" for short, *_ in _CATALOGUE})


def catalogue(prefix: str = "runwatch", partitions: int | None = None) -> list[TopicSpec]:
    """Every topic for ``prefix``.

    Args:
        prefix: Topic name prefix.
        partitions: Partitions per topic; `DEFAULT_PARTITIONS` when None.

    Returns:
        The specs, in a stable order.
    """
    count = DEFAULT_PARTITIONS if partitions is None else partitions
    if count < 1:
        raise ValueError(f"partitions must be >= 1, got {count}")
    return [
        TopicSpec(
            name=f"{prefix}.{short}",
            partitions=count,
            compacted=compacted,
            retention_ms=retention,
            carries=carries,
        )
        for short, compacted, retention, carries in _CATALOGUE
    ]
