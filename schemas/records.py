"""Turn raw Kafka records into events, or into dead letters with the reason.

One decode per record. A record is rejected when its bytes are not a runwatch event, when
its tag is unknown, when the event does not belong on the topic it was read from, or when
its key is not its run id (it would sit in another run's partition and escape detection).
A packed record (`schemas.events.EventPack`) is rejected whole when any event in it does
not belong on the topic (`schemas.topics.RoleSpec.packs`), or belongs to another run (the codec
refuses that pack); it is not unpacked here: the shared fold does that
(`processors.core.replay.unpack`), so every reader applies the same events.
Nothing is dropped: every rejected record becomes a `DeadLetter` (stage ``decode``) with
the reason and the raw bytes, cut to the dead letter's bounds so that the dead letter
itself is always a valid event that fits in a Kafka record (the record stays in its topic
at the offset the dead letter names). `check` never raises, whatever the record holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from runwatch.schemas.codec import DecodeError, decode
from runwatch.schemas.events import (
    MAX_DEADLETTER_PAYLOAD_BYTES,
    MAX_ID_CHARS,
    MAX_TEXT_CHARS,
    TICK_RUN_ID,
    AnyEvent,
    DeadLetter,
    EventPack,
    Provenance,
    Tick,
)
from runwatch.schemas.topics import ROLES, TopicRole


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
    payload = record.value or b""
    if len(payload) > MAX_DEADLETTER_PAYLOAD_BYTES:
        reason = f"{reason} (payload cut to {MAX_DEADLETTER_PAYLOAD_BYTES} of {len(payload)} bytes)"
        payload = payload[:MAX_DEADLETTER_PAYLOAD_BYTES]
    key = record.key if record.key is None else record.key[:MAX_TEXT_CHARS]
    return DeadLetter(
        run_id=(record.key or b"")[: 4 * MAX_ID_CHARS].decode("utf-8", "replace")[:MAX_ID_CHARS],
        ts_ns=max(0, record.timestamp_ms) * 1_000_000,
        seq=max(0, record.offset),
        source=Provenance(topic=record.topic, partition=record.partition, offset=record.offset),
        reason=_one_line(reason),
        key=key,
        payload=payload,
        stage="decode",
    )


def _one_line(reason: str) -> str:
    line = " ".join(reason.split())
    return line if len(line) <= MAX_TEXT_CHARS else line[: MAX_TEXT_CHARS - 3] + "..."


def check(record: RawRecord, role: TopicRole) -> Decoded | DeadLetter:
    """Decode one record read from a topic of ``role`` and check it belongs there.

    Never raises: whatever goes wrong with one record makes it a dead letter.
    """
    try:
        return _check(record, role)
    except Exception as exc:
        return dead_letter(record, f"decode: {type(exc).__name__}: {exc}")


def _check(record: RawRecord, role: TopicRole) -> Decoded | DeadLetter:
    if record.value is None:
        return dead_letter(record, "empty record value (tombstone) on a non-compacted topic")
    try:
        event = decode(record.value)
    except DecodeError as exc:
        return dead_letter(record, exc.reason)
    spec = ROLES[role]
    allowed = spec.carries
    if not isinstance(event, allowed):
        names = ", ".join(t.__name__ for t in allowed)
        return dead_letter(
            record, f"{type(event).__name__} does not belong on a {role} topic ({names})"
        )
    if isinstance(event, EventPack):
        packable = spec.packs
        for index, inner in enumerate(event.events):
            if not isinstance(inner, packable):
                names = ", ".join(t.__name__ for t in packable)
                return dead_letter(
                    record,
                    f"event {index} of a pack is a {type(inner).__name__}, which does not "
                    f"belong on a {role} topic (packs there hold {names})",
                )
    expected_key = TICK_RUN_ID if isinstance(event, Tick) else event.run_id
    if record.key is None or record.key != expected_key.encode():
        key = record.key if record.key is None else record.key[:MAX_ID_CHARS]
        return dead_letter(record, f"record key {key!r} is not the run id {expected_key!r}")
    if not event.run_id:
        return dead_letter(record, "empty run_id")
    source = Provenance(topic=record.topic, partition=record.partition, offset=record.offset)
    return Decoded(source, event)


def split(records: Iterable[RawRecord], role: TopicRole) -> tuple[list[Decoded], list[DeadLetter]]:
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
