"""Turn raw Kafka records into events, or into dead letters with the reason.

One decode per record. A record is rejected when its bytes are not a runwatch event, when
its tag is unknown, when the event does not belong on the topic it was read from, or when
its key is not its run id (it would sit in another run's partition and escape detection).
Nothing is dropped: every rejected record becomes a `DeadLetter` carrying the raw bytes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, NamedTuple

from schemas.codec import DecodeError, decode
from schemas.events import (
    TICK_RUN_ID,
    AnomalyDetected,
    AnyEvent,
    CheckpointCommitted,
    CheckpointFailed,
    CommandRejected,
    DeadLetter,
    Heartbeat,
    Provenance,
    RestartCompleted,
    RestartFailed,
    RestartRequested,
    RunEnded,
    RunStarted,
    StepCompleted,
    Tick,
)

ROLE_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "runs": (RunStarted, RunEnded),
    "steps": (RunStarted, StepCompleted, RunEnded),
    "heartbeats": (RunStarted, Heartbeat, RunEnded, Tick),
    "checkpoints": (CheckpointCommitted, CheckpointFailed),
    "anomalies": (AnomalyDetected,),
    "commands": (RestartRequested,),
    "controller": (RestartCompleted, RestartFailed, CommandRejected),
}
"""Which event types each topic role may carry."""


class RawRecord(NamedTuple):
    """A record as read from Kafka."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int = 0


class Decoded(NamedTuple):
    """A record that decoded to an event valid on its topic."""

    source: Provenance
    event: AnyEvent


def dead_letter(record: RawRecord, reason: str) -> DeadLetter:
    """A dead letter for ``record``; its log time is the record's broker timestamp."""
    return DeadLetter(
        run_id=(record.key or b"").decode("utf-8", "replace"),
        ts_ns=record.timestamp_ms * 1_000_000,
        seq=record.offset,
        source=Provenance(topic=record.topic, partition=record.partition, offset=record.offset),
        reason=reason,
        key=record.key,
        payload=record.value or b"",
    )


def check(record: RawRecord, role: str) -> Decoded | DeadLetter:
    """Decode one record read from a topic of ``role`` and check it belongs there."""
    if record.value is None:
        return dead_letter(record, "empty record value (tombstone) on a non-compacted topic")
    try:
        event = decode(record.value)
    except DecodeError as exc:
        return dead_letter(record, exc.reason)
    allowed = ROLE_TYPES[role]
    if not isinstance(event, allowed):
        names = ", ".join(t.__name__ for t in allowed)
        return dead_letter(
            record, f"{type(event).__name__} does not belong on a {role} topic ({names})"
        )
    expected_key = TICK_RUN_ID if isinstance(event, Tick) else event.run_id
    if record.key is None or record.key != expected_key.encode():
        return dead_letter(record, f"record key {record.key!r} is not the run id {expected_key!r}")
    if not event.run_id:
        return dead_letter(record, "empty run_id")
    source = Provenance(topic=record.topic, partition=record.partition, offset=record.offset)
    return Decoded(source, event)


def split(records: Iterable[RawRecord], role: str) -> tuple[list[Decoded], list[DeadLetter]]:
    """Decode a batch: the good records in order, and the dead letters."""
    good: list[Decoded] = []
    dead: list[DeadLetter] = []
    for record in records:
        out = check(record, role)
        if isinstance(out, DeadLetter):
            dead.append(out)
        else:
            good.append(out)
    return good, dead
