"""The frames ranks and their node agent's relay exchange over a Unix socket.

Every frame is a 4-byte big-endian body length, then the body; the body's first byte is
the frame's kind:

* ``H`` hello (rank -> relay, first frame): msgspec JSON ``{"v": 1, "run_id", "rank",
  "pid"}``, so the relay can name the rank in its log.
* ``E`` event (rank -> relay): ``>QHH`` sequence number, topic length, key length, then
  the topic (UTF-8), the key and the record value. One frame per Kafka record the rank's
  delivery thread would have sent; the sequence number is the rank's own, per connection.
* ``F`` flush (rank -> relay): close this rank's runs' open packs now (a `flush` or
  `close` is waiting for acks).
* ``A`` ack (relay -> rank): ``>Q`` sequence number; Kafka acknowledged the record (or
  the pack) that carried the event.
* ``N`` nack (relay -> rank): ``>Q`` sequence number, then the reason (UTF-8); the event
  failed.

`FrameReader` turns a byte stream back into frames, whatever the chunking; a frame
longer than `MAX_FRAME_BYTES` or of an unknown kind is a `FrameError` (the connection is
closed: a peer that sends one speaks another protocol).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import msgspec

MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
"""The largest frame body accepted (Kafka's records are far smaller)."""
WIRE_VERSION: Final = 1

HELLO: Final = b"H"
EVENT: Final = b"E"
FLUSH: Final = b"F"
ACK: Final = b"A"
NACK: Final = b"N"
KINDS: Final = frozenset({HELLO, EVENT, FLUSH, ACK, NACK})

_LEN = struct.Struct(">I")
_EVENT = struct.Struct(">QHH")
_SEQ = struct.Struct(">Q")


class FrameError(ValueError):
    """A byte stream that is not a sequence of relay frames."""


class Hello(msgspec.Struct, frozen=True):
    """Who is on the other end of a connection.

    Attributes:
        v: The wire version (`WIRE_VERSION`).
        run_id: The rank's run.
        rank: The rank.
        pid: The rank's process id.
    """

    v: int
    run_id: str
    rank: int
    pid: int


@dataclass(frozen=True, slots=True)
class EventFrame:
    """One record a rank hands to the relay.

    Attributes:
        seq: The rank's sequence number of the frame (acked by it).
        topic: The Kafka topic.
        key: The record key (the run id).
        value: The record value (an encoded event, or a pack).
    """

    seq: int
    topic: str
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class Outcome:
    """The relay's answer for one event frame.

    Attributes:
        seq: The event frame's sequence number.
        ok: Kafka acknowledged it.
        reason: Why it failed ("" when ok).
    """

    seq: int
    ok: bool
    reason: str = ""


Frame = Hello | EventFrame | Outcome | None
"""A decoded frame; None is a flush request."""


def _frame(body: bytes) -> bytes:
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return _LEN.pack(len(body)) + body


def encode_hello(run_id: str, rank: int, pid: int) -> bytes:
    """A hello frame."""
    return _frame(HELLO + msgspec.json.encode(Hello(WIRE_VERSION, run_id, rank, pid)))


def encode_event(seq: int, topic: str, key: bytes, value: bytes) -> bytes:
    """An event frame.

    Raises:
        FrameError: A topic or key over 65535 bytes, or a frame over `MAX_FRAME_BYTES`.
    """
    raw_topic = topic.encode()
    if len(raw_topic) > 0xFFFF or len(key) > 0xFFFF:
        raise FrameError("topic and key must be at most 65535 bytes")
    return _frame(EVENT + _EVENT.pack(seq, len(raw_topic), len(key)) + raw_topic + key + value)


def encode_flush() -> bytes:
    """A flush frame."""
    return _frame(FLUSH)


def encode_outcome(outcome: Outcome) -> bytes:
    """An ack or nack frame."""
    if outcome.ok:
        return _frame(ACK + _SEQ.pack(outcome.seq))
    return _frame(NACK + _SEQ.pack(outcome.seq) + outcome.reason.encode()[:4096])


def decode_body(body: bytes) -> Frame:
    """One frame's body back as its frame.

    Raises:
        FrameError: An unknown kind or a malformed body.
    """
    kind, rest = body[:1], body[1:]
    try:
        if kind == EVENT:
            seq, topic_len, key_len = _EVENT.unpack_from(rest)
            start = _EVENT.size
            if start + topic_len + key_len > len(rest):
                raise FrameError("event frame shorter than its topic and key")
            topic = rest[start : start + topic_len].decode()
            key = rest[start + topic_len : start + topic_len + key_len]
            return EventFrame(seq, topic, key, rest[start + topic_len + key_len :])
        if kind == ACK:
            return Outcome(_SEQ.unpack(rest)[0], True)
        if kind == NACK:
            return Outcome(
                _SEQ.unpack_from(rest)[0], False, rest[_SEQ.size :].decode(errors="replace")
            )
        if kind == FLUSH:
            return None
        if kind == HELLO:
            return msgspec.json.decode(rest, type=Hello)
    except (struct.error, UnicodeDecodeError, msgspec.DecodeError) as exc:
        raise FrameError(f"malformed {kind!r} frame: {exc}") from None
    raise FrameError(f"unknown frame kind {kind!r}")


class FrameReader:
    """Reassembles frames from the chunks a socket returns."""

    def __init__(self) -> None:
        """Start with nothing buffered."""
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        """Add ``data``; return the frames now complete, in order.

        Raises:
            FrameError: A frame too long, of an unknown kind or malformed.
        """
        self._buf += data
        out: list[Frame] = []
        pos, buf = 0, self._buf
        while len(buf) - pos >= _LEN.size:
            (length,) = _LEN.unpack_from(buf, pos)
            if length > MAX_FRAME_BYTES:
                raise FrameError(f"frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
            if length < 1:
                raise FrameError("empty frame")
            end = pos + _LEN.size + length
            if end > len(buf):
                break
            out.append(decode_body(bytes(buf[pos + _LEN.size : end])))
            pos = end
        del buf[:pos]
        return out

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete frame held."""
        return len(self._buf)


__all__ = [
    "MAX_FRAME_BYTES",
    "WIRE_VERSION",
    "EventFrame",
    "Frame",
    "FrameError",
    "FrameReader",
    "Hello",
    "Outcome",
    "decode_body",
    "encode_event",
    "encode_flush",
    "encode_hello",
    "encode_outcome",
]
