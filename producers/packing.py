"""Packing for the emitter's delivery thread: many hot events of the run in one record.

Opt-in (`PackPolicy`; off by default, so today's one-event-per-record wire format stays
the default). With it on, the delivery thread hands every event it takes from the buffer
to a `Packer` instead of straight to the producer. A packable event (a ``Heartbeat`` or a
``StepCompleted`` bound for its one topic, as ``heartbeat()`` and ``step()`` queue them)
joins the open pack of its topic; a pack closes when it holds ``max_events`` events, when
the next event would take it past ``max_bytes``, when ``linger_s`` has passed since its
first event, when the emitter flushes or closes, and when any other event comes (a run
marker, a checkpoint: it must follow the events queued before it on its topics, so every
open pack goes out first). A closed pack of one event goes out as that event, unpacked.

A closed pack is one `schemas.events.EventPack` record, built by
`schemas.codec.encode_pack` from the events encoded once each; it is delivered, or fails,
as a whole, and settles all of its events in the buffer at once, so the emitter's counts
stay counts of events. Order within a topic is the order the events were queued.

The price is latency: an event waits up to ``linger_s`` in an open pack (a hang or a
dead rank is seen that much later). A lone `RunEmitter` packs only what it emits within
one linger (its own heartbeats and steps); a node agent packs its ranks'.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Final

import msgspec

from runwatch.schemas.codec import encode, encode_pack
from runwatch.schemas.events import MAX_PACK_EVENTS, Event, Heartbeat, StepCompleted

QueuedEvent = tuple[tuple[str, ...], bytes, "bytes | Event"]
"""What the emitter's buffer holds (as `producers.delivery.QueuedEvent`)."""

PACK_MAX_BYTES: Final = 512 * 1024
"""The default cap on a pack record's size: half of Kafka's default 1 MiB message limit
(``max.message.bytes``) and of kafka-python's ``max_request_size``."""
PACK_ENVELOPE_BYTES: Final = 72
"""A pack record's bytes besides its run id and its events (tag, field names, a 19-digit
time, brackets; the commas between events are counted with them)."""


@dataclass(frozen=True, slots=True)
class PackPolicy:
    """What the emitter packs, and when a pack closes.

    Attributes:
        heartbeats: Pack heartbeats (on the heartbeats topic).
        steps: Pack steps (on the steps topic).
        max_events: Most events per pack (2 to `schemas.events.MAX_PACK_EVENTS`).
        max_bytes: Most bytes per pack record (at least 4 KiB).
        linger_s: Longest an event waits in an open pack (0 < linger_s <= 60).
    """

    heartbeats: bool = False
    steps: bool = False
    max_events: int = 512
    max_bytes: int = PACK_MAX_BYTES
    linger_s: float = 0.1

    def __post_init__(self) -> None:
        """Check the bounds.

        Raises:
            ValueError: A bound outside its range.
        """
        if not 2 <= self.max_events <= MAX_PACK_EVENTS:
            raise ValueError(f"pack_max_events must be 2..{MAX_PACK_EVENTS}, got {self.max_events}")
        if self.max_bytes < 4096:
            raise ValueError(f"pack_max_bytes must be >= 4096, got {self.max_bytes}")
        if not 0.0 < self.linger_s <= 60.0:
            raise ValueError(f"pack_linger_ms must be in (0, 60000], got {self.linger_s * 1e3}")

    @property
    def enabled(self) -> bool:
        """True when anything is packed."""
        return self.heartbeats or self.steps


def encode_json_str(text: str) -> bytes:
    """``text`` as a JSON string (quoted and escaped), as a pack record holds its run id."""
    return msgspec.json.encode(text)


class Outgoing:
    """One record to hand to the producer, and how many events it settles."""

    __slots__ = ("count", "item")

    def __init__(self, item: QueuedEvent, count: int = 1) -> None:
        self.item = item
        self.count = count


class _OpenPack:
    __slots__ = ("bytes", "due", "events", "key", "run_id", "topic", "ts_ns")

    def __init__(self, topic: str, key: bytes, run_id: str, due: float) -> None:
        self.topic = topic
        self.key = key
        self.run_id = run_id
        self.due = due
        self.events: list[bytes] = []
        self.bytes = PACK_ENVELOPE_BYTES + len(encode_json_str(run_id))
        self.ts_ns = 0


class Packer:
    """Turns the buffer's events into records, packing the ones `PackPolicy` names.

    Used by the delivery thread only (not thread-safe). Records come out of `next` in the
    order their events went in, per topic.
    """

    def __init__(self, policy: PackPolicy, heartbeat_topic: str, step_topic: str) -> None:
        """Pack according to ``policy``.

        Args:
            policy: What to pack and when a pack closes.
            heartbeat_topic: The heartbeats topic (where heartbeats are packed).
            step_topic: The steps topic (where steps are packed).
        """
        self.policy = policy
        self._packable: dict[type, tuple[str, ...]] = {}
        if policy.heartbeats:
            self._packable[Heartbeat] = (heartbeat_topic,)
        if policy.steps:
            self._packable[StepCompleted] = (step_topic,)
        self._open: dict[str, _OpenPack] = {}
        self._out: deque[Outgoing] = deque()
        self.packs = 0
        """Pack records closed so far (packs of one, sent unpacked, not counted)."""

    @property
    def holding(self) -> int:
        """Events held in open packs or closed records not yet taken."""
        return sum(len(p.events) for p in self._open.values()) + sum(o.count for o in self._out)

    @property
    def open_events(self) -> int:
        """Events in open packs."""
        return sum(len(p.events) for p in self._open.values())

    def offer(self, item: QueuedEvent, now: float | None = None) -> None:
        """Take one event from the buffer (records come out of `next`).

        Args:
            item: The buffer's ``(topics, key, payload)``.
            now: ``time.monotonic()`` (read when None).
        """
        topics, key, payload = item
        if type(payload) is bytes or self._packable.get(type(payload)) != topics:
            self._pass(item)
            return
        assert not isinstance(payload, bytes)
        try:
            data = encode(payload)
        except Exception:  # the plain path reports it
            self._pass(item)
            return
        topic = topics[0]
        pack = self._open.get(topic)
        if pack is not None and (
            pack.key != key or pack.bytes + len(data) + 1 > self.policy.max_bytes
        ):
            self._close(topic)
            pack = None
        if pack is None:
            now = time.monotonic() if now is None else now
            pack = self._open[topic] = _OpenPack(
                topic, key, payload.run_id, now + self.policy.linger_s
            )
        pack.events.append(data)
        pack.bytes += len(data) + 1
        pack.ts_ns = max(pack.ts_ns, payload.ts_ns)
        if len(pack.events) >= self.policy.max_events:
            self._close(topic)

    def next(self) -> Outgoing | None:
        """The oldest closed record, or None."""
        return self._out.popleft() if self._out else None

    def close_due(self, now: float | None = None) -> None:
        """Close the packs whose linger has passed."""
        now = time.monotonic() if now is None else now
        for topic in [t for t, p in self._open.items() if p.due <= now]:
            self._close(topic)

    def close_all(self) -> None:
        """Close every open pack (to flush, to close, or before an unpacked event)."""
        for topic in list(self._open):
            self._close(topic)

    def next_due(self) -> float | None:
        """When the oldest open pack's linger passes (``time.monotonic()``), None if none."""
        return min((p.due for p in self._open.values()), default=None)

    def _pass(self, item: QueuedEvent) -> None:
        """Queue an event unpacked, after the open packs of its topics (their order)."""
        for topic in item[0]:
            if topic in self._open:
                self._close(topic)
        self._out.append(Outgoing(item))

    def _close(self, topic: str) -> None:
        pack = self._open.pop(topic)
        if len(pack.events) == 1:
            value = pack.events[0]
        else:
            value = encode_pack(pack.run_id, pack.ts_ns, pack.events)
            self.packs += 1
        self._out.append(Outgoing(((topic,), pack.key, value), len(pack.events)))


__all__ = ["PACK_MAX_BYTES", "Outgoing", "PackPolicy", "Packer"]
