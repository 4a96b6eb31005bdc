"""Stand-ins for kafka-python's producer, for unit tests that do not claim to test Kafka."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kafka.errors import KafkaConnectionError, KafkaTimeoutError


class FakeFuture:
    """A record future resolved by the test (or at once when the producer auto-acks)."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[Any], Any]] = []
        self._errbacks: list[Callable[[BaseException], Any]] = []
        self.done = False
        self.exception: BaseException | None = None
        self._lock = threading.Lock()

    def add_callback(self, f: Callable[..., Any], *args: Any) -> FakeFuture:
        with self._lock:
            if not self.done:
                self._callbacks.append(lambda v: f(*args, v))
                return self
        if self.exception is None:
            f(*args, "metadata")
        return self

    def add_errback(self, f: Callable[..., Any], *args: Any) -> FakeFuture:
        with self._lock:
            if not self.done:
                self._errbacks.append(lambda e: f(*args, e))
                return self
        if self.exception is not None:
            f(*args, self.exception)
        return self

    def succeed(self) -> None:
        with self._lock:
            self.done = True
            callbacks = list(self._callbacks)
        for cb in callbacks:
            cb("metadata")

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            self.done = True
            self.exception = exc
            errbacks = list(self._errbacks)
        for eb in errbacks:
            eb(exc)


class FakeProducer:
    """Records what is sent; acks at once unless ``auto_ack`` is False."""

    def __init__(self, broker: FakeBroker, config: dict[str, Any]) -> None:
        self.broker = broker
        self.config = config
        self.closed = False

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None) -> FakeFuture:
        with self.broker.lock:
            if self.broker.metadata_timeouts > 0:
                self.broker.metadata_timeouts -= 1
                raise KafkaTimeoutError(f"no metadata for {topic}")
            future = FakeFuture()
            self.broker.records.append((topic, key, value))
            self.broker.futures.append(future)
            fail = self.broker.fail_topics.get(topic)
        if fail is not None:
            future.fail(fail)
        elif self.broker.auto_ack:
            future.succeed()
        self.broker.sent.set()
        return future

    def flush(self, timeout: float | None = None) -> None:
        self.broker.flushes += 1

    def close(self, timeout: float | None = None) -> None:
        self.closed = True
        with self.broker.lock:
            pending = [f for f in self.broker.futures if not f.done]
        for future in pending:
            future.fail(KafkaTimeoutError("closed with the record pending"))


class FakeBroker:
    """A producer factory whose 'broker' can be down, slow to ack, or refuse topics."""

    def __init__(self, *, up: bool = True, auto_ack: bool = True) -> None:
        self.up = up
        self.auto_ack = auto_ack
        self.lock = threading.Lock()
        self.records: list[tuple[str, bytes | None, bytes | None]] = []
        self.futures: list[FakeFuture] = []
        self.fail_topics: dict[str, BaseException] = {}
        self.metadata_timeouts = 0
        self.connect_attempts = 0
        self.producers: list[FakeProducer] = []
        self.flushes = 0
        self.sent = threading.Event()

    def __call__(self, **config: Any) -> FakeProducer:
        self.connect_attempts += 1
        if not self.up:
            raise KafkaConnectionError("fake broker is down")
        producer = FakeProducer(self, config)
        self.producers.append(producer)
        return producer

    def ack_all(self) -> None:
        with self.lock:
            pending = [f for f in self.futures if not f.done]
        for future in pending:
            future.succeed()
