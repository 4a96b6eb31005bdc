"""Making sure an emitter's thread and buffered events do not outlive it unnoticed.

An emitter never closed is closed at interpreter exit by an `ExitHook` (delivering for at
most `EXIT_FLUSH_TIMEOUT_S`); one garbage-collected without ``close()`` has its delivery
thread stopped by `stop_delivery` (from a ``weakref.finalize``).
"""

from __future__ import annotations

import atexit
import time
import weakref
from typing import Final, Protocol

from runwatch.producers.delivery import DeliveryThread

EXIT_FLUSH_TIMEOUT_S: Final = 5.0
"""How long an emitter that was never closed may delay interpreter exit to deliver."""


class Closeable(Protocol):
    """What `ExitHook` needs of an emitter."""

    def close(self, timeout_s: float = ...) -> bool:  # noqa: D102
        ...


class ExitHook:
    """An ``atexit`` hook that closes the emitter if the program forgets to.

    It holds the emitter weakly. It is re-registered after the Kafka producer is created,
    so it runs before the producer's own ``atexit`` close (``atexit`` runs hooks
    last-registered first).
    """

    def __init__(self, emitter: Closeable) -> None:
        self._ref = weakref.ref(emitter)
        self._active = True

    def __call__(self) -> None:
        """Close the emitter, if it still exists, for at most `EXIT_FLUSH_TIMEOUT_S`."""
        emitter = self._ref()
        if emitter is not None:
            emitter.close(EXIT_FLUSH_TIMEOUT_S)

    def register_last(self) -> None:
        """(Re-)register the hook so that it runs before those registered so far."""
        if not self._active:
            return
        atexit.unregister(self)
        atexit.register(self)

    def unregister(self) -> None:
        """Remove the hook for good (the emitter was closed)."""
        self._active = False
        atexit.unregister(self)


def stop_delivery(delivery: DeliveryThread) -> None:
    """Ask ``delivery`` to stop, giving it one second to deliver what it holds."""
    delivery.stop(time.monotonic() + 1.0)


__all__ = ["EXIT_FLUSH_TIMEOUT_S", "Closeable", "ExitHook", "stop_delivery"]
