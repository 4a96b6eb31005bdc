"""Where checkpoints live on disk and when one counts as complete. Standard library only.

The controller resolves checkpoints without importing torch, so this module knows nothing of
DCP beyond its ``.metadata`` file name.

Layout under a checkpoint root::

    step_000012.tmp/   being written: every rank writes its DCP shards here
    step_000012/       committed: renamed from .tmp by the coordinator after DCP finished

Commit protocol: DCP writes ``.metadata`` last, on the coordinator, after every rank's shards
are written (the coordinator gathers every rank's write results first). When the coordinator's
save has returned, it renames ``step_N.tmp`` to ``step_N`` (one atomic ``rename`` on a POSIX
file system) and fsyncs the root. A checkpoint is complete when its directory is named
``step_<digits>`` (no suffix) and holds ``.metadata``; anything else (``.tmp`` directories, a
bare ``step_N`` without metadata, foreign files) is ignored by every reader here.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from runwatch.common.durable import fsync_dir

METADATA_FILE = ".metadata"
"""The file DCP writes last; its presence is half of completeness."""

TMP_SUFFIX = ".tmp"
"""Suffix of a checkpoint directory being written."""

_NAME = re.compile(r"^step_(\d+)$")


def checkpoint_dir(root: str | os.PathLike[str], step: int) -> Path:
    """The committed directory of the checkpoint of ``step`` (zero-padded to six digits)."""
    return Path(root) / f"step_{step:06d}"


def staging_dir(root: str | os.PathLike[str], step: int) -> Path:
    """The directory the checkpoint of ``step`` is written to before its commit."""
    final = checkpoint_dir(root, step)
    return final.with_name(final.name + TMP_SUFFIX)


def checkpoint_step(path: str | os.PathLike[str]) -> int | None:
    """The step a committed checkpoint directory's name encodes, or None if it is not one."""
    match = _NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


def is_complete_checkpoint(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` is a committed checkpoint: named ``step_<n>`` and holding metadata."""
    p = Path(path)
    return checkpoint_step(p) is not None and p.is_dir() and (p / METADATA_FILE).is_file()


def list_complete_checkpoints(root: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Every complete checkpoint under ``root`` as ``(step, path)``, oldest first.

    Args:
        root: The checkpoint root; a missing root has no checkpoints.

    Returns:
        Sorted by step.
    """
    base = Path(root)
    if not base.is_dir():
        return []
    found = []
    for child in base.iterdir():
        step = checkpoint_step(child)
        if step is not None and is_complete_checkpoint(child):
            found.append((step, child))
    return sorted(found)


def latest_complete_checkpoint(
    root: str | os.PathLike[str], at_or_before: int | None = None
) -> tuple[int, Path] | None:
    """The newest complete checkpoint, optionally no newer than a step. A pure read of the disk.

    Args:
        root: The checkpoint root.
        at_or_before: Consider only checkpoints of this step or earlier (a rollback's bound,
            as in ``RestartRequested.max_checkpoint_step``); None: no bound.

    Returns:
        ``(step, path)``, or None when there is no such checkpoint.
    """
    candidates = [
        (step, path)
        for step, path in list_complete_checkpoints(root)
        if at_or_before is None or step <= at_or_before
    ]
    return candidates[-1] if candidates else None


def commit_checkpoint(root: str | os.PathLike[str], step: int) -> Path:
    """Promote a fully written staging directory to a committed checkpoint.

    If a committed checkpoint of the same step exists (a gang that rolled back and passed
    the step again), it is replaced: moved aside, the new one renamed in, the old one removed.

    Args:
        root: The checkpoint root.
        step: The checkpoint's step.

    Returns:
        The committed directory.

    Raises:
        FileNotFoundError: If the staging directory or its metadata is missing.
    """
    tmp, final = staging_dir(root, step), checkpoint_dir(root, step)
    if not (tmp / METADATA_FILE).is_file():
        raise FileNotFoundError(f"{tmp} has no {METADATA_FILE}: the write did not finish")
    old = final.with_name(final.name + ".replaced")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)
    return final


def prune_checkpoints(root: str | os.PathLike[str], keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints.

    Call it only after the newest checkpoint is committed, so a crash mid-prune still leaves
    at least ``keep`` complete checkpoints.

    Args:
        root: The checkpoint root.
        keep: How many to keep; at least 1.

    Returns:
        The directories removed.

    Raises:
        ValueError: If ``keep`` is below 1.
    """
    if keep < 1:
        raise ValueError("keep must be at least 1")
    doomed = [path for _, path in list_complete_checkpoints(root)[:-keep]]
    for path in doomed:
        shutil.rmtree(path)
    return doomed


def discard_checkpoints_after(root: str | os.PathLike[str], step: int) -> list[Path]:
    """Delete complete checkpoints newer than ``step``: the abandoned future of a rollback.

    A gang resumed from step S writes a new history after S; older checkpoints past S belong
    to the abandoned one (possibly poisoned, the reason for the rollback) and must never be
    picked as "latest" by a later restart.

    Args:
        root: The checkpoint root.
        step: The step resumed from.

    Returns:
        The directories removed.
    """
    doomed = [path for s, path in list_complete_checkpoints(root) if s > step]
    for path in doomed:
        shutil.rmtree(path)
    return doomed


def remove_staging_dirs(root: str | os.PathLike[str]) -> list[Path]:
    """Delete leftover ``.tmp`` directories (writes a crash interrupted).

    Call it on the coordinator before the gang's first save, never while a save is running.

    Args:
        root: The checkpoint root.

    Returns:
        The directories removed.
    """
    base = Path(root)
    if not base.is_dir():
        return []
    doomed = [
        p
        for p in base.iterdir()
        if p.is_dir()
        and p.name.endswith(TMP_SUFFIX)
        and checkpoint_step(p.name[: -len(TMP_SUFFIX)]) is not None
    ]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def directory_size_bytes(path: str | os.PathLike[str]) -> int:
    """Total size of the regular files under ``path``."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
