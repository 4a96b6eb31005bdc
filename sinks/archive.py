"""The archive sink: every record of every runwatch topic, appended per run to Parquet.

Rows keep the exact wire bytes with their (topic, partition, offset), so an audit from the
archive decodes exactly what Kafka held, long after Kafka's retention dropped it. Files are
written atomically (a hidden temp file, fsync, rename) and named after the offsets they
hold (see `sinks.archive_layout`); on start and after every rebalance the high-water marks
are read back from the file names, and records at or below them are skipped. A crash
between writing a file and committing the offsets therefore never duplicates a row.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.parquet as pq

from processors.intake import RawRecord
from runwatch.durable import replace_file
from sinks.archive_layout import (
    SUFFIX,
    Stream,
    high_water_marks,
    parse_path,
    relative_path,
    row_of,
    stream_of,
)
from sinks.consumer import TopicPartitionKey

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
    """

    name = "archive"

    def __init__(
        self, root: Path, *, flush_records: int = 20_000, flush_interval_s: float = 5.0
    ) -> None:
        self.root = root
        self.flush_records = flush_records
        self.flush_interval_s = flush_interval_s
        self.root.mkdir(parents=True, exist_ok=True)
        self.marks: dict[Stream, int] = scan_marks(root)
        self.buffer: dict[Stream, list[RawRecord]] = {}
        self.buffered = 0
        self.oldest_s: float | None = None
        self.rows_written = 0
        self.skipped = 0
        self.files_written = 0

    def on_assigned(self, partitions: Sequence[TopicPartitionKey]) -> None:
        """Re-read the high-water marks (another instance may have written meanwhile)."""
        self.marks = scan_marks(self.root)

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

    def flush(self) -> None:
        """Write every buffered stream to its own file."""
        for stream, records in sorted(self.buffer.items()):
            write_file(self.root, stream, records)
            self.rows_written += len(records)
            self.files_written += 1
        self.buffer.clear()
        self.buffered = 0
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
