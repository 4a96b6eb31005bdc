"""Durable file writes: what survives a crash at any instant, in one place.

Controller state, the alert delivery log, the archive and checkpoints all need the same
two moves: replace a file atomically (write a sibling, fsync it, rename over the target,
fsync the directory so the rename itself is on disk) and append a record that is on disk
when the call returns.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(tmp: Path, path: Path) -> None:
    """Durably rename the fully written ``tmp`` over ``path`` (same directory)."""
    with tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: readers see the old or the new file, never a mix."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    replace_file(tmp, path)


def append_durably(path: Path, data: bytes) -> None:
    """Append ``data`` to ``path`` (created if missing); on disk when this returns."""
    new = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    if new:
        fsync_dir(path.parent)
