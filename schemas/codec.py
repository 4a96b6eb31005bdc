"""The wire codec: JSON that any Kafka client can read, with non-finite floats kept exact.

JSON has no NaN or infinity, and msgspec writes them as ``null``; a NaN loss is the one
event runwatch must never lose, so non-finite floats travel as the strings ``"NaN"``,
``"Infinity"`` and ``"-Infinity"`` (the spelling of Jackson, Gson and ECMAScript's
``Number()``). The decoder turns them back into floats in float-typed fields only, and also
reads ``null`` in a required float field as NaN, which is what msgspec and JavaScript's
``JSON.stringify`` write for NaN.

Encoding takes one msgspec call on the common path; only events that hold a non-finite
float (detected by a ``null`` in the output, since fields holding their default are
omitted) take a slower path through builtins.

Decoding never raises anything but `DecodeError`, whatever the bytes. Before any parse it
bounds the record's size (`schemas.events.MAX_RECORD_BYTES`) and its nesting depth
(`schemas.events.MAX_NESTING`): msgspec recurses into nested arrays and objects, even
into an unknown field it only skips, so a 100,000-deep array would otherwise end in a
`RecursionError`. A small record counts its brackets first (C-speed scans); a larger one,
or one with more brackets than the bound, takes the exact depth (C-speed passes, one per
level of nesting, linear once that is past any valid depth). The field bounds themselves
(int64, non-negative steps, lengths) are on the structs in `schemas.events`.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Iterator, Sequence
from functools import cache
from itertools import accumulate, count
from typing import Any, Final

import msgspec

from runwatch.schemas.events import (
    ALL_TYPES,
    MAX_NESTING,
    MAX_PACK_EVENTS,
    MAX_RECORD_BYTES,
    PACKABLE_TYPES,
    AnyEvent,
    Event,
    EventPack,
)

NONFINITE_TOKENS: Final[dict[str, float]] = {
    "NaN": math.nan,
    "Infinity": math.inf,
    "-Infinity": -math.inf,
}
KNOWN_TAGS: Final[frozenset[str]] = frozenset(
    str(msgspec.inspect.type_info(t).tag)  # type: ignore[attr-defined]
    for t in ALL_TYPES
)
PACK_TAG: Final[str] = str(msgspec.inspect.type_info(EventPack).tag)  # type: ignore[attr-defined]
PACKABLE_TAGS: Final[frozenset[str]] = frozenset(
    str(msgspec.inspect.type_info(t).tag)  # type: ignore[attr-defined]
    for t in PACKABLE_TYPES
)


class DecodeError(ValueError):
    """Bytes that are not a valid runwatch event; ``reason`` says why in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class MalformedEvent(DecodeError):
    """Not JSON, not an object, or a field of the wrong type or missing."""


class UnknownEventType(DecodeError):
    """Valid JSON with a ``type`` tag this decoder does not know (a newer producer?)."""

    def __init__(self, tag: str) -> None:
        super().__init__(f"unknown event type {tag!r}")
        self.tag = tag


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(AnyEvent)
_RAW_DECODER: Final = msgspec.json.Decoder()


def _nonfinite_to_token(value: Any) -> Any:
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, dict):
        return {k: _nonfinite_to_token(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):  # to_builtins keeps tuples (a pack's events)
        return [_nonfinite_to_token(v) for v in value]
    return value


def encode(event: Event) -> bytes:
    """Encode an event as UTF-8 JSON, keeping NaN and infinities exact.

    Args:
        event: Any runwatch event.

    Returns:
        The JSON bytes, with the tag in the ``type`` field.
    """
    raw = _ENCODER.encode(event)
    if b"null" not in raw:
        return raw
    return _ENCODER.encode(_nonfinite_to_token(msgspec.to_builtins(event)))


def encode_pack(run_id: str, ts_ns: int, events: list[bytes]) -> bytes:
    """The record of an `EventPack` from its events, each already encoded by `encode`.

    Byte for byte what ``encode(EventPack(run_id=..., ts_ns=..., events=...))`` writes (a
    test holds it to that), without decoding and re-encoding the events: a packer that
    encodes each event once to bound the record's size then only joins the bytes. The
    caller guarantees what `EventPack` checks (1 to `MAX_PACK_EVENTS` packable events,
    all of ``run_id``); the decoder checks it again.

    Args:
        run_id: The run of every event.
        ts_ns: The pack's time (the newest event's, by convention).
        events: The encoded events, in order.

    Returns:
        The record value.

    Raises:
        ValueError: No events, or more than `MAX_PACK_EVENTS`.
    """
    if not 1 <= len(events) <= MAX_PACK_EVENTS:
        raise ValueError(f"a pack holds 1 to {MAX_PACK_EVENTS} events, got {len(events)}")
    head = b'{"type":"%s","run_id":%s,"ts_ns":%d,"events":[' % (
        PACK_TAG.encode(),
        _ENCODER.encode(run_id),
        ts_ns,
    )
    return head + b",".join(events) + b"]}"


def encode_key(run_id: str) -> bytes:
    """The Kafka record key of a run's events."""
    return run_id.encode()


@cache
def _float_fields(tag: str) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """(float fields, required float fields, dict-of-float fields) of the struct with ``tag``."""
    info = next(
        msgspec.inspect.type_info(t)
        for t in ALL_TYPES
        if msgspec.inspect.type_info(t).tag == tag  # type: ignore[attr-defined]
    )
    floats: set[str] = set()
    required: set[str] = set()
    dicts: set[str] = set()
    for field in info.fields:  # type: ignore[attr-defined]
        ftype = field.type
        members = ftype.types if isinstance(ftype, msgspec.inspect.UnionType) else (ftype,)
        if any(isinstance(m, msgspec.inspect.FloatType) for m in members):
            floats.add(field.encode_name)
            if field.required:
                required.add(field.encode_name)
        if any(
            isinstance(m, msgspec.inspect.DictType)
            and isinstance(m.value_type, msgspec.inspect.FloatType)
            for m in members
        ):
            dicts.add(field.encode_name)
    return frozenset(floats), frozenset(required), frozenset(dicts)


def _restore_float(value: Any, *, null_is_nan: bool) -> Any:
    if isinstance(value, str) and value in NONFINITE_TOKENS:
        return NONFINITE_TOKENS[value]
    if value is None and null_is_nan:
        return math.nan
    return value


_JSON_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_NOT_MARKS: Final = bytes(b for b in range(256) if b not in b'[]{}"')
_DEPTH_STEP: Final = bytes(2 if b in b"[{" else 0 if b in b"]}" else 1 for b in range(256))
"""An opening bracket as 2, a closing one as 0: the running sum less the count is the depth."""
_PAIRS: Final = bytes(ord("<") if b in b"[{" else ord(">") if b in b"]}" else b for b in range(256))
_COUNT_BRACKETS_BYTES: Final = 1024
"""Records up to this size count their brackets first (two scans, cheaper than the depth
when that count cannot exceed the bound); larger ones, packs, go to the depth at once."""
MANY_MAX_RECORD_BYTES: Final = _COUNT_BRACKETS_BYTES
"""The largest record `decode_many` decodes with others (a larger one, a pack of many
events, makes it decline the whole batch: decode it on its own)."""
_NOT_OPENING: Final = bytes(b for b in range(256) if b not in b"[{")
"""Every byte but the opening brackets: `_opening_brackets` deletes them in one C scan."""
_FIRST_BYTE: Final = operator.itemgetter(0)
_OPEN_BRACE: Final = b"{"
_PEEL_PASSES: Final = 64
"""Most passes `_peeled_depth` makes before the linear scan takes over (hostile depths)."""


def _opening_brackets(data: bytes) -> int:
    """How many ``[`` and ``{`` ``data`` holds (strings included): a bound on its depth."""
    return len(data.translate(None, _NOT_OPENING))


def nesting_depth(data: bytes) -> int:
    """How deep arrays and objects nest in JSON ``data`` (brackets in strings ignored).

    Exact for valid JSON. For broken JSON it never counts less than a parser nests
    before it fails (brackets after an unterminated string are inside that string for
    the parser too), and may count more, which only rejects bytes that would not decode
    anyway. C-speed throughout (a pack of thousands of events pays it on every decode):
    without a backslash in the record, strings are exactly what lies between two quotes,
    so only the quotes and brackets are kept, and two adjacent quotes, which enclose no
    bracket, are dropped as a pair (which keeps every bracket's side of the string
    boundaries). What is left is a few bytes: usually brackets alone.
    """
    if b"\\" in data:
        brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    else:
        marks = data.translate(None, _NOT_MARKS).replace(b'""', b"")
        brackets = b"".join(marks.split(b'"')[::2]) if b'"' in marks else marks
    if not brackets:
        return 0
    peeled = _peeled_depth(brackets)
    if peeled is not None:
        return peeled
    depths: Iterator[int] = map(operator.sub, accumulate(brackets.translate(_DEPTH_STEP)), count(1))
    return max(0, max(depths))


def _peeled_depth(brackets: bytes) -> int | None:
    """The depth of balanced ``brackets`` by peeling innermost pairs, a C pass a level.

    Returns:
        None when they are not balanced, or nest deeper than `_PEEL_PASSES`.
    """
    marks = brackets.translate(_PAIRS)
    for depth in range(1, _PEEL_PASSES + 1):
        inner = marks.replace(b"<>", b"")
        if not inner:
            return depth
        if len(inner) == len(marks):
            return None  # a close before its open, or an open never closed
        marks = inner
    return None


def _check_bounds(data: bytes) -> None:
    if len(data) > MAX_RECORD_BYTES:
        raise MalformedEvent(f"record of {len(data)} bytes exceeds {MAX_RECORD_BYTES} bytes")
    if len(data) <= _COUNT_BRACKETS_BYTES and _opening_brackets(data) <= MAX_NESTING:
        return  # cannot nest deeper than it has brackets
    depth = nesting_depth(data)
    if depth > MAX_NESTING:
        raise MalformedEvent(f"JSON nested {depth} deep exceeds {MAX_NESTING}")


def _restore_floats(obj: dict[str, Any], tag: str) -> None:
    floats, required, dicts = _float_fields(tag)
    for name in floats & obj.keys():
        obj[name] = _restore_float(obj[name], null_is_nan=name in required)
    for name in dicts & obj.keys():
        if isinstance(obj[name], dict):
            obj[name] = {k: _restore_float(v, null_is_nan=True) for k, v in obj[name].items()}


def _restore_pack(obj: dict[str, Any]) -> None:
    """Restore the non-finite floats of a pack's events; name a nested or foreign one."""
    events = obj.get("events")
    if not isinstance(events, list):
        return  # msgspec reports the wrong type
    for index, inner in enumerate(events):
        tag = inner.get("type") if isinstance(inner, dict) else None
        if not isinstance(tag, str):
            continue  # msgspec reports it, with its path
        if tag not in PACKABLE_TAGS:
            what = "packs do not nest" if tag == PACK_TAG else "not a packable event"
            raise MalformedEvent(
                f"event {index} of a pack is {tag!r} ({what}; a pack holds "
                f"{', '.join(sorted(PACKABLE_TAGS))})"
            )
        _restore_floats(inner, tag)


def _decode_lenient(data: bytes) -> AnyEvent:
    obj = _RAW_DECODER.decode(data)
    if not isinstance(obj, dict):
        raise MalformedEvent(f"expected a JSON object, got {type(obj).__name__}")
    tag = obj.get("type")
    if not isinstance(tag, str):
        raise MalformedEvent("missing or non-string `type` tag")
    if tag not in KNOWN_TAGS:
        raise UnknownEventType(tag)
    _restore_floats(obj, tag)
    if tag == PACK_TAG:
        _restore_pack(obj)
    try:
        event: AnyEvent = msgspec.convert(obj, AnyEvent)
    except msgspec.ValidationError as exc:
        raise MalformedEvent(str(exc)) from None
    return event


def decode(data: bytes) -> AnyEvent:
    """Decode one event.

    Args:
        data: The record value.

    Returns:
        The event, as the struct its tag names.

    Raises:
        UnknownEventType: The tag is not one this version knows.
        MalformedEvent: Anything else that is wrong, with the reason (too large or too
            deeply nested, not JSON, a field missing, of the wrong type or out of bounds).
    """
    try:  # the common record, in one call: small, shallow, finite (`_check_bounds`)
        if len(data) <= _COUNT_BRACKETS_BYTES and _opening_brackets(data) <= MAX_NESTING:
            return _DECODER.decode(data)
    except Exception:
        pass  # the full path below decodes it again and names what is wrong
    return _decode_checked(data)


def decode_many(values: Sequence[bytes]) -> list[AnyEvent] | None:
    """Decode small records at once, each by `decode`'s first try; None when one needs `decode`.

    Each record is decoded on its own, by the same typed decoder as `decode`'s first try,
    in one C loop (``map``): so each event is the one `decode` gives for its record,
    whatever the bytes of the records around it. None (decode them one by one) unless:

    1. every record starts with ``{``, is at most `MANY_MAX_RECORD_BYTES` long, and has at
       most `MAX_NESTING` opening brackets, as `decode`'s first try asks (counted once over
       the whole chunk first: no more opening brackets than records means one each, the
       flat events of the hot topics), so the depth bound holds before any parse;
    2. every record decodes strictly (a non-finite float's token, an unknown tag, a bad
       field, two values in one record: `decode`'s full path names each).

    (An earlier version joined the records as lines for one ``decode_lines`` call; a
    value may span lines, so records written to be read across their boundaries gave
    events shifted onto their neighbours' records. Decoding record by record in a C loop
    costs no more: docs/processors.md, "a chunk decoded record by record".)

    Args:
        values: The records' values.

    Returns:
        The events, one per record in order, or None.
    """
    try:
        if bytes(map(_FIRST_BYTE, values)) != _OPEN_BRACE * len(values):
            return None
        if max(map(len, values), default=0) > MANY_MAX_RECORD_BYTES:
            return None
        if (  # more than one each: one is nested, so bound each
            _opening_brackets(b"".join(values)) > len(values)
            and max(map(_opening_brackets, values)) > MAX_NESTING
        ):
            return None
        return list(map(_DECODER.decode, values))
    except Exception:
        return None


def _decode_checked(data: bytes) -> AnyEvent:
    """`decode`'s full path: bounds first, then strict, then lenient (non-finite floats)."""
    try:
        _check_bounds(data)
        try:
            return _DECODER.decode(data)
        except msgspec.ValidationError:
            return _decode_lenient(data)
    except DecodeError:
        raise
    except msgspec.DecodeError as exc:
        raise MalformedEvent(f"not JSON: {exc}") from None
    except Exception as exc:  # never anything but a DecodeError, whatever the bytes
        raise MalformedEvent(f"undecodable: {type(exc).__name__}: {exc}") from None


__all__ = [
    "KNOWN_TAGS",
    "NONFINITE_TOKENS",
    "PACKABLE_TAGS",
    "PACK_TAG",
    "DecodeError",
    "MalformedEvent",
    "UnknownEventType",
    "decode",
    "decode_many",
    "encode",
    "encode_key",
    "encode_pack",
    "nesting_depth",
]
