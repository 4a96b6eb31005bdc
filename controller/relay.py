"""The node relay: the agent owns the node's one Kafka producer; its ranks write to a socket.

``runwatch launch --relay`` starts a `RelayServer` on a Unix socket (`relay_socket_path`,
in the state directory) and hands its path to every rank (``RUNWATCH_RELAY_SOCKET``, a
`common.launch_env.LaunchEnv` field). A rank's `RunEmitter` then writes its records there
(`producers.relay_client`) instead of running kafka-python.

One thread serves every connection (`selectors`): it reads event frames
(`producers.relay_wire`), hands them to one `producers.packing.Packer` per run (Kafka key),
which packs the run's heartbeats into ``pack.v1`` records by its rules (``max_events``,
``max_bytes``, ``linger_s``; any other record of the run closes the open pack of its topic
first, so a marker never overtakes the heartbeats queued before it), and sends the records
with ONE ``KafkaProducer`` (``acks=all``, idempotent: the emitter's `PRODUCER_DEFAULTS`).
Order per run per topic is the order the relay read the frames in; one producer keeps it
per partition. When Kafka acknowledges a record, every frame it carried is acked back to
its rank (a nack when it failed), so a rank's ``flush()``/``close()`` still means "Kafka
has it". A rank's flush frame closes its runs' open packs at once.

`RelayServer.flush_run` is what the controller calls before it publishes a run's exit
evidence or RunEnded on its own producer: it reads what the ranks already wrote (a killed
rank's last frames are still in the socket), closes the run's packs and waits for their
acks, so the agent's own events never overtake the ranks' relayed ones.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import os
import queue
import selectors
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from runwatch.common.retry import Backoff, Retrying
from runwatch.common.settings import kafka_client_config
from runwatch.producers.emitter_config import PRODUCER_DEFAULTS
from runwatch.producers.packing import Packer, PackPolicy
from runwatch.producers.relay_wire import (
    EventFrame,
    FrameError,
    FrameReader,
    Hello,
    Outcome,
    encode_outcome,
)
from runwatch.schemas.codec import DecodeError, decode
from runwatch.schemas.topics import names

log = logging.getLogger(__name__)

SOCKET_NAME: Final = "relay.sock"
MAX_SOCKET_PATH: Final = 100
"""Unix socket paths are limited to 107 bytes; longer state dirs use a path in /tmp."""
RELAY_POLICY: Final = PackPolicy(heartbeats=True, steps=False, linger_s=0.1)
"""What the relay packs: every run's heartbeats, within 100 ms (steps go one per record)."""
METADATA_BACKOFF: Final = Backoff(first_s=0.1, max_s=2.0)
"""Waits between tries of a record whose topic has no metadata yet (Kafka still starting)."""

Origin = tuple["_Conn", int]
"""Which rank connection sent a frame, and its sequence number there."""


def relay_socket_path(state_dir: Path) -> Path:
    """Where the relay of the agent with ``state_dir`` listens.

    ``state_dir/relay.sock`` when that fits a Unix socket address, else a name in the
    temporary directory derived from the state directory (the same for an adopting
    controller).
    """
    path = state_dir / SOCKET_NAME
    if len(str(path)) <= MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha256(str(state_dir).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"runwatch-relay-{digest}.sock"


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    reader: FrameReader = field(default_factory=FrameReader)
    out: bytearray = field(default_factory=bytearray)
    hello: Hello | None = None
    keys: set[bytes] = field(default_factory=set)
    open: bool = True

    def name(self) -> str:
        h = self.hello
        return "an unnamed rank" if h is None else f"run {h.run_id} rank {h.rank} (pid {h.pid})"


@dataclass
class _Run:
    """One run's packer, the origins of the frames it holds per topic, what is unacked."""

    packer: Packer
    origins: dict[str, deque[Origin]] = field(default_factory=dict)
    outstanding: set[int] = field(default_factory=set)


@dataclass
class _FlushRequest:
    key: bytes
    read: threading.Event = field(default_factory=threading.Event)
    waiting: set[int] = field(default_factory=set)
    """The run's records unacked when the request was served (done once none is left)."""


ProducerFactory = Callable[..., Any]


class RelayServer:
    """Serves the ranks of one node: a socket in, one Kafka producer out.

    Args:
        path: The Unix socket to listen on (a stale one is replaced).
        bootstrap: Kafka bootstrap address.
        prefix: Topic name prefix (the heartbeats topic is where packs go).
        policy: What to pack and when a pack closes.
        producer_factory: ``kafka.KafkaProducer`` when None.

    Raises:
        OSError: The socket cannot be bound.
    """

    def __init__(
        self,
        path: Path,
        bootstrap: str,
        prefix: str,
        *,
        policy: PackPolicy = RELAY_POLICY,
        producer_factory: ProducerFactory | None = None,
    ) -> None:
        self.path = path
        self.topics = names(prefix)
        self.policy = policy
        self.records = 0
        """Records produced so far (packs count once)."""
        self.frames = 0
        """Event frames read so far."""
        if producer_factory is None:
            from kafka import KafkaProducer

            producer_factory = KafkaProducer
        self._producer = producer_factory(
            **{
                **PRODUCER_DEFAULTS,
                "client_id": "runwatch-relay",
                **kafka_client_config(),
                "bootstrap_servers": bootstrap,
            }
        )
        self._runs: dict[bytes, _Run] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._outcomes: queue.SimpleQueue[tuple[list[Origin], bool, str, bytes, int]] = (
            queue.SimpleQueue()
        )
        self._flushes: queue.SimpleQueue[_FlushRequest] = queue.SimpleQueue()
        self._retry: deque[tuple[str, bytes, bytes, list[Origin]]] = deque()
        self._retrying = Retrying(METADATA_BACKOFF)
        self._retry_at = 0.0
        """When the first record of `_retry` may be tried again (monotonic)."""
        self._conns: set[_Conn] = set()
        self._stopping = False
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # only this user's ranks may connect
        try:
            self._listener.bind(str(path))
        finally:
            os.umask(old_umask)
        self._listener.listen(256)
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._serve, name="runwatch-relay", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public

    def flush_run(self, run_id: str, timeout_s: float = 30.0) -> bool:
        """Make everything the run's ranks wrote so far reach Kafka; True once acked.

        Reads what is waiting in the sockets, closes the run's open packs, sends them and
        waits (at most ``timeout_s``) until Kafka acknowledged every record of the run
        sent so far.
        """
        from runwatch.schemas.codec import encode_key

        request = _FlushRequest(encode_key(run_id))
        self._flushes.put(request)
        self._wake()
        deadline = time.monotonic() + timeout_s
        if not request.read.wait(timeout_s) or not self._thread.is_alive():
            return False
        run = self._runs.get(request.key)
        with self._lock:
            while run is not None and request.waiting & run.outstanding:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._settled.wait(left)
        return True

    def close(self, timeout_s: float = 30.0) -> None:
        """Send what is open, wait for Kafka (at most ``timeout_s``), stop, remove the socket."""
        self._stopping = True
        self._wake()
        self._thread.join(timeout_s)
        try:
            self._producer.flush(timeout=timeout_s)
        except Exception as exc:
            log.warning("relay: flushing the producer failed: %s", exc)
        self._drain_outcomes()
        self._producer.close(timeout=10)
        for conn in list(self._conns):
            self._drop(conn)
        self._sel.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    # ------------------------------------------------------------------ the thread

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"x")

    def _serve(self) -> None:
        try:
            while not self._stopping:
                self._step(self._timeout_s())
            self._step(0.0)
            for run in self._runs.values():
                run.packer.close_all()
            self._send_closed()
            self._retry_sends(now=True)
        except Exception:  # pragma: no cover - a bug: the ranks' acks stop, their flush times out
            log.exception("relay thread crashed")

    def _timeout_s(self) -> float:
        due = min(
            (d for r in self._runs.values() if (d := r.packer.next_due()) is not None),
            default=None,
        )
        now_s = time.monotonic()
        wait = max(0.0, self._retry_at - now_s) if self._retry else 1.0
        return wait if due is None else max(0.0, min(wait, due - now_s))

    def _step(self, timeout_s: float) -> None:
        for key, mask in self._sel.select(timeout_s):
            sock = key.fileobj
            if sock is self._listener:
                self._accept()
            elif sock is self._wake_r:
                with contextlib.suppress(BlockingIOError):
                    while self._wake_r.recv(4096):
                        pass
            else:
                conn = key.data
                if mask & selectors.EVENT_WRITE:
                    self._write(conn)
                self._read(conn)
        self._handle_flushes()
        for run in self._runs.values():
            run.packer.close_due()
        self._retry_sends()
        self._send_closed()
        self._drain_outcomes()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            conn = _Conn(sock)
            self._conns.add(conn)
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        if not conn.open:
            return
        while True:
            try:
                data = conn.sock.recv(262144)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._drop(conn)
                return
            try:
                frames = conn.reader.feed(data)
            except FrameError as exc:
                log.warning(
                    "relay: %s spoke nonsense (%s); closing its connection", conn.name(), exc
                )
                self._drop(conn)
                return
            for frame in frames:
                self._frame(conn, frame)

    def _frame(self, conn: _Conn, frame: object) -> None:
        if isinstance(frame, EventFrame):
            self.frames += 1
            self._offer(conn, frame)
        elif frame is None:  # flush: the rank waits for its acks
            for key in conn.keys:
                self._runs[key].packer.close_all()
        elif isinstance(frame, Hello):
            conn.hello = frame
            log.debug("relay: %s connected", conn.name())

    def _offer(self, conn: _Conn, frame: EventFrame) -> None:
        run = self._runs.get(frame.key)
        if run is None:
            run = self._runs[frame.key] = _Run(
                Packer(self.policy, self.topics.heartbeats, self.topics.steps)
            )
        conn.keys.add(frame.key)
        payload: Any = frame.value
        if frame.topic in (self.topics.heartbeats, self.topics.steps):
            try:
                payload = decode(frame.value)  # the packer packs events, not bytes
            except DecodeError:
                payload = frame.value  # passed on as it came: the processors dead-letter it
        run.origins.setdefault(frame.topic, deque()).append((conn, frame.seq))
        run.packer.offer(((frame.topic,), frame.key, payload))

    def _handle_flushes(self) -> None:
        requests = []
        with contextlib.suppress(queue.Empty):
            while True:
                requests.append(self._flushes.get_nowait())
        if not requests:
            return
        # What the ranks wrote before the request (a killed rank's last words) is read first.
        for conn in list(self._conns):
            self._read(conn)
        for request in requests:
            run = self._runs.get(request.key)
            if run is not None:
                run.packer.close_all()
        self._send_closed()
        with self._lock:
            for request in requests:
                run = self._runs.get(request.key)
                if run is not None:
                    request.waiting = set(run.outstanding)
                request.read.set()

    def _send_closed(self) -> None:
        for key, run in self._runs.items():
            while (out := run.packer.next()) is not None:
                (topic,), _, value = out.item
                queue_ = run.origins[topic]
                origins = [queue_.popleft() for _ in range(out.count)]
                if not isinstance(value, bytes):  # a lone event the packer did not pack
                    from runwatch.schemas.codec import encode

                    value = encode(value)
                self._retry.append((topic, key, value, origins))
        self._retry_sends()

    def _retry_sends(self, *, now: bool = False) -> None:
        """Hand the queued records to the producer, in order, once their backoff is over.

        Args:
            now: Try at once, whatever the backoff (the relay is closing).
        """
        if self._retry and not now and time.monotonic() < self._retry_at:
            return
        while self._retry:
            topic, key, value, origins = self._retry[0]
            try:
                future = self._producer.send(topic, key=key, value=value)
            except Exception as exc:
                if type(exc).__name__ == "KafkaTimeoutError":
                    wait_s = self._retrying.failed()
                    self._retry_at = time.monotonic() + wait_s
                    if self._retrying.failures == 1:  # once per outage, not per try
                        log.warning(
                            "relay: no metadata for %s yet (%s); retrying with backoff", topic, exc
                        )
                    return
                self._retry.popleft()
                self._outcomes.put((origins, False, f"{type(exc).__name__}: {exc}", key, 0))
                continue
            if self._retrying.failures:
                log.info(
                    "relay: metadata for %s known after %d tries", topic, self._retrying.failures
                )
                self._retrying.succeeded()
            self._retry.popleft()
            self.records += 1
            record_id = next(self._ids)
            with self._lock:
                self._runs[key].outstanding.add(record_id)
            future.add_callback(self._on_ack, origins, key, record_id)
            future.add_errback(self._on_error, origins, key, record_id)

    # kafka-python's sender thread
    def _on_ack(self, origins: list[Origin], key: bytes, record_id: int, _meta: object) -> None:
        self._outcomes.put((origins, True, "", key, record_id))
        self._settle(key, record_id)

    def _on_error(
        self, origins: list[Origin], key: bytes, record_id: int, exc: BaseException
    ) -> None:
        self._outcomes.put((origins, False, f"{type(exc).__name__}: {exc}", key, record_id))
        self._settle(key, record_id)

    def _settle(self, key: bytes, record_id: int) -> None:
        with self._lock:
            self._runs[key].outstanding.discard(record_id)
            self._settled.notify_all()
        self._wake()

    def _drain_outcomes(self) -> None:
        touched: set[_Conn] = set()
        with contextlib.suppress(queue.Empty):
            while True:
                origins, ok, reason, _key, _id = self._outcomes.get_nowait()
                for conn, seq in origins:
                    if conn.open:
                        conn.out += encode_outcome(Outcome(seq, ok, reason))
                        touched.add(conn)
        for conn in touched:
            self._write(conn)

    def _write(self, conn: _Conn) -> None:
        if not conn.open or not conn.out:
            return
        try:
            sent = conn.sock.send(conn.out)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._drop(conn)
            return
        del conn.out[:sent]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.modify(conn.sock, events, conn)

    def _drop(self, conn: _Conn) -> None:
        if not conn.open:
            return
        conn.open = False
        self._conns.discard(conn)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()
        log.debug("relay: %s disconnected", conn.name())


__all__ = ["RELAY_POLICY", "RelayServer", "relay_socket_path"]
