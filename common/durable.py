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


def open_private(path: Path, flags: int, mode: int) -> int:
    """``os.open`` with ``mode`` enforced even on an existing file (and whatever the umask)."""
    fd = os.open(path, flags | os.O_CREAT, mode)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data``: readers see the old or the new file, never a mix.

    Args:
        path: The file.
        data: Its new content.
        mode: The file's permission bits (0o600 for a file holding secrets).
    """
    tmp = path.with_name(f".{path.name}.tmp")
    fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    replace_file(tmp, path)


def append_durably(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Append ``data`` to ``path`` (created with ``mode`` if missing); on disk on return."""
    new = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    if new:
        fsync_dir(path.parent)
