"""The topic catalogue: every topic runwatch uses, in one place.

All topics are keyed by ``run_id``, so all of a run's events in one topic share one
partition (Kafka's default partitioner: murmur2 of the key modulo the topic's partition
count). Each topic has its own partition count (`DEFAULT_PARTITIONS`, sized for a fleet;
see `parse_partitions` for choosing others): the processors fold each input topic on its
own, their tables' changelogs are co-partitioned with that input topic, and every reader
of a run's partition (the audit, the Tick fan-out) reads the count from the cluster's
metadata, never from this table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import msgspec

DEFAULT_PARTITIONS: Final[Mapping[str, int]] = {
    "runs": 8,
    "steps": 16,
    "heartbeats": 64,
    "checkpoints": 8,
    "anomalies": 8,
    "commands": 4,
    "controller": 4,
    "deadletter": 4,
}
"""Partitions per topic (by short name), sized for a fleet; docs/deploy.md has the reasoning.

A topic's partition count is the ceiling on the workers that share its agent, and a run
never spans partitions. ``heartbeats`` carries one record per rank per step (100 runs of
1,024 ranks at a step a second: about 100k records/s, each rank's step record and the
Ticks on top are small change), so it gets the most: at a few thousand records/s per
worker it needs tens of workers, and 64 partitions leave that room while 100 runs still
fill them. ``steps`` is one record per run per step (rank 0): 16 partitions for the
heaviest fold per record. ``checkpoints``, ``anomalies`` (the policy agent's input) and
``runs`` (compacted, two records per incarnation) are a record per event of a run: 8.
``commands``, ``controller`` and ``deadletter`` are low volume and read by sinks: 4.
"""

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
    ("steps", False, -1, "StepCompleted (alone or packed): loss, grad norm, step time, tokens"),
    (
        "heartbeats",
        False,
        4 * WEEK_MS,
        "Heartbeat per rank per step (or packs), Tick from the clock",
    ),
    ("checkpoints", False, -1, "CheckpointCommitted / CheckpointFailed"),
    ("anomalies", False, -1, "AnomalyDetected verdicts"),
    ("commands", False, -1, "RestartRequested, signed, from the policy to the controller"),
    ("controller", False, -1, "RestartCompleted / RestartFailed / CommandRejected / AgentReady"),
    ("deadletter", False, 4 * WEEK_MS, "DeadLetter: undecodable records with the reason"),
)


def names(prefix: str = "runwatch") -> TopicNames:
    """Topic names for ``prefix`` (``runwatch.steps`` and so on)."""
    return TopicNames(**{short: f"{prefix}.{short}" for short, *_ in _CATALOGUE})


def default_partitions(short: str) -> int:
    """The catalogue's partition count of topic ``short`` (``steps``, ``heartbeats``...).

    Raises:
        ValueError: ``short`` is not a catalogue topic.
    """
    try:
        return DEFAULT_PARTITIONS[short]
    except KeyError:
        raise ValueError(
            f"no topic {short!r} in the catalogue; topics: {', '.join(DEFAULT_PARTITIONS)}"
        ) from None


def parse_partitions(text: str) -> dict[str, int]:
    """Partition counts from ``--partitions`` / ``RUNWATCH_PARTITIONS``, by short name.

    A comma-separated list of ``TOPIC=N`` (that topic) and at most one bare ``N`` (every
    topic not named): ``heartbeats=64,steps=32``, ``2``, ``8,heartbeats=64``. Topics
    neither named nor covered by a bare ``N`` keep `DEFAULT_PARTITIONS`.

    Returns:
        Short name -> count, for every catalogue topic.

    Raises:
        ValueError: an unknown topic, a count that is not a positive integer, a topic
            named twice, two bare counts, or nothing at all.
    """
    every: int | None = None
    named: dict[str, int] = {}
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise ValueError("partitions: expected N or TOPIC=N[,TOPIC=N...], got nothing")
    for item in items:
        short, sep, raw = item.rpartition("=")
        short = short.strip()
        count = _positive(raw.strip(), item)
        if not sep:
            if every is not None:
                raise ValueError(f"partitions: two counts for every topic in {text!r}")
            every = count
            continue
        default_partitions(short)  # an unknown name raises, listing the known ones
        if short in named:
            raise ValueError(f"partitions: {short} named twice in {text!r}")
        named[short] = count
    return {
        short: named.get(short, every if every is not None else default)
        for short, default in DEFAULT_PARTITIONS.items()
    }


def _positive(raw: str, item: str) -> int:
    try:
        count = int(raw)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"partitions must be positive integers, got {item!r}")
    return count


def catalogue(
    prefix: str = "runwatch", partitions: int | Mapping[str, int] | None = None
) -> list[TopicSpec]:
    """Every topic for ``prefix``.

    Args:
        prefix: Topic name prefix.
        partitions: One count for every topic, or counts by short name (topics not named
            keep theirs), or None: `DEFAULT_PARTITIONS`.

    Returns:
        The specs, in a stable order.

    Raises:
        ValueError: a count below 1, or a name that is not a catalogue topic.
    """
    if partitions is None:
        counts = dict(DEFAULT_PARTITIONS)
    elif isinstance(partitions, int):
        counts = dict.fromkeys(DEFAULT_PARTITIONS, partitions)
    else:
        for short in partitions:
            default_partitions(short)
        counts = {**DEFAULT_PARTITIONS, **partitions}
    for short, count in counts.items():
        if count < 1:
            raise ValueError(f"partitions must be >= 1, got {count} for {short}")
    return [
        TopicSpec(
            name=f"{prefix}.{short}",
            partitions=counts[short],
            compacted=compacted,
            retention_ms=retention,
            carries=carries,
        )
        for short, compacted, retention, carries in _CATALOGUE
    ]
