"""The emitter's delivery thread: the only code that touches the Kafka producer.

It creates the producer itself (with retries and backoff, since creating a kafka-python
producer blocks while it looks for a broker), takes events from the `EventBuffer` in order
and hands them to the producer, and settles each event in the buffer when the broker has
acknowledged it (or the producer has given up). Training threads never wait for it.

An event routed to several topics counts once: it is delivered when every copy is
acknowledged and failed when any copy fails. With a `producers.packing.Packer`, events
go through it on their way to the producer, and a pack record settles all of its events.
Retriable trouble (no broker, no metadata for a topic yet) never loses an event: it stays
where it is until the broker answers or the emitter closes; the bounded buffer turns a
long outage into counted drops.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from runwatch.common.retry import Backoff, Retrying
from runwatch.producers.buffer import EventBuffer
from runwatch.producers.packing import Outgoing, Packer, QueuedEvent
from runwatch.producers.ratelimit import RateLimitedLog
from runwatch.schemas.codec import encode

logger = logging.getLogger(__name__)


class FutureLike(Protocol):
    """The part of kafka-python's ``FutureRecordMetadata`` the thread uses."""

    def add_callback(self, f: Callable[[Any], Any], *args: Any) -> Any:  # noqa: D102
        ...

    def add_errback(self, f: Callable[[BaseException], Any], *args: Any) -> Any:  # noqa: D102
        ...


class ProducerLike(Protocol):
    """The part of kafka-python's ``KafkaProducer`` the thread uses."""

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None) -> Any:  # noqa: D102
        ...

    def flush(self, timeout: float | None = None) -> None:  # noqa: D102
        ...

    def close(self, timeout: float | None = None) -> None:  # noqa: D102
        ...


ProducerFactory = Callable[..., ProducerLike]
"""Called with keyword arguments (kafka-python's producer configuration)."""


def describe(exc: BaseException) -> str:
    """``Type: message`` once, although kafka-python's messages often start with the type."""
    name, text = type(exc).__name__, str(exc)
    return text if text.startswith(name) else f"{name}: {text}" if text else name


class _MultiTopic:
    """Settles an event sent to several topics once every copy has an outcome."""

    __slots__ = ("_buffer", "_failed", "_lock", "_remaining")

    def __init__(self, buffer: EventBuffer[QueuedEvent], copies: int) -> None:
        self._buffer = buffer
        self._remaining = copies
        self._failed = False
        self._lock = threading.Lock()

    def done(self, copies: int = 1, *, failed: bool = False) -> None:
        with self._lock:
            self._remaining -= copies
            self._failed = self._failed or failed
            if self._remaining > 0:
                return
            failed = self._failed
        self._buffer.settle(delivered=0 if failed else 1, failed=1 if failed else 0)


class _Sending:
    """The record being handed to the producer, the events it settles, the copies sent."""

    __slots__ = ("count", "item", "sent", "tracker")

    def __init__(self, item: QueuedEvent, count: int = 1) -> None:
        self.item = item
        self.count = count
        self.sent = 0
        self.tracker: _MultiTopic | None = None


class DeliveryThread:
    """Owns the Kafka producer and moves events from the buffer to it.

    Attributes:
        connected: True once a producer has been created.
    """

    def __init__(
        self,
        buffer: EventBuffer[QueuedEvent],
        *,
        producer_factory: ProducerFactory,
        producer_config: Mapping[str, Any],
        name: str = "runwatch-emitter",
        backoff_min_s: float = 0.1,
        backoff_max_s: float = 2.0,
        idle_wait_s: float = 1.0,
        log: RateLimitedLog | None = None,
        on_connect: Callable[[], None] | None = None,
        packer: Packer | None = None,
        retriable: tuple[type[BaseException], ...] | None = None,
    ) -> None:
        """Prepare the thread; `start` runs it.

        Args:
            buffer: Where events come from and are settled.
            producer_factory: Creates the producer (``kafka.KafkaProducer`` or a fake).
            producer_config: Keyword arguments for ``producer_factory``.
            name: Thread name.
            backoff_min_s: First wait after a failed connection or a metadata timeout.
            backoff_max_s: Longest wait between attempts (also the longest delay between
                the broker coming back and the first delivery).
            idle_wait_s: Longest sleep with nothing to do (a safety net; pushes wake it).
            log: Rate-limited log for warnings; a fresh one when None.
            on_connect: Called (on the thread) after the producer is created.
            packer: Packs events into records on their way to the producer; None: one
                record per event.
            retriable: Exceptions of ``send`` that keep the record for a later retry;
                None: kafka-python's ``KafkaTimeoutError`` (no metadata for the topic
                yet). The node relay's producer passes its own, so a rank that talks to
                its agent never imports kafka-python.
        """
        if retriable is None:
            from kafka.errors import KafkaTimeoutError

            retriable = (KafkaTimeoutError,)
        self._retriable = retriable
        self._buffer = buffer
        self._factory = producer_factory
        self._config = dict(producer_config)
        self._retrying = Retrying(Backoff(backoff_min_s, backoff_max_s))
        self._idle_wait_s = idle_wait_s
        self._log = log or RateLimitedLog(logger)
        self._on_connect = on_connect
        self._packer = packer
        self._producer: ProducerLike | None = None
        self._wakeup = threading.Event()
        self._stop_deadline: float | None = None
        self._flush_deadline: float | None = None
        self._flush_target: int | None = None
        self._popped = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.connected = False

    # ------------------------------------------------------------------ control

    def start(self) -> None:
        """Start the thread (returns at once)."""
        self._thread.start()

    def request_flush(self, deadline: float, target: int | None = None) -> None:
        """Ask the thread to push everything out now (ignoring ``linger_ms``).

        Args:
            deadline: ``time.monotonic()`` value after which to stop waiting on the producer.
            target: The buffer's ``enqueued`` count the flush covers: open packs holding
                only later events stay open (None: close every open pack).
        """
        self._flush_target = target
        self._flush_deadline = deadline
        self._wakeup.set()
        self._buffer.wake()

    def stop(self, deadline: float) -> None:
        """Ask the thread to deliver what it can until ``deadline``, close the producer and end.

        Args:
            deadline: ``time.monotonic()`` value by which the thread should be done.
        """
        self._stop_deadline = deadline
        self._wakeup.set()
        self._buffer.wake()

    def join(self, timeout_s: float) -> bool:
        """Wait for the thread to end; True if it did."""
        self._thread.join(max(0.0, timeout_s))
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        """True while the thread runs."""
        return self._thread.is_alive()

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # pragma: no cover - a bug; never let it reach the trainer
            logger.exception("runwatch emitter delivery thread crashed; events stay buffered")
        finally:
            self._close_producer()

    def _stop_due(self) -> bool:
        return self._stop_deadline is not None and time.monotonic() >= self._stop_deadline

    def _sleep(self, seconds: float) -> None:
        self._wakeup.wait(seconds)
        self._wakeup.clear()

    def _loop(self) -> None:
        current: _Sending | None = None
        while True:
            if self._stop_due():
                return
            if self._producer is None:
                if (
                    self._stop_deadline is not None
                    and current is None
                    and not len(self._buffer)
                    and not (self._packer is not None and self._packer.holding)
                ):
                    return  # closing with nothing to deliver: no need to connect
                if not self._connect():
                    self._sleep(self._retrying.failed())
                    continue
                self._retrying.succeeded()
            while True:
                if current is None:
                    current = self._next()
                    if current is None:
                        break
                if not self._send(current):
                    break
                current = None
            if current is not None:  # retriable trouble: wait, then try the same event again
                self._sleep(self._retrying.failed())
                continue
            self._retrying.succeeded()
            if self._stop_deadline is not None:
                return  # everything is with the producer; closing it flushes
            if self._flush_deadline is not None:
                self._flush_producer()
                continue
            self._buffer.wait_for_items(self._wait_s())

    def _next(self) -> _Sending | None:
        """The next record to send: the buffer's next event, or what the packer closed."""
        packer = self._packer
        if packer is None:
            item = self._buffer.pop()
            return None if item is None else _Sending(item)
        while True:
            out: Outgoing | None = packer.next()
            if out is not None:
                return _Sending(out.item, out.count)
            item = self._buffer.pop()
            if item is not None:
                self._popped += 1
                packer.offer(item)
                continue
            # nothing queued: close what lingered long enough, or everything to flush/close
            if self._stop_deadline is not None or self._flush_covers(packer):
                packer.close_all()
            else:
                packer.close_due()
            out = packer.next()
            return None if out is None else _Sending(out.item, out.count)

    def _flush_covers(self, packer: Packer) -> bool:
        """True while a flush is pending that covers an event in an open pack."""
        if self._flush_deadline is None:
            return False
        target = self._flush_target
        return target is None or self._popped - packer.open_events < target

    def _wait_s(self) -> float:
        """How long to sleep for new events: until the oldest open pack is due, at most."""
        due = self._packer.next_due() if self._packer is not None else None
        if due is None:
            return self._idle_wait_s
        return min(self._idle_wait_s, max(0.0, due - time.monotonic()))

    def _connect(self) -> bool:
        config = self._config
        if self._stop_deadline is not None and "bootstrap_timeout_ms" in config:
            remaining_ms = int(max(0.0, self._stop_deadline - time.monotonic()) * 1000)
            config = {**config, "bootstrap_timeout_ms": max(1, min(remaining_ms, 5000))}
        try:
            self._producer = self._factory(**config)
        except Exception as exc:
            self._log.warning(
                "connect",
                "runwatch emitter: cannot reach Kafka at %s (%s); %d event(s) buffered, "
                "retrying in the background",
                config.get("bootstrap_servers"),
                describe(exc),
                len(self._buffer),
            )
            return False
        self.connected = True
        if self._on_connect is not None:
            self._on_connect()
        return True

    def _send(self, sending: _Sending) -> bool:
        """Hand one event's copies to the producer; False when it must be retried later."""
        producer = self._producer
        assert producer is not None
        topics, key, payload = sending.item
        if not isinstance(payload, bytes):
            try:
                payload = encode(payload)
            except Exception as exc:
                self._log.error("encode", "runwatch emitter: cannot encode %r: %s", payload, exc)
                self._buffer.settle(failed=sending.count)
                return True
            sending.item = (topics, key, payload)
        copies = len(topics)
        if copies > 1 and sending.tracker is None:
            sending.tracker = _MultiTopic(self._buffer, copies)
        while sending.sent < copies:
            topic = topics[sending.sent]
            try:
                future = producer.send(topic, value=payload, key=key)
            except self._retriable as exc:
                hint = (
                    " Does the topic exist (`runwatch topics create`)?"
                    if type(exc).__name__ == "KafkaTimeoutError"
                    else ""
                )
                self._log.warning(
                    f"retriable:{topic}",
                    "runwatch emitter: cannot send to %s yet (%s).%s Retrying; %d event(s) "
                    "buffered",
                    topic,
                    describe(exc),
                    hint,
                    len(self._buffer) + 1,
                )
                return False
            except Exception as exc:
                self._log.error(
                    f"send:{type(exc).__name__}",
                    "runwatch emitter: the producer refused an event for %s: %s",
                    topic,
                    describe(exc),
                )
                unsent = copies - sending.sent
                if sending.tracker is not None:
                    sending.tracker.done(unsent, failed=True)
                else:
                    self._buffer.settle(failed=sending.count)
                return True
            if sending.tracker is None:
                future.add_callback(self._delivered_one, sending.count)
                future.add_errback(self._failed_one, topic, sending.count)
            else:
                future.add_callback(self._copy_delivered, sending.tracker)
                future.add_errback(self._copy_failed, sending.tracker, topic)
            sending.sent += 1
        return True

    def _flush_producer(self) -> None:
        deadline = self._flush_deadline
        self._flush_deadline = None
        if deadline is None or self._producer is None:
            return
        try:
            self._producer.flush(timeout=max(0.0, deadline - time.monotonic()))
        except Exception as exc:  # KafkaTimeoutError: the caller's wait reports it
            logger.debug("runwatch emitter: flush did not complete: %s", exc)

    def _close_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        deadline = self._stop_deadline
        timeout_s = 0.0 if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            producer.close(timeout=timeout_s)
        except Exception as exc:
            logger.warning("runwatch emitter: closing the Kafka producer failed: %s", exc)

    # ------------------------------------------------------------------ callbacks

    def _delivered_one(self, count: int, _metadata: object) -> None:
        self._buffer.settle(delivered=count)

    def _failed_one(self, topic: str, count: int, exc: BaseException) -> None:
        self._report_failure(topic, exc)
        self._buffer.settle(failed=count)

    def _copy_delivered(self, tracker: _MultiTopic, _metadata: object) -> None:
        tracker.done()

    def _copy_failed(self, tracker: _MultiTopic, topic: str, exc: BaseException) -> None:
        self._report_failure(topic, exc)
        tracker.done(failed=True)

    def _report_failure(self, topic: str, exc: BaseException) -> None:
        self._log.error(
            f"failed:{type(exc).__name__}",
            "runwatch emitter: delivery to %s failed: %s",
            topic,
            describe(exc),
        )


__all__ = ["DeliveryThread", "FutureLike", "ProducerFactory", "ProducerLike", "QueuedEvent"]
