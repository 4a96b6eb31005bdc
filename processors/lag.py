"""Have the processors processed a run's records? The lag half of an audit.

The processors are a consumer group (faust's group id is the app id, `runwatch processors
--app-id`). Faust commits an input offset only after the verdicts of the records before it
were published and acknowledged, so a committed offset ``c`` on a partition says: every
record at an offset below ``c`` has been judged, and its verdicts are in the log. The audit
names the offsets it relies on (the run's records, and the clock's ticks after the run's
first heartbeat); those at or after the committed offset are *pending*.

`lag_of` is pure. `GroupOffsets` reads committed offsets through the admin API and
`await_processed` polls it until a target is reached or a deadline passes (there is no
push notification for commits: polling the coordinator is the way to await one).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec
from kafka import KafkaAdminClient, TopicPartition
from kafka.errors import KafkaError

from runwatch.common.settings import kafka_client_config

POLL_S = 0.25
"""How often `await_processed` asks for the committed offsets (faust commits every 1 s)."""
TICK_GRACE_S = 3.0
"""How long to wait for the clock's last ticks once the run's own records are processed:
a live worker commits them within about a second; a stopped one never will, and then the
audit decides whether they matter (`processors.audit.audit`)."""


class PartitionLag(msgspec.Struct, frozen=True, kw_only=True):
    """What the group has processed of one partition, as far as the audit relies on it.

    Attributes:
        topic: The topic.
        partition: The partition.
        committed: The group's committed offset (the next it will process); None when it
            never committed on this partition.
        target: One past the last offset the audit relies on (0 when it relies on none).
        pending: Records the audit relies on at or after ``committed``.
    """

    topic: str
    partition: int
    committed: int | None
    target: int
    pending: int


class Progress(msgspec.Struct, frozen=True, kw_only=True):
    """Whether the processors' group has processed what an audit compares.

    Attributes:
        group: The consumer group (the processors' app id).
        group_found: The group has committed offsets on the run's topics, or has a live
            member subscribed to them that has not committed yet (nothing processed: all
            pending); when False lag cannot be told.
        partitions: Per partition relied on, what is processed of the run's own records.
        ticks: Per heartbeat partition, what is processed of the clock's ticks relied on.
        waited_s: Seconds the audit waited for the group.
        other_groups: When the group was not found, groups that did commit offsets on
            the run's topics (a hint for ``--app-id``).
    """

    group: str
    group_found: bool
    partitions: tuple[PartitionLag, ...] = ()
    ticks: tuple[PartitionLag, ...] = ()
    waited_s: float = 0.0
    other_groups: tuple[str, ...] = ()

    @property
    def pending(self) -> int:
        """The run's own records relied on that the group has not processed yet."""
        return sum(p.pending for p in self.partitions)

    @property
    def ticks_pending(self) -> int:
        """Clock ticks relied on that the group has not processed yet."""
        return sum(p.pending for p in self.ticks)


def lag_of(
    relied: Mapping[TopicPartition, Sequence[int]], committed: Mapping[TopicPartition, int]
) -> tuple[PartitionLag, ...]:
    """How far the group is behind on the offsets relied on.

    Args:
        relied: Partition -> the offsets the audit relies on, ascending.
        committed: Partition -> the group's committed offset; a partition absent here was
            never committed to, so nothing of it is processed.

    Returns:
        One entry per partition of ``relied``, sorted by topic and partition.
    """
    out = []
    for tp in sorted(relied, key=lambda tp: (tp.topic, tp.partition)):
        offsets = relied[tp]
        done = committed.get(tp)
        pending = len(offsets) - (bisect_left(offsets, done) if done is not None else 0)
        out.append(
            PartitionLag(
                topic=tp.topic,
                partition=tp.partition,
                committed=done,
                target=offsets[-1] + 1 if offsets else 0,
                pending=pending,
            )
        )
    return tuple(out)


class GroupOffsets:
    """A consumer group's committed offsets, read through one admin client."""

    def __init__(
        self, bootstrap: str, group: str, *, client_config: dict[str, Any] | None = None
    ) -> None:
        """Connect.

        Args:
            bootstrap: Kafka bootstrap address.
            group: The consumer group.
            client_config: Extra kafka-python settings (security).
        """
        self.group = group
        self._admin = KafkaAdminClient(
            bootstrap_servers=bootstrap,
            **(client_config if client_config is not None else kafka_client_config()),
        )

    def __enter__(self) -> GroupOffsets:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the admin client."""
        self._admin.close()

    def _fetch(self, group: str, partitions: list[TopicPartition] | None) -> dict[Any, Any]:
        try:
            found = self._admin.list_group_offsets({group: partitions})
        except KafkaError:  # no coordinator: the group never joined
            return {}
        return dict(found.get(group, {}))

    def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Committed offsets of ``partitions``; partitions never committed are left out."""
        wanted = list(partitions)
        if not wanted:
            return {}
        got = self._fetch(self.group, wanted)
        return {
            TopicPartition(tp.topic, tp.partition): meta.offset
            for tp, meta in got.items()
            if meta is not None and meta.offset >= 0
        }

    def exists(self, topics: Iterable[str]) -> bool:
        """True when the group has committed on one of ``topics`` or is about to.

        About to: it has not committed yet but has a live member subscribed to one of them.
        A worker killed before its first commit leaves such a group: it exists and has
        processed nothing yet, which is lag (PENDING), not an unknown group. A group that
        commits only elsewhere (another prefix's topics: a wrong ``--app-id``) counts as
        absent: it would never catch up with these.
        """
        wanted = set(topics)
        if any(
            tp.topic in wanted and meta.offset >= 0
            for tp, meta in self._fetch(self.group, None).items()
        ):
            return True
        return self._subscribed(wanted)

    def _subscribed(self, wanted: set[str]) -> bool:
        """True when a live member of the group subscribes to one of ``wanted``."""
        try:
            described = self._admin.describe_groups([self.group])
        except KafkaError:  # no coordinator: the group never joined
            return False
        group = described.get(self.group) or {}
        if group.get("group_state") in (None, "Dead", "Empty"):
            return False
        for member in group.get("members") or ():
            metadata = member.get("member_metadata")
            subscribed = metadata.get("topics") if isinstance(metadata, dict) else None
            if subscribed and wanted.intersection(subscribed):
                return True
        return False

    def groups_on(self, topics: Iterable[str]) -> tuple[str, ...]:
        """Other groups with committed offsets on any of ``topics``, sorted."""
        wanted = set(topics)
        try:
            listed = self._admin.list_groups()
        except KafkaError:
            return ()
        groups = sorted(str(g["group_id"] if isinstance(g, dict) else g[0]) for g in listed)
        out = []
        for group in groups:
            if group != self.group and any(tp.topic in wanted for tp in self._fetch(group, None)):
                out.append(group)
        return tuple(out)


def await_processed(
    offsets: GroupOffsets,
    relied: Mapping[TopicPartition, Sequence[int]],
    deadline_s: float,
    *,
    ticks: Mapping[TopicPartition, Sequence[int]] | None = None,
    tick_grace_s: float = TICK_GRACE_S,
    poll_s: float = POLL_S,
) -> dict[TopicPartition, int]:
    """Poll the group's committed offsets until every offset relied on is processed.

    Args:
        offsets: The group's offsets reader.
        relied: Partition -> the offsets of the run's own records relied on, ascending.
        deadline_s: `time.monotonic()` value after which the last answer is returned.
        ticks: Partition -> the offsets of clock ticks relied on, ascending; waited for
            at most ``tick_grace_s`` after the own records are processed.
        tick_grace_s: See ``ticks``.
        poll_s: Interval between two questions to the group coordinator.

    Returns:
        The committed offsets last read (compare with `lag_of`).
    """
    ticks = ticks or {}
    partitions = {*relied, *ticks}
    own_done_at: float | None = None
    while True:
        committed = offsets.committed(partitions)
        now = time.monotonic()
        if all(p.pending == 0 for p in lag_of(relied, committed)):
            if all(p.pending == 0 for p in lag_of(ticks, committed)):
                return committed
            own_done_at = now if own_done_at is None else own_done_at
            if now - own_done_at >= tick_grace_s:
                return committed
        left_s = deadline_s - now
        if left_s <= 0:
            return committed
        time.sleep(min(poll_s, left_s))  # commits land on faust's schedule: ask again
