"""Which emitter the example talks to: Kafka's `RunEmitter`, nothing, or a JSON-lines trace.

Emitting is on when ``RUNWATCH_BOOTSTRAP`` is set and ``--no-emit`` is not given. A trace file
(``--trace-dir``) records every emitter call as one JSON line, with or without Kafka, which is
how the tests check the instrumentation without a broker.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol, cast

import msgspec


class Emitter(Protocol):
    """The part of `producers.emitter.RunEmitter` the example calls."""

    def run_started(self, **kwargs: Any) -> None:
        """See `RunEmitter.run_started`."""

    def step(self, step: int, **kwargs: Any) -> None:
        """See `RunEmitter.step`."""

    def heartbeat(self, step: int, **kwargs: Any) -> None:
        """See `RunEmitter.heartbeat`."""

    def checkpoint_committed(self, step: int, path: str, **kwargs: Any) -> None:
        """See `RunEmitter.checkpoint_committed`."""

    def checkpoint_failed(self, step: int, path: str, reason: str) -> None:
        """See `RunEmitter.checkpoint_failed`."""

    def run_ended(self, status: str = "completed", **kwargs: Any) -> None:
        """See `RunEmitter.run_ended`."""

    def close(self, timeout_s: float = 10.0) -> bool:
        """See `RunEmitter.close`."""


class NullEmitter:
    """Accepts every call and does nothing (emitting disabled)."""

    def run_started(self, **kwargs: Any) -> None:
        """Ignore."""

    def step(self, step: int, **kwargs: Any) -> None:
        """Ignore."""

    def heartbeat(self, step: int, **kwargs: Any) -> None:
        """Ignore."""

    def checkpoint_committed(self, step: int, path: str, **kwargs: Any) -> None:
        """Ignore."""

    def checkpoint_failed(self, step: int, path: str, reason: str) -> None:
        """Ignore."""

    def run_ended(self, status: str = "completed", **kwargs: Any) -> None:
        """Ignore."""

    def close(self, timeout_s: float = 10.0) -> bool:
        """Nothing to deliver."""
        return True


class TraceEmitter:
    """Writes each call as a JSON line, then forwards it to an inner emitter.

    Lines look like ``{"call": "step", "step": 3, "loss": 2.5, ...}``, structs encoded as
    their fields. JSON has no NaN, so msgspec writes non-finite floats as ``null``; step
    lines therefore also carry ``loss_repr`` (``"nan"``).

    Args:
        path: File to append to (created with its parents).
        inner: Emitter to forward to.
    """

    def __init__(self, path: Path, inner: Emitter) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("ab", buffering=0)
        self._inner = inner
        self._lock = threading.Lock()

    def _write(self, call: str, **fields: Any) -> None:
        line = msgspec.json.encode({"call": call, **fields}) + b"\n"
        with self._lock:
            self._file.write(line)

    def run_started(self, **kwargs: Any) -> None:
        """Record and forward."""
        self._write("run_started", **kwargs)
        self._inner.run_started(**kwargs)

    def step(self, step: int, **kwargs: Any) -> None:
        """Record (with the loss also as a string, to keep NaN visible) and forward."""
        self._write("step", step=step, loss_repr=repr(kwargs.get("loss")), **kwargs)
        self._inner.step(step, **kwargs)

    def heartbeat(self, step: int, **kwargs: Any) -> None:
        """Record and forward."""
        self._write("heartbeat", step=step, **kwargs)
        self._inner.heartbeat(step, **kwargs)

    def checkpoint_committed(self, step: int, path: str, **kwargs: Any) -> None:
        """Record and forward."""
        self._write("checkpoint_committed", step=step, path=path, **kwargs)
        self._inner.checkpoint_committed(step, path, **kwargs)

    def checkpoint_failed(self, step: int, path: str, reason: str) -> None:
        """Record and forward."""
        self._write("checkpoint_failed", step=step, path=path, reason=reason)
        self._inner.checkpoint_failed(step, path, reason)

    def run_ended(self, status: str = "completed", **kwargs: Any) -> None:
        """Record and forward."""
        self._write("run_ended", status=status, **kwargs)
        self._inner.run_ended(status, **kwargs)

    def close(self, timeout_s: float = 10.0) -> bool:
        """Close the file and the inner emitter."""
        with self._lock:
            self._file.close()
        return self._inner.close(timeout_s)


def make_emitter(
    *, enabled: bool, run_id: str, rank: int, world_size: int, trace_path: Path | None
) -> Emitter:
    """Build the emitter for this rank.

    Args:
        enabled: Talk to Kafka (``RUNWATCH_BOOTSTRAP`` set and no ``--no-emit``).
        run_id: The run.
        rank: This rank.
        world_size: Ranks in the gang.
        trace_path: Also write a JSON-lines trace here; None: no trace.

    Returns:
        The emitter; `RunEmitter` is imported only when enabled.
    """
    inner: Emitter = NullEmitter()
    if enabled:
        from runwatch.producers.emitter import RunEmitter

        inner = cast(Emitter, RunEmitter(run_id, rank=rank, world_size=world_size))
    return TraceEmitter(trace_path, inner) if trace_path is not None else inner
