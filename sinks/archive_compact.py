"""Compaction of the archive: one file per stream per hour instead of one per flush.

The archive sink writes one file per flush (every few seconds) per run per topic
partition; the clock's ticks alone make tens of thousands of small files a day. A
compaction merges, within each stream (`sinks.archive_layout.Stream`), the consecutive
files whose first record falls in the same UTC hour (broker time) into one file named
after the offsets it holds, once that hour is over. Hours are never merged across, so a
closed hour is rewritten once and never again.

Crash safety: the merged file is written atomically (hidden temp, fsync, rename) before
any input is removed. A crash in between leaves inputs whose records the merged file
also holds; readers drop duplicate positions (`sinks.archive_read.group_by_topic`), the
high-water marks are unchanged (same largest offset), and the next compaction removes a
file whose records another file holds (checked by reading both, not trusted from names).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from runwatch.common.durable import fsync_dir, replace_file
from runwatch.sinks.archive_layout import SUFFIX, FileSpan, Stream, parse_path, relative_path

logger = logging.getLogger(__name__)

HOUR_MS = 3_600_000


class ArchiveFile(NamedTuple):
    """One archive file and what compaction needs to know of it.

    Attributes:
        path: Where it is.
        span: Its stream and offsets, from its name.
        hour: ``first timestamp_ms // HOUR_MS`` of its rows.
    """

    path: Path
    span: FileSpan
    hour: int


class CompactionStats(NamedTuple):
    """What one compaction did."""

    merged_files: int
    written_files: int
    removed_leftovers: int
    done: bool = True


def plan_merges(files: Iterable[ArchiveFile], before_hour: int) -> list[list[ArchiveFile]]:
    """The groups to merge: consecutive files of one stream and one closed hour (pure).

    Args:
        files: Files of any streams.
        before_hour: Only hours before this one are closed.

    Returns:
        Groups of two files or more, each in offset order.
    """
    by_stream: dict[Stream, list[ArchiveFile]] = {}
    for f in files:
        by_stream.setdefault(f.span.stream, []).append(f)
    out: list[list[ArchiveFile]] = []
    for stream in sorted(by_stream):
        run: list[ArchiveFile] = []
        for f in sorted(by_stream[stream], key=lambda f: f.span.first_offset):
            if run and (f.hour != run[0].hour or f.span.first_offset <= run[-1].span.last_offset):
                if len(run) > 1:
                    out.append(run)
                run = []
            if f.hour < before_hour:
                run.append(f)
        if len(run) > 1:
            out.append(run)
    return out


def covered(spans: list[FileSpan]) -> list[tuple[int, int]]:
    """``(inner, outer)`` indexes of spans inside another span of the same stream (pure)."""
    out = []
    for i, a in enumerate(spans):
        for j, b in enumerate(spans):
            if (
                i != j
                and a.stream == b.stream
                and b.first_offset <= a.first_offset
                and a.last_offset <= b.last_offset
                and (a.first_offset, a.last_offset) != (b.first_offset, b.last_offset)
            ):
                out.append((i, j))
                break
    return out


def _first_hour(path: Path) -> int:
    ts = pq.read_table(path, columns=["timestamp_ms"]).column(0)
    first = ts[0].as_py() if len(ts) else 0
    return int(first or 0) // HOUR_MS


def _offsets(path: Path) -> set[int]:
    return set(pq.read_table(path, columns=["offset"]).column(0).to_pylist())


def _files(
    root: Path, partitions: Collection[tuple[str, int]] | None
) -> list[tuple[Path, FileSpan]]:
    out = []
    for path in sorted(root.glob(f"run_id=*/*{SUFFIX}")):
        span = parse_path(path)
        if span is None:
            continue
        if partitions is not None and (span.stream.topic, span.stream.partition) not in partitions:
            continue
        out.append((path, span))
    return out


def _remove(paths: Iterable[Path]) -> None:
    parents = set()
    for path in paths:
        path.unlink(missing_ok=True)
        parents.add(path.parent)
    for parent in parents:
        fsync_dir(parent)


def _merge(root: Path, group: list[ArchiveFile]) -> None:
    stream = group[0].span.stream
    path = root / relative_path(stream, group[0].span.first_offset, group[-1].span.last_offset)
    tables = [pq.read_table(f.path) for f in group]
    table = pa.concat_tables(tables).sort_by("offset")
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, compression="zstd")
    replace_file(tmp, path)
    _remove(f.path for f in group)


def compact(
    root: Path,
    now_ms: int,
    partitions: Collection[tuple[str, int]] | None = None,
    *,
    budget_s: float | None = None,
) -> CompactionStats:
    """Merge each stream's files per closed hour (see the module docstring).

    Args:
        root: The archive directory.
        now_ms: Wall time; the hour it falls in is still open and left alone.
        partitions: Only streams of these ``(topic, partition)`` (the ones this process
            owns); None for all.
        budget_s: Stop merging after about this long (the rest waits for the next call,
            so a consumer loop keeps polling); None: no limit.

    Returns:
        What was merged and removed.
    """
    found = _files(root, partitions)
    leftovers = []
    for inner, outer in covered([s for _, s in found]):
        if _offsets(found[inner][0]) <= _offsets(found[outer][0]):
            leftovers.append(found[inner][0])
    _remove(leftovers)
    gone = set(leftovers)
    files = [ArchiveFile(p, s, _first_hour(p)) for p, s in found if p not in gone]
    groups = plan_merges(files, now_ms // HOUR_MS)
    started = time.monotonic()
    done: list[list[ArchiveFile]] = []
    for group in groups:
        if budget_s is not None and time.monotonic() - started > budget_s:
            break
        _merge(root, group)
        done.append(group)
    stats = CompactionStats(
        sum(len(g) for g in done), len(done), len(leftovers), len(done) == len(groups)
    )
    if groups or leftovers:
        logger.info("archive compaction: %s", stats)
    return stats
