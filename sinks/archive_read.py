"""Read a run's history back from the archive as the Kafka records it was made of.

The audit takes the result exactly as it takes history read from Kafka
(`processors.audit.records_of_run`), so an audit from the archive and one from Kafka run
one code path.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pyarrow.parquet as pq

from runwatch.processors.audit import RunLog, records_of_run
from runwatch.schemas.records import RawRecord
from runwatch.schemas.topics import names
from runwatch.sinks.archive_layout import (
    SUFFIX,
    TICKS_DIR,
    UNKEYED_DIR,
    FileSpan,
    parse_path,
    record_of,
    run_dir_of_run,
    run_of_dir,
)

_READ_COLUMNS = ["topic", "partition", "offset", "timestamp_ms", "key", "value"]


def _spans(root: Path, run_dir: str) -> list[tuple[Path, FileSpan]]:
    out = []
    for path in sorted((root / f"run_id={run_dir}").glob(f"*{SUFFIX}")):
        span = parse_path(path)
        if span is not None:
            out.append((path, span))
    return out


def read_records(paths: Iterable[Path]) -> list[RawRecord]:
    """Every record held by the archive files ``paths``."""
    out: list[RawRecord] = []
    for path in paths:
        table = pq.read_table(path, columns=_READ_COLUMNS)
        out.extend(record_of(row) for row in table.to_pylist())
    return out


def group_by_topic(records: Iterable[RawRecord]) -> dict[str, list[RawRecord]]:
    """Records by topic, each in (partition, offset) order, one per position."""
    unique = {(r.topic, r.partition, r.offset): r for r in records}
    out: dict[str, list[RawRecord]] = {}
    for topic, partition, offset in sorted(unique):
        out.setdefault(topic, []).append(unique[(topic, partition, offset)])
    return out


def run_history(root: Path, run_id: str, heartbeats_topic: str) -> dict[str, list[RawRecord]]:
    """A run's archived records, plus the ticks of the heartbeat partitions it used.

    Args:
        root: The archive directory.
        run_id: The run.
        heartbeats_topic: The full name of the heartbeats topic (ticks live there).

    Returns:
        Topic name -> records, each partition in offset order, partitions ascending.
    """
    own = _spans(root, run_dir_of_run(run_id))
    hb_partitions = {s.stream.partition for _, s in own if s.stream.topic == heartbeats_topic}
    ticks = [
        path
        for path, span in _spans(root, TICKS_DIR)
        if span.stream.topic == heartbeats_topic and span.stream.partition in hb_partitions
    ]
    return group_by_topic(read_records([p for p, _ in own] + ticks))


def archived_prefixes(root: Path) -> set[str]:
    """Topic prefixes found in the archive (``<prefix>.steps`` and so on)."""
    prefixes = set()
    for path in root.glob(f"run_id=*/*{SUFFIX}"):
        span = parse_path(path)
        if span is not None and "." in span.stream.topic:
            prefixes.add(span.stream.topic.rsplit(".", 1)[0])
    return prefixes


def archived_run_ids(root: Path) -> tuple[list[str], list[str]]:
    """The run ids the archive has directories of, and the shortened directory names.

    Returns:
        Run ids, sorted; and the directory values of runs whose id was shortened (not
        read back by id), sorted. The ticks' and unkeyed records' directories are left out.
    """
    runs: set[str] = set()
    shortened: set[str] = set()
    for path in root.glob("run_id=*"):
        value = path.name[len("run_id=") :]
        if not path.is_dir() or value in (TICKS_DIR, UNKEYED_DIR):
            continue
        run_id = run_of_dir(value)
        if run_id is None:
            shortened.add(value)
        else:
            runs.add(run_id)
    return sorted(runs), sorted(shortened)


def load_archived_run_log(root: Path, prefix: str, run_id: str) -> RunLog:
    """A run's log read from the archive, decoded as `processors.audit.load_run_log` does."""
    topics = names(prefix)
    return records_of_run(run_id, run_history(root, run_id, topics.heartbeats), topics)
