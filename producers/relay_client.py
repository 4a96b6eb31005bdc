"""The rank's side of the node relay: a producer-like object that writes to a Unix socket.

With ``RUNWATCH_RELAY_SOCKET`` set (``runwatch launch --relay``), `RunEmitter`'s delivery
thread is given `relay_producer_factory` instead of kafka-python's: `RelayProducer` has the
three methods the thread uses (``send``, ``flush``, ``close``), writes each record as an
event frame (`producers.relay_wire`) to the node agent's relay and resolves the record's
future when the relay's ack (Kafka acknowledged it) or nack comes back, on a reader
thread of its own. No Kafka client runs in the training process; kafka-python is never
imported.

Only the delivery thread ever waits here. When the relay is not there (not started yet,
or its agent died), ``send`` raises `RelayUnavailable`, which the delivery thread treats
like a missing topic's metadata: the event stays buffered, the thread retries with
backoff (reconnecting), and the emitter's bounded buffer turns a long absence into
counted drops. Records written to a connection that then breaks have an unknown outcome:
they are failed (counted in the emitter's ``failed``), never sent twice.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from runwatch.producers.relay_wire import (
    EventFrame,
    FrameError,
    FrameReader,
    Outcome,
    encode_event,
    encode_flush,
    encode_hello,
)

logger = logging.getLogger(__name__)

SEND_TIMEOUT_S = 5.0
"""Longest a write to the relay may block the delivery thread before the link counts as broken."""


class RelayUnavailable(ConnectionError):
    """The relay cannot take records now (retriable: the event stays buffered)."""


class RelayFailed(RuntimeError):
    """The relay failed a record, or the link broke before its outcome came back."""


class RelayFuture:
    """The outcome of one record, resolved by the reader thread (kafka-python's future shape)."""

    __slots__ = ("_callbacks", "_errbacks", "_exc", "_lock", "_ok")

    def __init__(self) -> None:
        """Unresolved."""
        self._lock = threading.Lock()
        self._ok: bool | None = None
        self._exc: BaseException | None = None
        self._callbacks: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self._errbacks: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def add_callback(self, f: Callable[..., Any], *args: Any) -> RelayFuture:
        """Call ``f(*args, None)`` when the record is acknowledged (now, if it was)."""
        with self._lock:
            if self._ok is None:
                self._callbacks.append((f, args))
                return self
            ok = self._ok
        if ok:
            f(*args, None)
        return self

    def add_errback(self, f: Callable[..., Any], *args: Any) -> RelayFuture:
        """Call ``f(*args, exc)`` when the record fails (now, if it did)."""
        with self._lock:
            if self._ok is None:
                self._errbacks.append((f, args))
                return self
            ok, exc = self._ok, self._exc
        if not ok:
            f(*args, exc)
        return self

    def resolve(self, exc: BaseException | None) -> None:
        """Settle the record: acknowledged (``exc`` None) or failed; only the first counts."""
        with self._lock:
            if self._ok is not None:
                return
            self._ok, self._exc = exc is None, exc
            callbacks, errbacks = self._callbacks, self._errbacks
            self._callbacks, self._errbacks = [], []
        try:
            if exc is None:
                for f, args in callbacks:
                    f(*args, None)
            else:
                for f, args in errbacks:
                    f(*args, exc)
        except Exception:  # pragma: no cover - a callback bug must not kill the reader
            logger.exception("runwatch relay client: a delivery callback failed")


class RelayProducer:
    """A connection to the node relay, shaped like the part of ``KafkaProducer`` used.

    Args:
        path: The relay's Unix socket.
        run_id: The rank's run (in the hello frame).
        rank: The rank (in the hello frame).
        name: Name of the reader thread.

    Raises:
        RelayUnavailable: Nothing listens at ``path``.
    """

    def __init__(self, path: str, run_id: str, rank: int, name: str) -> None:
        self._path = path
        self._hello = encode_hello(run_id, rank, os.getpid())
        self._name = name
        self._seq = 0
        self._pending: dict[int, RelayFuture] = {}
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._write_lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._reader: threading.Thread | None = None
        self._closed = False
        self._connect()

    # ------------------------------------------------------------------ the link

    def _connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(SEND_TIMEOUT_S)
            sock.connect(self._path)
            sock.sendall(self._hello)
        except OSError as exc:
            sock.close()
            raise RelayUnavailable(f"no relay at {self._path}: {exc}") from None
        self._sock = sock
        self._reader = threading.Thread(
            target=self._read, args=(sock,), name=f"{self._name}-relay", daemon=True
        )
        self._reader.start()

    def _read(self, sock: socket.socket) -> None:
        reader = FrameReader()
        reason = "the relay closed the connection"
        try:
            while True:
                try:
                    data = sock.recv(65536)
                except TimeoutError:  # the socket's timeout bounds writes; reads just idle
                    if self._closed:
                        break
                    continue
                if not data:
                    break
                for frame in reader.feed(data):
                    if isinstance(frame, Outcome):
                        self._settle(frame)
        except (OSError, FrameError) as exc:
            reason = f"relay connection lost: {exc}"
        self._broken(sock, reason)

    def _settle(self, outcome: Outcome) -> None:
        with self._lock:
            future = self._pending.get(outcome.seq)
        if future is None:
            return
        future.resolve(None if outcome.ok else RelayFailed(outcome.reason))
        with self._lock:  # a flush returns once the callbacks ran
            self._pending.pop(outcome.seq, None)
            self._settled.notify_all()

    def _broken(self, sock: socket.socket, reason: str) -> None:
        """Fail every record of a connection that ended (their outcome is unknown)."""
        with self._lock:
            if self._sock is not sock:
                return
            self._sock = None
            lost = dict(self._pending)
        sock.close()
        if lost and not self._closed:
            logger.warning("runwatch relay client: %s; %d record(s) failed", reason, len(lost))
        for future in lost.values():
            future.resolve(RelayFailed(reason))
        with self._lock:
            for seq in lost:
                self._pending.pop(seq, None)
            self._settled.notify_all()

    # ------------------------------------------------------------------ ProducerLike

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None) -> RelayFuture:
        """Write one record to the relay; its future resolves on the relay's answer.

        Raises:
            RelayUnavailable: No relay to write to (the caller retries later).
        """
        if self._closed:
            raise RelayUnavailable("the relay producer is closed")
        if self._sock is None:
            self._connect()
        sock = self._sock
        assert sock is not None
        future = RelayFuture()
        with self._write_lock:
            self._seq += 1
            seq = self._seq
            frame = encode_event(seq, topic, key or b"", value or b"")
            with self._lock:
                self._pending[seq] = future
            try:
                sock.sendall(frame)
            except OSError as exc:
                # The reader thread still reads the answers already sent, then fails the rest.
                with self._lock:
                    self._pending.pop(seq, None)
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_WR)
                raise RelayUnavailable(f"relay at {self._path} went away: {exc}") from None
        return future

    def flush(self, timeout: float | None = None) -> None:
        """Ask the relay to close its open packs, then wait for every record's outcome.

        Raises:
            TimeoutError: Records still without an outcome after ``timeout``.
        """
        sock = self._sock
        if sock is not None:
            try:
                with self._write_lock:
                    sock.sendall(encode_flush())
            except OSError:
                pass  # the reader thread reads the answers already sent, then fails the rest
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"{len(self._pending)} record(s) not acknowledged in time")
                self._settled.wait(left)

    def close(self, timeout: float | None = None) -> None:
        """Flush (for at most ``timeout``), then close the connection; unsettled records fail."""
        try:
            self.flush(timeout)
        except TimeoutError as exc:
            logger.warning("runwatch relay client: closing with %s", exc)
        self._closed = True
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            self._broken(sock, "closed")
        if self._reader is not None:
            self._reader.join(2.0)

    @property
    def pending(self) -> int:
        """Records written and not yet answered."""
        with self._lock:
            return len(self._pending)


def relay_producer_factory(path: str, run_id: str, rank: int) -> Callable[..., RelayProducer]:
    """A `producers.delivery.ProducerFactory` that connects to the relay at ``path``.

    The Kafka keyword arguments the delivery thread passes are ignored (the relay owns the
    producer and its settings), except ``client_id``, which names the reader thread.
    """

    def factory(**config: Any) -> RelayProducer:
        return RelayProducer(path, run_id, rank, str(config.get("client_id", "runwatch-emitter")))

    return factory


__all__ = [
    "EventFrame",
    "RelayFailed",
    "RelayFuture",
    "RelayProducer",
    "RelayUnavailable",
    "relay_producer_factory",
]
