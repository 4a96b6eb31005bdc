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

Nothing a restart does deletes a checkpoint. A resume from step S moves the checkpoints past S
(and leftover ``.tmp`` directories) aside with ``os.rename`` into
``rolled_back/<label>/``; a commit over an existing step moves the old one to
``rolled_back/replaced-<time>/``. Only an operator deletes them (``runwatch checkpoints
prune``), and only ``--keep-checkpoints`` (`prune_checkpoints`), asked for explicitly,
deletes committed checkpoints on its own.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from runwatch.common.durable import fsync_dir

METADATA_FILE = ".metadata"
"""The file DCP writes last; its presence is half of completeness."""

TMP_SUFFIX = ".tmp"
"""Suffix of a checkpoint directory being written."""

ROLLED_BACK_DIR = "rolled_back"
"""Under a checkpoint root: what resumes and commits moved aside, kept until pruned."""

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
    the step again), it is moved aside into ``rolled_back/replaced-<time>/`` (never deleted)
    and the new one renamed in.

    Args:
        root: The checkpoint root.
        step: The checkpoint's step.

    Returns:
        The committed directory.

    Raises:
        FileNotFoundError: If the staging directory or its metadata is missing.
        CheckpointMoveError: If the old checkpoint cannot be moved aside (nothing deleted).
    """
    tmp, final = staging_dir(root, step), checkpoint_dir(root, step)
    if not (tmp / METADATA_FILE).is_file():
        raise FileNotFoundError(f"{tmp} has no {METADATA_FILE}: the write did not finish")
    if final.exists():
        target = new_set_aside_dir(root, f"replaced-{_utc_stamp()}")
        _move(final, target / final.name)
        fsync_dir(target)
    tmp.rename(final)
    fsync_dir(final.parent)
    return final


def prune_checkpoints(root: str | os.PathLike[str], keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints (``--keep-checkpoints``).

    An operator's retention policy, asked for explicitly; no restart path calls it.
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


class CheckpointMoveError(OSError):
    """A checkpoint could not be moved aside; nothing was deleted."""


def _utc_stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _move(src: Path, dst: Path) -> None:
    """``os.rename`` ``src`` to ``dst``: atomic, same file system, never a copy and delete."""
    try:
        os.rename(src, dst)
    except OSError as exc:
        why = (
            "it is on another file system (a mount inside the checkpoint root?)"
            if exc.errno == errno.EXDEV
            else exc.strerror or str(exc)
        )
        raise CheckpointMoveError(
            exc.errno, f"cannot move {src} aside to {dst}: {why}; nothing was deleted"
        ) from exc


def new_set_aside_dir(root: str | os.PathLike[str], label: str) -> Path:
    """Create a fresh directory ``<root>/rolled_back/<label>`` (``-2``, ``-3``... if taken).

    Args:
        root: The checkpoint root.
        label: The set's name, e.g. ``inc3-20261202T101500Z``.

    Returns:
        The new, empty directory.

    Raises:
        ValueError: If ``label`` is not one plain path component.
    """
    if not label or label in (".", "..") or "/" in label or os.sep in label:
        raise ValueError(f"set-aside label {label!r} must be one plain path component")
    parent = Path(root) / ROLLED_BACK_DIR
    parent.mkdir(exist_ok=True)
    for n in range(1, 10_000):
        path = parent / (label if n == 1 else f"{label}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        fsync_dir(parent)
        return path
    raise FileExistsError(f"{parent / label}: 9999 sets of that name exist")


def set_aside_after(root: str | os.PathLike[str], step: int, *, label: str) -> list[Path]:
    """Move the abandoned future of a resume from ``step`` aside; delete nothing.

    A gang resumed from step S writes a new history after S; complete checkpoints past S
    belong to the abandoned one (possibly poisoned, the reason for a rollback) and must
    never be picked as "latest" by a later restart. Leftover ``.tmp`` staging directories
    (writes a crash interrupted) go with them. Each is renamed, atomically, into
    ``<root>/rolled_back/<label>/`` and stays there until an operator prunes it
    (`prune_set_aside`, ``runwatch checkpoints prune``). Call it on the coordinator before
    the gang's first save, never while a save is running.

    Args:
        root: The checkpoint root.
        step: The step resumed from (0: from scratch).
        label: Names the set, e.g. ``inc<incarnation>-<utc time>``.

    Returns:
        The new paths of what was moved (empty, and no directory made, if nothing was).

    Raises:
        CheckpointMoveError: If a move fails (another file system); nothing is deleted, and
            what was moved before it stays moved.
    """
    base = Path(root)
    if not base.is_dir():
        return []
    future = [path for s, path in list_complete_checkpoints(base) if s > step]
    staging = sorted(
        p
        for p in base.iterdir()
        if p.is_dir()
        and p.name.endswith(TMP_SUFFIX)
        and checkpoint_step(p.name[: -len(TMP_SUFFIX)]) is not None
    )
    if not future and not staging:
        return []
    target = new_set_aside_dir(base, label)
    moved = []
    for path in [*future, *staging]:
        _move(path, target / path.name)
        moved.append(target / path.name)
    fsync_dir(target)
    fsync_dir(base)
    return moved


@dataclass(frozen=True)
class SetAside:
    """One set of checkpoints a resume or a commit moved aside.

    Attributes:
        name: Its directory's name under ``rolled_back/``.
        path: That directory.
        entries: The names moved into it (``step_000030``, ``step_000040.tmp``...), sorted.
        size_bytes: Total size of its files.
    """

    name: str
    path: Path
    entries: tuple[str, ...]
    size_bytes: int


def list_set_aside(root: str | os.PathLike[str]) -> list[SetAside]:
    """Every set under ``<root>/rolled_back/``, by name."""
    parent = Path(root) / ROLLED_BACK_DIR
    if not parent.is_dir():
        return []
    return [
        SetAside(
            name=d.name,
            path=d,
            entries=tuple(sorted(p.name for p in d.iterdir())),
            size_bytes=directory_size_bytes(d),
        )
        for d in sorted(parent.iterdir())
        if d.is_dir()
    ]


def prune_set_aside(root: str | os.PathLike[str], names: Iterable[str]) -> list[Path]:
    """Delete the named sets under ``<root>/rolled_back/``: the one deleting path, an operator's.

    Args:
        root: The checkpoint root.
        names: Names of sets (as `list_set_aside` gives them).

    Returns:
        The directories removed.

    Raises:
        ValueError: If a name is not a set there (nothing is removed then).
    """
    known = {s.name: s.path for s in list_set_aside(root)}
    wanted = list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(
            f"no set {', '.join(map(repr, unknown))} under {Path(root) / ROLLED_BACK_DIR}"
        )
    for name in wanted:
        shutil.rmtree(known[name])
    return [known[n] for n in wanted]


def directory_size_bytes(path: str | os.PathLike[str]) -> int:
    """Total size of the regular files under ``path``."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
