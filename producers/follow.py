r"""Following a growing log file (``tail -F``), by polling.

Handles what happens to training logs in practice:

* lines written in pieces: a line is yielded only once its newline is there (at EOF
  with ``exit_at_eof`` the unterminated rest counts as a line);
* truncation (``copytruncate`` rotation, or ``>`` on restart): reading restarts at 0;
* rotation by rename (``logrotate``, ``RotatingFileHandler``): the old file is read to
  its end, then the new file at the same path from its start; while the path is
  missing it waits for it to reappear;
* carriage returns (progress bars, CRLF): each ``\r``-separated piece is a line;
* undecodable bytes become U+FFFD instead of stopping the tail.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

logger = logging.getLogger(__name__)

_CHUNK_BYTES = 64 * 1024


class FileFollower:
    """Yields the lines appended to a file, following truncation and rotation.

    Attributes:
        path: The file followed.
        from_start: Start at the beginning instead of the current end.
        poll_interval_s: Sleep between checks for new data at EOF.
    """

    def __init__(
        self, path: Path | str, *, from_start: bool = False, poll_interval_s: float = 0.25
    ) -> None:
        """Describe the tail; nothing is opened until `lines`."""
        self.path = Path(path)
        self.from_start = from_start
        self.poll_interval_s = poll_interval_s

    def lines(
        self, stop: threading.Event | None = None, *, exit_at_eof: bool = False
    ) -> Iterator[str]:
        """Open the file now and iterate over its lines (without endings) as they are written.

        Args:
            stop: Set it to end the iteration at the next poll (e.g. from a signal).
            exit_at_eof: End at the first end of file instead of waiting for more.

        Raises:
            FileNotFoundError: The file does not exist when the iteration starts.
        """
        handle = self.path.open("rb")  # now, not at the first next(): the tail starts here
        try:
            # Started mid-line: the rest of that line is not a whole line; skip it.
            skip_first = not self.from_start and self._seek_end_mid_line(handle)
        except BaseException:
            handle.close()
            raise
        return self._follow(handle, skip_first, stop or threading.Event(), exit_at_eof)

    def _follow(
        self, handle: BinaryIO, skip_first: bool, stop: threading.Event, exit_at_eof: bool
    ) -> Iterator[str]:
        try:
            pending = b""
            while not stop.is_set():
                chunk = handle.read(_CHUNK_BYTES)
                if chunk:
                    *complete, pending = (pending + chunk).split(b"\n")
                    if skip_first and complete:
                        complete, skip_first = complete[1:], False
                    for raw in complete:
                        yield from _pieces(raw)
                    continue
                if exit_at_eof:
                    if pending and not skip_first:
                        yield from _pieces(pending)
                    return
                replacement = self._check_replaced(handle)
                if replacement is not None:
                    if pending and not skip_first:
                        yield from _pieces(pending)  # the old file is finished
                    pending, skip_first = b"", False
                    handle.close()
                    handle = replacement
                    continue
                if self._truncated(handle):
                    logger.info("%s was truncated; reading it from the start", self.path)
                    handle.seek(0)
                    pending, skip_first = b"", False
                    continue
                stop.wait(self.poll_interval_s)
        finally:
            handle.close()

    @staticmethod
    def _seek_end_mid_line(handle: BinaryIO) -> bool:
        """Go to the end of the file; True if its last line is unfinished."""
        end = handle.seek(0, os.SEEK_END)
        if end == 0:
            return False
        handle.seek(end - 1)
        return handle.read(1) != b"\n"

    def _check_replaced(self, handle: BinaryIO) -> BinaryIO | None:
        """A handle on a new file now at ``path`` (after rotation), else None."""
        try:
            current = os.stat(self.path)
        except FileNotFoundError:
            return None  # rotated away and not recreated yet: keep polling
        opened = os.fstat(handle.fileno())
        if (current.st_ino, current.st_dev) == (opened.st_ino, opened.st_dev):
            return None
        try:
            replacement = self.path.open("rb")
        except FileNotFoundError:
            return None
        logger.info("%s was replaced (rotated); following the new file", self.path)
        return replacement

    def _truncated(self, handle: BinaryIO) -> bool:
        try:
            size = os.fstat(handle.fileno()).st_size
        except OSError:
            return False
        return size < handle.tell()


def _pieces(raw: bytes) -> Iterator[str]:
    for piece in raw.decode("utf-8", errors="replace").split("\r"):
        if piece:
            yield piece


__all__ = ["FileFollower"]
