"""The bounded hand-off between training threads and the emitter's delivery thread.

The bound covers every event the emitter has accepted and not yet settled (delivered or
failed): events still queued here and events handed to the Kafka client but not yet
acknowledged. So a broker that is down for an hour costs at most ``max_items`` events of
memory, whichever side of the Kafka client they wait on. Past the bound an event is
dropped and counted, and the count is handed to the next accepted event (its ``dropped``
field), so a consumer of the log sees every loss.

The calling side costs one uncontended lock and one ``deque.append``; the delivery thread
is only signalled when it is actually asleep.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class EventBuffer(Generic[T]):
    """A bounded FIFO with drop and settlement accounting (many writers, one reader).

    Writers call `reserve` then `push`; the reader calls `pop` (or `wait_for_items`) and
    reports outcomes with `settle`. All counts are in events.

    Attributes:
        max_items: Most events accepted and not yet settled.
    """

    def __init__(self, max_items: int) -> None:
        """Create an empty buffer.

        Args:
            max_items: The bound (at least 1).

        Raises:
            ValueError: ``max_items`` is below 1.
        """
        if max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items}")
        self.max_items = max_items
        self._queue: deque[T] = deque()
        self._lock = threading.Lock()
        self._settled_cond = threading.Condition(self._lock)
        self._settle_waiters = 0
        self._ready = threading.Event()
        self._reader_waiting = False
        self._enqueued = 0
        self._delivered = 0
        self._failed = 0
        self._dropped = 0
        self._unreported_drops = 0

    # ------------------------------------------------------------------ writers

    def reserve(self) -> int | None:
        """Claim room for one event, or count it as dropped.

        Returns:
            None when the buffer is full: the event is dropped (and counted). Otherwise
            the number of events dropped since the last accepted one, which the caller
            must record on the event it is about to `push` (0 in the common case).
        """
        with self._lock:
            if self._enqueued - self._delivered - self._failed >= self.max_items:
                self._dropped += 1
                self._unreported_drops += 1
                return None
            self._enqueued += 1
            drops = self._unreported_drops
            if drops:
                self._unreported_drops = 0
            return drops

    def count_dropped(self) -> None:
        """Count an event refused for another reason than a full buffer (never reported)."""
        with self._lock:
            self._dropped += 1

    def push(self, item: T) -> None:
        """Queue an item whose room was claimed with `reserve`."""
        self._queue.append(item)
        if self._reader_waiting:
            self._ready.set()

    # ------------------------------------------------------------------ reader

    def pop(self) -> T | None:
        """The oldest queued item, or None when the queue is empty."""
        try:
            return self._queue.popleft()
        except IndexError:
            return None

    def wait_for_items(self, timeout_s: float) -> bool:
        """Sleep until an item is queued, `wake` is called or ``timeout_s`` passes.

        Returns:
            True if items are queued.
        """
        # Never clear before waiting: a `wake` that came just before must not be lost. A
        # stale signal only costs one spurious return, and the caller re-checks anyway.
        self._reader_waiting = True
        try:
            if self._queue:
                return True
            self._ready.wait(timeout_s)
            self._ready.clear()
        finally:
            self._reader_waiting = False
        return bool(self._queue)

    def wake(self) -> None:
        """Wake the reader from `wait_for_items` (to close, or to flush)."""
        self._ready.set()

    def settle(self, delivered: int = 0, failed: int = 0) -> None:
        """Record the outcome of events taken from the queue; frees their room.

        Args:
            delivered: Events the broker acknowledged.
            failed: Events given up on (a non-retriable error).
        """
        with self._lock:
            self._delivered += delivered
            self._failed += failed
            if self._settle_waiters:
                self._settled_cond.notify_all()

    def wait_settled(self, target: int, timeout_s: float) -> bool:
        """Wait until ``target`` events have been settled (delivered or failed).

        Args:
            target: A value of `enqueued` read earlier.
            timeout_s: Longest to wait.

        Returns:
            True if at least ``target`` events were settled in time.
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._lock:
            self._settle_waiters += 1
            try:
                while self._delivered + self._failed < target:
                    remaining_s = deadline - time.monotonic()
                    if remaining_s <= 0:
                        return False
                    self._settled_cond.wait(remaining_s)
                return True
            finally:
                self._settle_waiters -= 1

    # ------------------------------------------------------------------ counts

    def __len__(self) -> int:
        """Items queued and not yet taken by the reader."""
        return len(self._queue)

    @property
    def enqueued(self) -> int:
        """Events accepted (not dropped) so far."""
        return self._enqueued

    def counts(self) -> tuple[int, int, int, int]:
        """A consistent ``(enqueued, delivered, dropped, failed)`` snapshot."""
        with self._lock:
            return self._enqueued, self._delivered, self._dropped, self._failed


__all__ = ["EventBuffer"]
