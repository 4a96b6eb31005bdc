"""Rate-limited logging, so an unreachable broker or a full buffer cannot flood a training log."""

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


__all__ = ["RateLimitedLog"]
