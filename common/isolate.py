"""Bad-record isolation: a record that raises while being handled never stops a process.

Every long-running consumer (the controller's loop and its adoption, the sinks, the web
view's reader, the relay) reads records written by others. A record that makes its
handler raise (a field no check foresaw, a value that breaks arithmetic, a name the file
system refuses) must cost that record only: it is counted by reason, logged once per
reason (a flood of the same bad record is one line, not a line per record), and the
consumer moves past it. The reason is the handler's name and the exception's type, never
the record's content, so an attacker cannot grow the table of reasons without bound.

`BadRecords` is the one shared helper; a consumer holds one and wraps each record's
handling in `BadRecords.guard`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Final, TypeVar

T = TypeVar("T")

MAX_REASONS: Final = 256
"""Distinct reasons counted apart; past it, every new reason counts as ``other``."""


class BadRecords:
    """Counts and logs (once per reason) the records a consumer could not handle.

    Args:
        component: The consumer's name, first word of every log line.
        logger: Where the first occurrence of each reason is logged (a warning).

    Attributes:
        counts: Records isolated, by reason (``"<where>: <ExceptionType>"``).
    """

    def __init__(self, component: str, logger: logging.Logger | None = None) -> None:
        self.component = component
        self.logger = logger or logging.getLogger(__name__)
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        """Records isolated so far, every reason together."""
        with self._lock:
            return sum(self.counts.values())

    def note(self, where: str, exc: BaseException, source: object = None) -> None:
        """Count one record that raised ``exc`` in ``where``; log the reason's first one.

        Args:
            where: What was being done (``"decide"``, ``"archive flush"``).
            exc: What it raised.
            source: Where the record was read (logged with the first occurrence only).
        """
        reason = f"{where}: {type(exc).__name__}"
        with self._lock:
            if reason not in self.counts and len(self.counts) >= MAX_REASONS:
                reason = "other"
            first = reason not in self.counts
            self.counts[reason] = self.counts.get(reason, 0) + 1
        if first:
            self.logger.warning(
                "%s: skipped a record that could not be handled (%s%s: %s); it is counted, "
                "its offset passes, and later records of this reason are counted silently",
                self.component,
                reason,
                "" if source is None else f" at {source}",
                str(exc)[:200],
                exc_info=exc,
            )

    def guard(
        self, where: str, handle: Callable[[], T], source: object = None
    ) -> tuple[bool, T | None]:
        """Run ``handle()``; an `Exception` from it is noted, not raised.

        Returns:
            ``(True, its result)``, or ``(False, None)`` when it raised.
        """
        try:
            return True, handle()
        except Exception as exc:  # isolating any record is the point
            self.note(where, exc, source)
            return False, None


__all__ = ["MAX_REASONS", "BadRecords"]
