"""The archive sink: every record of every runwatch topic, appended per run to Parquet.

Rows keep the exact wire bytes with their (topic, partition, offset), so an audit from the
archive decodes exactly what Kafka held, long after Kafka's retention dropped it. Files are
written atomically (a hidden temp file, fsync, rename) and named after the offsets they
hold (see `sinks.archive_layout`); on start and after every rebalance the high-water marks
are read back from the file names, and records at or below them are skipped. A crash
between writing a file and committing the offsets therefore never duplicates a row.

Every ``compact_interval_s`` the files of the streams this instance owns are merged into
one per stream per closed hour (`sinks.archive_compact`), so ticks and steady streams do
not leave a file per flush for good.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.parquet as pq

from runwatch.common.durable import replace_file
from runwatch.common.isolate import BadRecords
from runwatch.schemas.records import RawRecord
from runwatch.sinks.archive_compact import compact
from runwatch.sinks.archive_layout import (
    SUFFIX,
    Stream,
    high_water_marks,
    parse_path,
    relative_path,
    row_of,
    stream_of,
)
from runwatch.sinks.consumer import TopicPartitionKey

logger = logging.getLogger(__name__)

SCHEMA: Final = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp_ms", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("type", pa.string()),
        ("run_id", pa.string()),
        ("step", pa.int64()),
        ("ts_ns", pa.int64()),
    ]
)


def scan_marks(root: Path) -> dict[Stream, int]:
    """The archive's high-water mark of every stream, from its file names only."""
    spans = (parse_path(p) for p in root.glob(f"run_id=*/*{SUFFIX}"))
    return high_water_marks(s for s in spans if s is not None)


def write_file(root: Path, stream: Stream, records: Sequence[RawRecord]) -> Path:
    """Write one stream's records (offset order) to a new file, atomically.

    Returns:
        The file's path.
    """
    path = root / relative_path(stream, records[0].offset, records[-1].offset)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    rows = [row_of(r) for r in records]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    pq.write_table(table, tmp, compression="zstd")
    replace_file(tmp, path)
    return path


class ArchiveSink:
    """Buffers records per stream and writes one file per stream per flush.

    Args:
        root: The archive directory.
        flush_records: Flush when this many records are buffered.
        flush_interval_s: Flush buffered records at least this often.
        compact_interval_s: Compact the owned streams this often (0: never); the first
            compaction runs at most a minute after the first assignment.
        compact_budget_s: Longest one compaction step runs before polling resumes.
        wall_ms: Wall clock in milliseconds (which hours are closed).
    """

    name = "archive"

    def __init__(
        self,
        root: Path,
        *,
        flush_records: int = 20_000,
        flush_interval_s: float = 5.0,
        compact_interval_s: float = 3600.0,
        compact_budget_s: float = 10.0,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.root = root
        self.flush_records = flush_records
        self.flush_interval_s = flush_interval_s
        self.compact_interval_s = compact_interval_s
        self.compact_budget_s = compact_budget_s
        self.wall_ms = wall_ms
        self.assigned: set[TopicPartitionKey] = set()
        self.next_compact_s: float | None = None
        self.files_merged = 0
        self.root.mkdir(parents=True, exist_ok=True)
        self.marks: dict[Stream, int] = scan_marks(root)
        self.buffer: dict[Stream, list[RawRecord]] = {}
        self.buffered = 0
        self.oldest_s: float | None = None
        self.rows_written = 0
        self.skipped = 0
        self.files_written = 0
        self.bad = BadRecords("sink archive", logger)

    def on_assigned(self, partitions: Sequence[TopicPartitionKey]) -> None:
        """Re-read the high-water marks (another instance may have written meanwhile)."""
        self.marks = scan_marks(self.root)
        self.assigned = set(partitions)

    def handle(self, records: Sequence[RawRecord], now_s: float) -> None:
        """Buffer the records not archived yet."""
        for record in records:
            stream = stream_of(record)
            if record.offset <= self.marks.get(stream, -1):
                self.skipped += 1
                continue
            self.buffer.setdefault(stream, []).append(record)
            self.marks[stream] = record.offset
            self.buffered += 1
        if self.buffered and self.oldest_s is None:
            self.oldest_s = now_s
        if self.buffered >= self.flush_records:
            self.flush()

    def tick(self, now_s: float) -> None:
        """Flush when the oldest buffered record has waited `flush_interval_s`."""
        if self.oldest_s is not None and now_s - self.oldest_s >= self.flush_interval_s:
            self.flush()
        if self.compact_interval_s > 0 and self.assigned:
            if self.next_compact_s is None:
                self.next_compact_s = now_s + min(60.0, self.compact_interval_s)
            elif now_s >= self.next_compact_s:
                self.compact(now_s)

    def compact(self, now_s: float = 0.0) -> None:
        """Merge the owned streams' files of closed hours (a step of it, if large)."""
        stats = compact(self.root, self.wall_ms(), self.assigned, budget_s=self.compact_budget_s)
        self.files_merged += stats.merged_files
        self.next_compact_s = now_s + (self.compact_interval_s if stats.done else 0.0)

    def flush(self) -> None:
        """Write every buffered stream to its own file.

        A stream whose file cannot be written (the file system refuses its name, say) is
        counted in `bad` and logged once per reason, and stays buffered: its partition's
        offsets are not committed past it, so nothing is lost, and the other streams
        are written.
        """
        kept: dict[Stream, list[RawRecord]] = {}
        for stream, records in sorted(self.buffer.items()):
            try:
                write_file(self.root, stream, records)
            except Exception as exc:
                self.bad.note("archive write", exc, stream)
                kept[stream] = records
                continue
            self.rows_written += len(records)
            self.files_written += 1
        self.buffer = kept
        self.buffered = sum(len(r) for r in kept.values())
        self.oldest_s = None

    def pending_offsets(self) -> Mapping[TopicPartitionKey, int]:
        """Lowest buffered offset per partition."""
        out: dict[TopicPartitionKey, int] = {}
        for stream, records in self.buffer.items():
            tp = (stream.topic, stream.partition)
            out[tp] = min(out.get(tp, records[0].offset), records[0].offset)
        return out

    def on_lag(self, lag: Mapping[TopicPartitionKey, int]) -> None:
        """Not used by the archive."""
