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

The relay speaks for its run only (issue 19, finding 9): a frame is refused back to its
rank, with a reason, unless its topic is one of the run's input topics (runs, steps,
heartbeats, checkpoints of the relay's prefix) and its key is the relay's own run, and
unless every event it carries (a pack's too) names that run. Records wait for Kafka in
one queue per topic, so a topic that has no metadata (or fails) never holds back the
others. The socket lives in the state directory, or, when that path is too long for a
Unix socket, in a private directory (0700, owned by this user, checked) under
``$XDG_RUNTIME_DIR`` or the temporary directory: never a predictable name in a shared one.

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
import stat
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from runwatch.common.isolate import BadRecords
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
from runwatch.schemas.codec import DecodeError, decode, encode_key
from runwatch.schemas.events import EventPack
from runwatch.schemas.topics import TopicRole, names

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


def private_dir(base: Path) -> Path:
    """``base/runwatch-<uid>``: created 0700, and refused unless it is this user's own.

    Raises:
        OSError: It exists as something else (a link, another user's, open to others).
    """
    path = base / f"runwatch-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if (
        not stat.S_ISDIR(info.st_mode)
        or info.st_uid != os.getuid()
        or stat.S_IMODE(info.st_mode) & 0o077
    ):
        raise OSError(
            f"{path} is not a private directory of this user (mode 0700): refusing to put "
            "the relay socket there"
        )
    return path


def relay_socket_path(state_dir: Path) -> Path:
    """Where the relay of the agent with ``state_dir`` listens.

    ``state_dir/relay.sock`` when that fits a Unix socket address, else a name derived
    from the state directory (the same for an adopting controller) in this user's
    private directory (`private_dir`) under ``$XDG_RUNTIME_DIR`` or the temporary
    directory.
    """
    path = state_dir / SOCKET_NAME
    if len(str(path)) <= MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha256(str(state_dir).encode()).hexdigest()[:16]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime and Path(runtime).is_dir() else Path(tempfile.gettempdir())
    return private_dir(base) / f"relay-{digest}.sock"


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
        run_ids: The runs whose ranks this relay speaks for; a frame of any other run
            is refused back to its rank.
        policy: What to pack and when a pack closes.
        producer_factory: ``kafka.KafkaProducer`` when None.

    Attributes:
        refused: Frames refused (another run, another topic, an event of another run),
            counted by reason and logged once per reason.

    Raises:
        OSError: The socket cannot be bound.
    """

    def __init__(
        self,
        path: Path,
        bootstrap: str,
        prefix: str,
        *,
        run_ids: Collection[str],
        policy: PackPolicy = RELAY_POLICY,
        producer_factory: ProducerFactory | None = None,
    ) -> None:
        self.path = path
        self.topics = names(prefix)
        self.policy = policy
        self.run_keys = {encode_key(r): r for r in run_ids}
        self.allowed_topics = frozenset(
            self.topics.roles(
                TopicRole.RUNS, TopicRole.STEPS, TopicRole.HEARTBEATS, TopicRole.CHECKPOINTS
            )
        )
        self.refused = BadRecords("relay", log)
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
        self._retry: dict[str, deque[tuple[bytes, bytes, list[Origin]]]] = {}
        """Records waiting for the producer, one queue per topic (order kept per topic)."""
        self._retrying: dict[str, Retrying] = {}
        self._retry_at: dict[str, float] = {}
        """When each topic's first waiting record may be tried again (monotonic)."""
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
        waiting = [self._retry_at.get(t, 0.0) for t, q in self._retry.items() if q]
        wait = max(0.0, min(waiting) - now_s) if waiting else 1.0
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

    def _check(self, frame: EventFrame) -> tuple[str, Any]:
        """Why ``frame`` must not be sent with this agent's credentials, and its event.

        Returns:
            ``(reason, None)`` for a refused frame; ``("", event)`` for one that may go
            (``event`` None when its value does not decode: passed on as it came, the
            processors dead-letter it).
        """
        run_id = self.run_keys.get(frame.key)
        if run_id is None:
            return "refused: the relay sends only its own run's records (key is another run)", None
        if frame.topic not in self.allowed_topics:
            return "refused: the relay sends only to its run's input topics", None
        try:
            event = decode(frame.value)
        except DecodeError:
            return "", None
        inner = event.events if isinstance(event, EventPack) else (event,)
        if any(e.run_id != run_id for e in (event, *inner)):
            return "refused: an event of another run under this run's key", None
        return "", event

    def _refuse(self, conn: _Conn, frame: EventFrame, reason: str) -> None:
        """Nack ``frame`` to its rank at once, with ``reason``; count it (logged once)."""
        self.refused.note("frame", PermissionError(reason), conn.name())
        conn.out += encode_outcome(Outcome(frame.seq, False, reason))
        self._write(conn)

    def _offer(self, conn: _Conn, frame: EventFrame) -> None:
        reason, event = self._check(frame)
        if reason:
            self._refuse(conn, frame, reason)
            return
        run = self._runs.get(frame.key)
        if run is None:
            run = self._runs[frame.key] = _Run(
                Packer(self.policy, self.topics.heartbeats, self.topics.steps)
            )
        conn.keys.add(frame.key)
        payload: Any = frame.value
        if frame.topic in (self.topics.heartbeats, self.topics.steps) and event is not None:
            payload = event  # the packer packs events, not bytes
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
                self._retry.setdefault(topic, deque()).append((key, value, origins))
        self._retry_sends()

    def _retry_sends(self, *, now: bool = False) -> None:
        """Hand each topic's queued records to the producer, in order, past their backoff.

        Args:
            now: Try at once, whatever the backoff (the relay is closing).
        """
        for topic, waiting in self._retry.items():
            if waiting and (now or time.monotonic() >= self._retry_at.get(topic, 0.0)):
                self._send_topic(topic, waiting)

    def _send_topic(self, topic: str, waiting: deque[tuple[bytes, bytes, list[Origin]]]) -> None:
        """Send one topic's queue until it is empty or the topic has no metadata."""
        retrying = self._retrying.setdefault(topic, Retrying(METADATA_BACKOFF))
        while waiting:
            key, value, origins = waiting[0]
            try:
                future = self._producer.send(topic, key=key, value=value)
            except Exception as exc:
                if type(exc).__name__ == "KafkaTimeoutError":
                    wait_s = retrying.failed()
                    self._retry_at[topic] = time.monotonic() + wait_s
                    if retrying.failures == 1:  # once per outage, not per try
                        log.warning(
                            "relay: no metadata for %s yet (%s); retrying with backoff", topic, exc
                        )
                    return
                waiting.popleft()
                self._outcomes.put((origins, False, f"{type(exc).__name__}: {exc}", key, 0))
                continue
            if retrying.failures:
                log.info("relay: metadata for %s known after %d tries", topic, retrying.failures)
                retrying.succeeded()
            waiting.popleft()
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


__all__ = ["RELAY_POLICY", "RelayServer", "private_dir", "relay_socket_path"]
