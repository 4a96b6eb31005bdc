"""Rate-limited logging, so an unreachable broker or a full buffer cannot flood a training log.

Two tools: `RateLimitedLog` for runwatch's own warnings, and `ThreadNoiseFilter` for the
records kafka-python logs from the emitter's threads (while no broker answers it logs
several connection errors a second, forever).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class RateLimitedLog:
    """Logs each kind of message at most once per interval, counting what it held back.

    Attributes:
        interval_s: Least time between two records of the same key.
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = 30.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Wrap ``logger``.

        Args:
            logger: Where records go.
            interval_s: Least time between two records of the same key.
            clock: Monotonic seconds (injectable for tests).
        """
        self._logger = logger
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last_s: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def log(self, level: int, key: str, msg: str, *args: object) -> bool:
        """Log ``msg % args`` at ``level`` unless ``key`` was logged within the interval.

        A record that follows suppressed ones says how many were suppressed.

        Returns:
            True if the record was logged.
        """
        now = self._clock()
        with self._lock:
            last = self._last_s.get(key)
            if last is not None and now - last < self.interval_s:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False
            self._last_s[key] = now
            suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            msg += f" ({suppressed} similar message(s) suppressed)"
        self._logger.log(level, msg, *args)
        return True

    def warning(self, key: str, msg: str, *args: object) -> bool:
        """`log` at WARNING."""
        return self.log(logging.WARNING, key, msg, *args)

    def error(self, key: str, msg: str, *args: object) -> bool:
        """`log` at ERROR."""
        return self.log(logging.ERROR, key, msg, *args)


class ThreadNoiseFilter(logging.Filter):
    """Passes each message template once per interval when logged from matching threads.

    Records from other threads, and CRITICAL ones, always pass: the filter only quiets
    what the emitter's own threads make a library log.
    """

    def __init__(
        self,
        thread_prefix: str,
        interval_s: float = 60.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Quiet records logged by threads whose name starts with ``thread_prefix``."""
        super().__init__()
        self.thread_prefix = thread_prefix
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last_s: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """True to keep ``record``."""
        if record.levelno >= logging.CRITICAL or not (record.threadName or "").startswith(
            self.thread_prefix
        ):
            return True
        key = (record.name, str(record.msg))
        now = self._clock()
        with self._lock:
            last = self._last_s.get(key)
            if last is not None and now - last < self.interval_s:
                return False
            if len(self._last_s) > 10_000:  # templates are few; never grow without bound
                self._last_s.clear()
            self._last_s[key] = now
        return True


_installed_lock = threading.Lock()
_installed: set[str] = set()


def quiet_library_loggers(package: str, thread_prefix: str, interval_s: float = 60.0) -> None:
    """Attach a `ThreadNoiseFilter` to every logger of ``package`` that exists now (once).

    A logger's filters only see records logged to that very logger, not those propagated
    from its children, so the filter goes on each of them.

    Args:
        package: Logger name prefix, e.g. ``"kafka"`` (import the package first).
        thread_prefix: Names of the threads to quiet.
        interval_s: Least time between two records of the same template.
    """
    shared = ThreadNoiseFilter(thread_prefix, interval_s)
    with _installed_lock:
        names = [
            name
            for name in list(logging.Logger.manager.loggerDict)
            if name == package or name.startswith(package + ".")
        ]
        for name in {package, *names}:
            tag = f"{name}\0{thread_prefix}"
            if tag in _installed:
                continue
            logging.getLogger(name).addFilter(shared)
            _installed.add(tag)


__all__ = ["RateLimitedLog", "ThreadNoiseFilter", "quiet_library_loggers"]
