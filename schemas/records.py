"""Turn raw Kafka records into events, or into dead letters with the reason.

One decode per record (`split` decodes a chunk of small records in one msgspec call, and
decides for each exactly what `check` would). A record is rejected when its bytes are not
a runwatch event, when its tag is unknown, when the event does not belong on the topic it
was read from, or when its key is not its run id (it would sit in another run's partition
and escape detection).
A packed record (`schemas.events.EventPack`) is rejected whole when any event in it does
not belong on the topic (`schemas.topics.RoleSpec.packs`), or belongs to another run (the codec
refuses that pack); it is not unpacked here: the shared fold does that
(`processors.core.replay.unpack`), so every reader applies the same events.

Time is bounded by the broker (docs/core.md, "Records that steer decisions"). On a topic
whose role has `schemas.topics.RoleSpec.broker_time` (created with
``message.timestamp.type=LogAppendTime``), the record's timestamp is the broker's clock at
append, which no writer sets. An event (or any event of a pack) whose ``ts_ns`` is more
than `MAX_FUTURE_SKEW_NS` past that stamp is a dead letter with the reason ``future_ts``;
a `schemas.events.Tick` later than the stamp is clamped to it, so a forged Tick can say
only "now". A record with no broker stamp (``timestamp_ms <= 0``: a record built in
memory, or a message format older than Kafka 0.10) is not bounded. Every reader (the live
processors, the audit, replay, the sinks) checks records here, so all of them see the same
events.

Nothing is dropped: every rejected record becomes a `DeadLetter` (stage ``decode``) with
the reason and the raw bytes, cut to the dead letter's bounds so that the dead letter
itself is always a valid event that fits in a Kafka record (the record stays in its topic
at the offset the dead letter names). `check` never raises, whatever the record holds.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from typing import Final, NamedTuple, overload

import msgspec

from runwatch.schemas.codec import MANY_MAX_RECORD_BYTES, DecodeError, decode, decode_many
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

MAX_FUTURE_SKEW_NS: Final = 300 * 1_000_000_000
"""How far (5 minutes) an event's ``ts_ns`` may lie past its record's broker timestamp.

A trainer's clock that NTP keeps is within milliseconds of the broker's; batching and
retries delay a record's append, which only puts the broker's stamp *later* than the
event. Five minutes covers a badly drifting host and is still far below the timeouts a
future time could trip (`processors.core.config.DetectorConfig.dead_rank_timeout_s` is
300 s by default, `hang_timeout_s` 600 s)."""
FUTURE_TS: Final = "future_ts"
"""The reason a dead letter for an event dated past its broker time starts with."""
_CARRIED: Final = {role: frozenset(spec.carries) for role, spec in ROLES.items()}
"""Per role, the exact types its records may decode to: `decode` returns the struct a tag
names, never a subclass, and no event type subclasses another (a test holds both), so a
set lookup of ``type(event)`` says what ``isinstance`` would, a fraction of its cost."""
_PACKED: Final = {role: frozenset(spec.packs) for role, spec in ROLES.items()}
"""Per role, the exact types a pack on it may hold (as `_CARRIED`)."""
_TS_NS: Final = operator.attrgetter("ts_ns")
_BROKER_TIME: Final = frozenset(role for role, spec in ROLES.items() if spec.broker_time)
"""The roles whose records' time the broker's stamp bounds (`RoleSpec.broker_time`)."""
_NEW_TUPLE: Final = tuple.__new__
_PLAIN: Final = {role: _CARRIED[role] - {Tick, EventPack} for role in ROLES}
"""Per role, the types `_admit_plain` admits a chunk of at once (no clamp, no pack)."""
_RUN_ID: Final = operator.attrgetter("run_id")
SPLIT_CHUNK: Final = 256
"""Records `split` decodes in one call. A chunk that cannot be admitted whole is checked
again record by record (its events kept), so a hostile record costs at most its chunk one
extra pass of the cheap rules; larger chunks gain little more (the call is per record)."""


class RawRecord(NamedTuple):
    """A record as read from Kafka."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int = 0


_VALUE: Final = operator.itemgetter(RawRecord._fields.index("value"))


class Decoded(NamedTuple):
    """A record that decoded to an event valid on its topic."""

    source: Provenance
    event: AnyEvent


_SOURCE: Final = operator.itemgetter(0)
_EVENT: Final = operator.itemgetter(1)


class Admitted(Sequence[Decoded]):
    """A batch's admitted records as two columns: their positions and their events.

    What `split` gives. The worker's fold reads the columns (``sources[i]`` is the
    position of ``events[i]``) and so makes no pair object per record (~0.1 µs a record
    to make and free); every other reader uses it as the list of `Decoded` it stands for:
    length, indexing, slicing (another `Admitted`), iteration, and ``==`` with a list or
    another `Admitted` are a list's. The columns are never changed once `split` returns.

    Attributes:
        sources: Each record's position.
        events: Each record's event.
    """

    __slots__ = ("events", "sources")

    def __init__(
        self, sources: list[Provenance] | None = None, events: list[AnyEvent] | None = None
    ) -> None:
        """Columns of equal length (empty when not given)."""
        self.sources: list[Provenance] = [] if sources is None else sources
        self.events: list[AnyEvent] = [] if events is None else events
        if len(self.sources) != len(self.events):
            raise ValueError(
                f"{len(self.sources)} positions for {len(self.events)} events: the columns "
                "of an Admitted go index for index"
            )

    @classmethod
    def of(cls, items: Iterable[Decoded]) -> Admitted:
        """The columns of ``items`` (itself when it is an `Admitted`)."""
        if type(items) is Admitted:
            return items
        pairs = items if isinstance(items, list) else list(items)
        return cls(list(map(_SOURCE, pairs)), list(map(_EVENT, pairs)))

    def __len__(self) -> int:
        """How many records."""
        return len(self.events)

    @overload
    def __getitem__(self, index: int) -> Decoded: ...

    @overload
    def __getitem__(self, index: slice) -> Admitted: ...

    def __getitem__(self, index: int | slice) -> Decoded | Admitted:
        """A record as its `Decoded`, or a slice as an `Admitted`."""
        if isinstance(index, slice):
            return Admitted(self.sources[index], self.events[index])
        return _NEW_TUPLE(Decoded, (self.sources[index], self.events[index]))

    def __iter__(self) -> Iterator[Decoded]:
        """Each record as its `Decoded`, in order."""
        return map(_NEW_TUPLE, repeat(Decoded), zip(self.sources, self.events, strict=True))

    def __eq__(self, other: object) -> bool:
        """As a list of `Decoded` is equal to a list or an `Admitted` of the same pairs."""
        if isinstance(other, (list, Admitted)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable columns, as a list's

    def __repr__(self) -> str:
        """As the list of `Decoded` it stands for."""
        return f"Admitted({list(self)!r})"


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
        return _unforeseen(record, exc)


def _unforeseen(record: RawRecord, exc: Exception) -> DeadLetter:
    """The dead letter of a record whose check raised (`check` never does)."""
    return dead_letter(record, f"decode: {type(exc).__name__}: {exc}")


def _check(record: RawRecord, role: TopicRole) -> Decoded | DeadLetter:
    """`check`'s work (it catches what this did not foresee).

    Written for the common record (one event, its run's key, within its broker time): the
    record's fields are read once, types are compared exactly (`_CARRIED`), and the
    `Decoded` is made without its Python-level ``__new__`` (~0.2 us a record).
    """
    value = record.value
    if value is None:
        return dead_letter(record, "empty record value (tombstone) on a non-compacted topic")
    try:
        event = decode(value)
    except DecodeError as exc:
        return dead_letter(record, exc.reason)
    return _admit(record, event, role)


def _admit(record: RawRecord, event: AnyEvent, role: TopicRole) -> Decoded | DeadLetter:
    """`_check` of a record whose value decoded to ``event``: does it belong on its topic?"""
    topic, partition, offset, key, _, stamp_ms = record
    kind = type(event)
    if kind not in _CARRIED[role]:  # decode gives exact types (`_CARRIED`)
        names = ", ".join(t.__name__ for t in ROLES[role].carries)
        return dead_letter(record, f"{kind.__name__} does not belong on a {role} topic ({names})")
    if type(event) is EventPack and not _PACKED[role].issuperset(map(type, event.events)):
        return _foreign_in_pack(record, role, event)
    run_id = event.run_id
    expected_key = TICK_RUN_ID if kind is Tick else run_id
    if key is None or key != expected_key.encode():
        key = key if key is None else key[:MAX_ID_CHARS]
        return dead_letter(record, f"record key {key!r} is not the run id {expected_key!r}")
    if not run_id:
        return dead_letter(record, "empty run_id")
    if (
        stamp_ms > 0
        and role in _BROKER_TIME
        and (
            kind is Tick
            or kind is EventPack
            or event.ts_ns > stamp_ms * 1_000_000 + MAX_FUTURE_SKEW_NS
        )
    ):
        bounded = _bound_time(record, event)
        if type(bounded) is DeadLetter:
            return bounded
        event = bounded
    source = Provenance(topic=topic, partition=partition, offset=offset)
    return _NEW_TUPLE(Decoded, (source, event))


def _foreign_in_pack(record: RawRecord, role: TopicRole, pack: EventPack) -> DeadLetter:
    """The dead letter of a pack holding an event its topic does not take (the first)."""
    packable = ROLES[role].packs
    names = ", ".join(t.__name__ for t in packable)
    index, inner = next((i, e) for i, e in enumerate(pack.events) if type(e) not in packable)
    return dead_letter(
        record,
        f"event {index} of a pack is a {type(inner).__name__}, which does not belong on a "
        f"{role} topic (packs there hold {names})",
    )


def _bound_time(record: RawRecord, event: AnyEvent) -> AnyEvent | DeadLetter:
    """``event`` with its time bounded by the record's broker timestamp (module docstring).

    Rules, in order:
        1. A Tick later than the broker's stamp is clamped to it.
        2. An event, or a pack with an event, dated more than `MAX_FUTURE_SKEW_NS` past
           the stamp is a dead letter (``future_ts``).
        3. Anything else is kept as it is.
    """
    broker_ns = record.timestamp_ms * 1_000_000
    if type(event) is Tick:  # exact types (`_CARRIED`); isinstance is 3x slower on a Struct
        if event.ts_ns > broker_ns:
            return msgspec.structs.replace(event, ts_ns=broker_ns)
        return event
    latest = event.ts_ns
    if type(event) is EventPack:
        latest = max(latest, max(map(_TS_NS, event.events)))
    if latest > broker_ns + MAX_FUTURE_SKEW_NS:
        ahead_s = (latest - broker_ns) / 1e9
        return dead_letter(
            record,
            f"{FUTURE_TS}: ts_ns {latest} is {ahead_s:.1f} s past the record's broker time "
            f"{broker_ns} (bound {MAX_FUTURE_SKEW_NS / 1e9:.0f} s)",
        )
    return event


def split(records: Iterable[RawRecord], role: TopicRole) -> tuple[Admitted, list[DeadLetter]]:
    """Decode a batch: the good records in order (as columns), and the dead letters.

    Exactly `check` of each record, in chunks of `SPLIT_CHUNK` records: a chunk of small
    events decodes in one C loop (`schemas.codec.decode_many`), and when every
    event of it is a plain one that belongs on the topic, under its run's key and within
    its broker time (`_admit_plain`), the chunk is admitted whole. A chunk that is not:
        1. one holding a few records that cannot go with the others (a pack, a Tick, a
           record too large to decode with others: `_odd_ones`) goes on in pieces, each
           such record on its own and the records between them as a chunk again
           (`_around`): a fleet's heartbeats hold the clock's Ticks and large runs' packs
           among loose heartbeats;
        2. otherwise (a record that fails a rule) every record of it goes through `check`
           one at a time, with the events already decoded where they were.
    """
    good = Admitted()
    dead: list[DeadLetter] = []
    batch = records if type(records) is list else list(records)
    for start in range(0, len(batch), SPLIT_CHUNK):
        chunk = batch[start : start + SPLIT_CHUNK]
        events = decode_many(list(map(_VALUE, chunk)))
        if events is not None and _admit_plain(chunk, events, role, good):
            continue
        odd = _odd_ones(chunk, events, role)
        if odd and len(odd) < len(chunk):  # 1
            _around(chunk, events, odd, role, good, dead)
        else:  # 2
            _one_by_one(chunk, events, role, good, dead)
    return good, dead


def _odd_ones(chunk: list[RawRecord], events: list[AnyEvent] | None, role: TopicRole) -> list[int]:
    """Where ``chunk`` holds records a chunk cannot be admitted whole with.

    Decoded (``events``): those whose event is not a plain one of the topic (a pack, a
    Tick, a type the topic does not carry). Not decoded: those `decode_many` cannot take
    with others (no value, or one larger than `schemas.codec.MANY_MAX_RECORD_BYTES`).
    """
    if events is not None:
        plain = _PLAIN[role]
        return [i for i, event in enumerate(events) if type(event) not in plain]
    return [
        i
        for i, record in enumerate(chunk)
        if record.value is None or len(record.value) > MANY_MAX_RECORD_BYTES
    ]


def _around(
    chunk: list[RawRecord],
    events: list[AnyEvent] | None,
    odd: list[int],
    role: TopicRole,
    good: Admitted,
    dead: list[DeadLetter],
) -> None:
    """`split` of ``chunk`` in pieces, in order: each ``odd`` record alone.

    The records between two odd ones are a chunk of their own: decoded at once if they
    were not, admitted whole if they can be, else one at a time.
    """
    start = 0
    for end in [*odd, len(chunk)]:
        if end > start:
            piece = chunk[start:end]
            done = events[start:end] if events is not None else None
            if done is None:
                done = decode_many(list(map(_VALUE, piece)))
            if done is None or not _admit_plain(piece, done, role, good):
                _one_by_one(piece, done, role, good, dead)
        if end < len(chunk):
            alone = None if events is None else events[end : end + 1]
            _one_by_one(chunk[end : end + 1], alone, role, good, dead)
        start = end + 1


def _one_by_one(
    chunk: list[RawRecord],
    events: list[AnyEvent] | None,
    role: TopicRole,
    good: Admitted,
    dead: list[DeadLetter],
) -> None:
    """`check` of each record of ``chunk`` (its event already decoded, where it was)."""
    for index, record in enumerate(chunk):
        try:  # `check`, inline: one call a record fewer
            out = _check(record, role) if events is None else _admit(record, events[index], role)
        except Exception as exc:
            out = _unforeseen(record, exc)
        if type(out) is Decoded:  # exact: `_admit` makes them; isinstance is ~3x slower
            good.sources.append(out.source)
            good.events.append(out.event)
        else:
            dead.append(out)  # type: ignore[arg-type]


def _admit_plain(
    chunk: list[RawRecord], events: list[AnyEvent], role: TopicRole, good: Admitted
) -> bool:
    """Append the chunk's records to ``good`` if `_admit` admits every one as it is.

    Holds (each over the whole chunk, in C loops) what `_admit` asks of a plain event:
    its type is carried on the topic and is neither a Tick nor a pack (`_PLAIN`), its
    record's key is its run id, the run id is not empty, and, on a role the broker's
    clock bounds, every record has a stamp and the latest event is within
    `MAX_FUTURE_SKEW_NS` of the earliest stamp (which implies it of each record). False
    (nothing appended) when any of it fails, or raises (a record of fields of the wrong
    types, which `check` makes a dead letter): `_admit` then decides record by record.
    """
    try:
        admitted = _plain_chunk(chunk, events, role)
    except Exception:
        return False
    if admitted is None:
        return False
    good.sources.extend(admitted)
    good.events.extend(events)
    return True


def _plain_chunk(
    chunk: list[RawRecord], events: list[AnyEvent], role: TopicRole
) -> list[Provenance] | None:
    """`_admit_plain`'s rules: the chunk's positions (its events go in as they are), or None."""
    if not _PLAIN[role].issuperset(map(type, events)):
        return None
    topics, partitions, offsets, keys, _, stamps = zip(*chunk, strict=True)
    run_ids = list(map(_RUN_ID, events))
    if "" in run_ids or not all(map(operator.eq, keys, map(str.encode, run_ids))):
        return None
    if role in _BROKER_TIME:
        earliest_ms = min(stamps)
        if earliest_ms <= 0:
            return None
        if max(map(_TS_NS, events)) > earliest_ms * 1_000_000 + MAX_FUTURE_SKEW_NS:
            return None
    return [
        Provenance(topic=t, partition=p, offset=o)
        for t, p, o in zip(topics, partitions, offsets, strict=True)
    ]
