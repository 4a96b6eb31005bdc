"""The topic catalogue: every topic runwatch uses, and what each one is for, in one table.

A topic is ``<prefix>.<role>``; its `TopicRole` says what it carries, and `ROLES` holds,
per role, everything the rest of runwatch needs to know about it: the event types a record
on it may hold (and what a pack there may hold), whether and how the processors fold it
(the reducer state it builds, the table that keeps that state, its place in the fold
order), its default partition count and its retention. Nothing else spells that
vocabulary: readers look roles up here (`RoleSpec`, `FOLD_ORDER`, `TopicNames.of`).

All topics are keyed by ``run_id``, so all of a run's events in one topic share one
partition (Kafka's default partitioner: murmur2 of the key modulo the topic's partition
count). Each topic has its own partition count (`DEFAULT_PARTITIONS`, sized for a fleet;
see `parse_partitions` for choosing others): the processors fold each input topic on its
own, their tables' changelogs are co-partitioned with that input topic, and every reader
of a run's partition (the audit, the Tick fan-out) reads the count from the cluster's
metadata, never from this table.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

import msgspec

from runwatch.schemas.events import (
    AgentReady,
    AnomalyDetected,
    CheckpointCommitted,
    CheckpointFailed,
    CommandRejected,
    DeadLetter,
    Event,
    EventPack,
    Heartbeat,
    RankExited,
    RestartCompleted,
    RestartFailed,
    RestartRequested,
    RunEnded,
    RunStarted,
    StepCompleted,
    Tick,
)


class TopicRole(enum.StrEnum):
    """What a topic is for; the topic itself is ``<prefix>.<role>``.

    A `str` (``TopicRole.STEPS == "steps"``), so a role read from a flag or a file is the
    role itself.
    """

    RUNS = "runs"
    STEPS = "steps"
    HEARTBEATS = "heartbeats"
    CHECKPOINTS = "checkpoints"
    ANOMALIES = "anomalies"
    COMMANDS = "commands"
    CONTROLLER = "controller"
    DEADLETTER = "deadletter"


class Principal(enum.StrEnum):
    """Who writes to Kafka: one credential per principal in a secured deployment."""

    TRAINER = "trainer"
    """Every rank of a training job: arbitrary user code, trusted with its own events only."""
    PROCESSORS = "processors"
    """The stream processors: verdicts, commands, dead letters, the clock's Ticks."""
    CONTROLLER = "controller"
    """The node agent: restart outcomes; it also speaks for its ranks (a gang that only
    prints logs, relayed ranks' events, exits) and announces a run's end."""
    SINKS = "sinks"
    """Alerts, metrics, the archive, the web view, the audit: readers only."""


class StateKind(enum.StrEnum):
    """The reducer states the processors keep, one per folded role (`Folding.state`)."""

    STEPS = "steps"
    LIVENESS = "liveness"
    CHECKPOINTS = "checkpoints"
    POLICY = "policy"


class Folding(msgspec.Struct, frozen=True, kw_only=True):
    """How the processors fold one input role.

    Attributes:
        state: The reducer state each run gets from this role's records.
        table: The processors' table keeping those states (its changelog topic is
            ``<app id>-<table>-changelog``; the name is part of a deployment's data).
        order: Position in the order a round folds its roles (`FOLD_ORDER`).
    """

    state: StateKind
    table: str
    order: int


class RoleSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Everything runwatch knows about one topic role.

    Attributes:
        role: The role.
        carries: The event types a record of this topic may hold.
        packs: What an `EventPack` on this topic may hold (empty: no packs here). Only
            the topic's own high-volume event, so one record never feeds two reducers.
        writers: Who may write records to it (ARCHITECTURE, "Who may write what"; Kafka's
            ACLs in a secured deployment, `runwatch.broker.acls`).
        readers: Who may read it.
        folding: How the processors fold it; None: they do not.
        partitions: Default partition count (`DEFAULT_PARTITIONS` has the reasoning).
        compacted: ``cleanup.policy=compact`` (keep the latest record per key).
        retention_ms: ``retention.ms``; None keeps the broker's default; -1 keeps forever.
        description: What the topic carries, for humans.
        broker_time: ``message.timestamp.type=LogAppendTime``: the broker stamps each
            record with its own clock on append, whatever the writer says, and a reader
            bounds the time an event claims by that stamp (`schemas.records`,
            docs/core.md "Records that steer decisions"). True for the topics trainers
            write (the inputs), whose times steer verdicts.
    """

    role: TopicRole
    carries: tuple[type[Event], ...]
    packs: tuple[type[Event], ...] = ()
    writers: frozenset[Principal]
    readers: frozenset[Principal]
    folding: Folding | None = None
    partitions: int
    compacted: bool = False
    retention_ms: int | None
    description: str
    broker_time: bool = False


WEEK_MS: Final = 7 * 24 * 3600 * 1000

ROLES: Final[Mapping[TopicRole, RoleSpec]] = {
    spec.role: spec
    for spec in (
        RoleSpec(
            role=TopicRole.RUNS,
            carries=(RunStarted, RunEnded),
            writers=frozenset({Principal.TRAINER, Principal.CONTROLLER}),
            readers=frozenset({Principal.PROCESSORS, Principal.CONTROLLER, Principal.SINKS}),
            partitions=8,
            compacted=True,
            retention_ms=None,
            description="RunStarted / RunEnded: model FLOP config, plan, peak, thresholds",
            broker_time=True,
        ),
        RoleSpec(
            role=TopicRole.STEPS,
            carries=(RunStarted, StepCompleted, RunEnded, EventPack),
            packs=(StepCompleted,),
            writers=frozenset({Principal.TRAINER, Principal.CONTROLLER}),
            readers=frozenset({Principal.PROCESSORS, Principal.SINKS}),
            folding=Folding(state=StateKind.STEPS, table="step-health", order=1),
            partitions=16,
            retention_ms=-1,
            description="StepCompleted (alone or packed): loss, grad norm, step time, tokens",
            broker_time=True,
        ),
        RoleSpec(
            role=TopicRole.HEARTBEATS,
            carries=(RunStarted, Heartbeat, RunEnded, Tick, RankExited, EventPack),
            packs=(Heartbeat,),
            writers=frozenset({Principal.TRAINER, Principal.CONTROLLER, Principal.PROCESSORS}),
            readers=frozenset({Principal.PROCESSORS, Principal.SINKS}),
            folding=Folding(state=StateKind.LIVENESS, table="liveness", order=3),
            partitions=64,
            retention_ms=4 * WEEK_MS,
            description="Heartbeat per rank per step (or packs), Tick from the clock",
            broker_time=True,
        ),
        RoleSpec(
            role=TopicRole.CHECKPOINTS,
            carries=(CheckpointCommitted, CheckpointFailed),
            writers=frozenset({Principal.TRAINER, Principal.CONTROLLER}),
            readers=frozenset({Principal.PROCESSORS, Principal.SINKS}),
            folding=Folding(state=StateKind.CHECKPOINTS, table="checkpoints", order=2),
            partitions=8,
            retention_ms=-1,
            description="CheckpointCommitted / CheckpointFailed",
            broker_time=True,
        ),
        RoleSpec(
            role=TopicRole.ANOMALIES,
            carries=(AnomalyDetected,),
            writers=frozenset({Principal.PROCESSORS}),
            readers=frozenset({Principal.PROCESSORS, Principal.CONTROLLER, Principal.SINKS}),
            folding=Folding(state=StateKind.POLICY, table="policy", order=0),
            partitions=8,
            retention_ms=-1,
            description="AnomalyDetected verdicts",
        ),
        RoleSpec(
            role=TopicRole.COMMANDS,
            carries=(RestartRequested,),
            writers=frozenset({Principal.PROCESSORS}),
            readers=frozenset({Principal.CONTROLLER, Principal.SINKS}),
            partitions=4,
            retention_ms=-1,
            description="RestartRequested, signed, from the policy to the controller",
        ),
        RoleSpec(
            role=TopicRole.CONTROLLER,
            carries=(RestartCompleted, RestartFailed, CommandRejected, AgentReady),
            writers=frozenset({Principal.CONTROLLER}),
            readers=frozenset({Principal.CONTROLLER, Principal.SINKS}),
            partitions=4,
            retention_ms=-1,
            description="RestartCompleted / RestartFailed / CommandRejected / AgentReady",
        ),
        RoleSpec(
            role=TopicRole.DEADLETTER,
            carries=(DeadLetter,),
            writers=frozenset({Principal.PROCESSORS}),
            readers=frozenset({Principal.SINKS}),
            partitions=4,
            retention_ms=4 * WEEK_MS,
            description="DeadLetter: undecodable records with the reason",
        ),
    )
}
"""Role -> what it is, in the catalogue's order (the order `catalogue` lists topics in)."""

FOLD_ORDER: Final[tuple[TopicRole, ...]] = tuple(
    sorted(
        (spec.role for spec in ROLES.values() if spec.folding is not None),
        key=lambda role: ROLES[role].folding.order,  # type: ignore[union-attr]
    )
)
"""The roles the processors fold, in the order a round folds them: the few records whose
outputs restart a gang or page a human first (anomalies, steps, checkpoints), the bulk
(heartbeats) last. The roles' states and outputs are independent, so the order changes when
outputs go out, not what they are; within a role, records keep their partition order."""

FOLDED_STATES: Final[Mapping[StateKind, TopicRole]] = {
    ROLES[role].folding.state: role  # type: ignore[union-attr]
    for role in FOLD_ORDER
}
"""State kind -> the role whose records build it."""


def folding(role: TopicRole | str) -> Folding:
    """How the processors fold ``role``.

    Raises:
        ValueError: The role is not one the processors fold.
    """
    found = ROLES[TopicRole(role)].folding
    if found is None:
        raise ValueError(f"the processors do not fold {role!s}; they fold {', '.join(FOLD_ORDER)}")
    return found


def table_of(kind: StateKind) -> str:
    """The processors' table that keeps ``kind`` states (its changelog holds them)."""
    return folding(FOLDED_STATES[kind]).table


DEFAULT_PARTITIONS: Final[Mapping[str, int]] = {
    role: spec.partitions for role, spec in ROLES.items()
}
"""Partitions per topic (by role), sized for a fleet; docs/deploy.md has the reasoning.

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
        broker_time: True: ``message.timestamp.type=LogAppendTime`` (`RoleSpec.broker_time`).
    """

    name: str
    partitions: int
    compacted: bool
    retention_ms: int | None
    carries: str
    broker_time: bool = False

    def configs(self) -> dict[str, str]:
        """Topic configs to create it with."""
        out = {"cleanup.policy": "compact" if self.compacted else "delete"}
        if self.retention_ms is not None and not self.compacted:
            out["retention.ms"] = str(self.retention_ms)
        if self.broker_time:
            out["message.timestamp.type"] = "LogAppendTime"
        return out


class TopicNames(msgspec.Struct, frozen=True, kw_only=True):
    """The names of the catalogue's topics for one prefix (one field per `TopicRole`)."""

    runs: str
    steps: str
    heartbeats: str
    checkpoints: str
    anomalies: str
    commands: str
    controller: str
    deadletter: str

    def of(self, role: TopicRole | str) -> str:
        """The topic of ``role``."""
        return str(getattr(self, TopicRole(role).value))

    def roles(self, *roles: TopicRole) -> dict[str, TopicRole]:
        """Topic name -> role, for ``roles`` (every role when none is given)."""
        return {self.of(role): role for role in roles or tuple(TopicRole)}


def names(prefix: str = "runwatch") -> TopicNames:
    """Topic names for ``prefix`` (``runwatch.steps`` and so on)."""
    return TopicNames(**{role.value: f"{prefix}.{role}" for role in TopicRole})


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
            name=f"{prefix}.{role}",
            partitions=counts[role],
            compacted=spec.compacted,
            retention_ms=spec.retention_ms,
            carries=spec.description,
            broker_time=spec.broker_time,
        )
        for role, spec in ROLES.items()
    ]
