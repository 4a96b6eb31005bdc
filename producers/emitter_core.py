"""The part of `RunEmitter` that builds no events: buffer, delivery thread, lifecycle.

`EmitterCore` holds the configuration, the emitter's identity (Kafka key, topics, host,
pid, event sequence numbers), the bounded buffer and the delivery thread; it accepts
events (`EmitterCore._enqueue_hot` for ``step`` and ``heartbeat``, which the
delivery thread encodes; `EmitterCore._enqueue` for the rest, encoded on the calling
thread), counts what it drops, and implements `flush`, `close` and `stats`.
`producers.run_events.RunEvents` and `producers.emitter.RunEmitter` add the per-event
methods on top.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import time
import weakref
from dataclasses import dataclass
from typing import Self

import msgspec

from runwatch.producers.buffer import EventBuffer
from runwatch.producers.delivery import DeliveryThread, ProducerFactory, QueuedEvent
from runwatch.producers.emitter_config import (
    EmitterConfig,
    default_producer_factory,
    producer_settings,
)
from runwatch.producers.lifecycle import ExitHook, stop_delivery
from runwatch.producers.packing import Packer
from runwatch.producers.ratelimit import RateLimitedLog
from runwatch.producers.relay_client import RelayUnavailable, relay_producer_factory
from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import Event
from runwatch.schemas.topics import names

logger = logging.getLogger("runwatch.producers.emitter")
"""The emitter's logger; named after the public module, as before the split."""


@dataclass(frozen=True, slots=True)
class EmitterStats:
    """Counts of events since the emitter started.

    An event routed to several topics counts once. ``enqueued == delivered + failed +
    buffered`` always holds.

    Attributes:
        enqueued: Events accepted into the buffer.
        delivered: Events the broker acknowledged (every copy).
        dropped: Events refused because the buffer was full (or the emitter was closed).
        failed: Events the producer gave up on (a non-retriable error, or `close` timed
            out with them in the producer).
        buffered: Events accepted and not yet delivered or failed.
        packs: Pack records the emitter built (0 unless packing is on).
    """

    enqueued: int
    delivered: int
    dropped: int
    failed: int
    buffered: int
    packs: int = 0


class EmitterCore:
    """Buffers events and delivers them to Kafka from a background thread.

    Thread-safe. Not used directly: `producers.emitter.RunEmitter` is the public class.

    Attributes:
        run_id: The run; the Kafka key of every event.
        bootstrap: Kafka bootstrap servers.
        rank: The rank this emitter speaks for.
        world_size: Ranks in the gang.
        topic_prefix: Prefix of the topic names.
        incarnation: The gang's incarnation (restarts so far).
        launch_id: The launch the gang belongs to (RunStarted carries it); empty: none.
        relay_socket: The node relay events go through; None: straight to Kafka.
    """

    def __init__(
        self, config: EmitterConfig, producer_factory: ProducerFactory | None = None
    ) -> None:
        """Create the buffer and start the delivery thread; never waits for Kafka.

        Args:
            config: The checked configuration (`producers.emitter_config.resolve_config`).
            producer_factory: Creates the producer from keyword arguments;
                ``kafka.KafkaProducer`` when None.

        Raises:
            ValueError: A ``client_config`` setting kafka-python does not know.
        """
        self.run_id = config.run_id
        self.bootstrap = config.bootstrap
        self.rank = config.rank
        self.world_size = config.world_size
        self.incarnation = config.incarnation
        self.launch_id = config.launch_id
        self.topic_prefix = config.topic_prefix
        self.relay_socket = config.relay_socket
        self._key = encode_key(self.run_id)
        topics = names(self.topic_prefix)
        self._run_topics = (topics.runs, topics.steps, topics.heartbeats)
        self._step_topics = (topics.steps,)
        self._heartbeat_topics = (topics.heartbeats,)
        self._checkpoint_topics = (topics.checkpoints,)
        self._host = socket.gethostname()
        self._pid = os.getpid()
        self._seq = itertools.count(1)
        # step()'s default; run_started() sets it from the plan.
        self._data_parallel_size = self.world_size
        # step() and heartbeat() build events from checked ints, floats and strs, which
        # always encode: they leave encoding to the delivery thread (about 1 us less on
        # the calling thread, see bench/producer.py). The rare events carry caller-made
        # structs and encode at the call site, so a bad one raises there. True: all do.
        self._encode_on_caller = False
        self._closed = False
        self._close_result: bool | None = None
        self._log = RateLimitedLog(logger)
        self._buffer: EventBuffer[QueuedEvent] = EventBuffer(config.max_buffered)

        settings = producer_settings(config)
        retriable: tuple[type[BaseException], ...] | None = None
        if producer_factory is None and config.relay_socket is not None:
            # The node agent owns the Kafka producer: no Kafka client in this process.
            producer_factory = relay_producer_factory(
                config.relay_socket, config.run_id, config.rank
            )
            retriable = (RelayUnavailable,)
        elif producer_factory is None:
            producer_factory = default_producer_factory(settings)
        self._exit_hook = ExitHook(self)
        packing = config.packing
        self._packer = Packer(packing, topics.heartbeats, topics.steps) if packing.enabled else None
        self._delivery = DeliveryThread(
            self._buffer,
            producer_factory=producer_factory,
            producer_config=settings,
            name=config.thread_name,
            log=self._log,
            on_connect=self._exit_hook.register_last,
            packer=self._packer,
            retriable=retriable,
        )
        self._exit_hook.register_last()
        self._delivery.start()
        # An emitter dropped without close() must not leave its thread and producer behind.
        weakref.finalize(self, stop_delivery, self._delivery)

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the hot path

    def _enqueue_hot(self, topics: tuple[str, ...], event: Event) -> None:
        if self._encode_on_caller:
            self._enqueue(topics, self._key, event)
        else:
            self._push(topics, self._key, event, event)

    def _enqueue(self, topics: tuple[str, ...], key: bytes, event: Event) -> None:
        try:
            payload = encode(event)
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
            raise TypeError(f"cannot encode {type(event).__name__}: {exc}") from None
        self._push(topics, key, event, payload)

    def _push(
        self, topics: tuple[str, ...], key: bytes, event: Event, payload: bytes | Event
    ) -> None:
        if self._closed:
            self._drop_after_close(event)
            return
        drops = self._buffer.reserve()
        if drops is None:
            self._log.warning(
                "dropped",
                "runwatch emitter: buffer full (%d events waiting for Kafka); dropping "
                "events, the next event sent reports how many",
                self._buffer.max_items,
            )
            return
        if drops:
            event = msgspec.structs.replace(event, dropped=event.dropped + drops)
            payload = encode(event) if type(payload) is bytes else event
        self._buffer.push((topics, key, payload))

    def _drop_after_close(self, event: Event) -> None:
        self._buffer.count_dropped()
        self._log.warning(
            "closed",
            "runwatch emitter: %s after close() was dropped",
            type(event).__name__,
        )

    # ------------------------------------------------------------------ lifecycle

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every event accepted so far is delivered (or ``timeout_s`` passes).

        Args:
            timeout_s: Longest to wait.

        Returns:
            True if all of them were delivered in time and none failed meanwhile.
        """
        target = self._buffer.enqueued
        _, _, _, failed_before = self._buffer.counts()
        if self._delivery.alive:
            self._delivery.request_flush(time.monotonic() + timeout_s, target)
        settled = self._buffer.wait_settled(target, timeout_s)
        _, _, _, failed_after = self._buffer.counts()
        return settled and failed_after == failed_before

    def close(self, timeout_s: float = 10.0) -> bool:
        """Deliver what is buffered (for at most ``timeout_s``), then stop the thread.

        Safe to call more than once: later calls return the first result. Events emitted
        after closing are dropped (counted and logged).

        Args:
            timeout_s: Longest to wait for delivery and for the producer to close.

        Returns:
            True if every accepted event was delivered; the counts are in `stats`.
        """
        if self._close_result is not None:
            return self._close_result
        self._closed = True
        self._exit_hook.unregister()
        self._delivery.stop(time.monotonic() + max(0.0, timeout_s))
        self._delivery.join(max(0.0, timeout_s) + 2.0)
        stats = self.stats
        result = stats.delivered == stats.enqueued
        if not result:
            logger.warning(
                "runwatch emitter for run %s closed with %d of %d event(s) undelivered "
                "(%d failed, %d still buffered, %d dropped)",
                self.run_id,
                stats.enqueued - stats.delivered,
                stats.enqueued,
                stats.failed,
                stats.buffered,
                stats.dropped,
            )
        self._close_result = result
        return result

    @property
    def closed(self) -> bool:
        """True once `close` was called."""
        return self._closed

    @property
    def stats(self) -> EmitterStats:
        """The emitter's counts, as one consistent snapshot."""
        enqueued, delivered, dropped, failed = self._buffer.counts()
        return EmitterStats(
            enqueued=enqueued,
            delivered=delivered,
            dropped=dropped,
            failed=failed,
            buffered=enqueued - delivered - failed,
            packs=self._packer.packs if self._packer is not None else 0,
        )


__all__ = ["EmitterCore", "EmitterStats"]
