"""File helpers for the broker package: atomic JSON writes, private files, locks, log tails."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runwatch.common.durable import atomic_write


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` as indented JSON, atomically."""
    atomic_write(path, (json.dumps(payload, indent=2) + "\n").encode())


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600), atomically.

    The directory is created 0700 if missing. The file is made 0600 before anything is
    written to it, so no other user can ever read a secret from it.
    """
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def no_lock() -> Iterator[None]:
    """A lock that locks nothing (for a data directory that does not exist)."""
    yield


def tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` non-blank lines of ``path`` (none when it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]
