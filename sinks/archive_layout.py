"""Where the archive keeps each record, and what a row of it holds (pure functions).

Layout (Hive-style, so DuckDB, pandas and Spark read it as one table)::

    DIR/run_id=<run>/<topic>-<partition>-<first offset>-<last offset>.parquet

One file per flush, per run, per topic partition; offsets are zero-padded to 20 digits so
names sort in offset order. Ticks (key ``*``) go under ``run_id=_ticks``, records without a
key under ``run_id=_unkeyed``. The directory is chosen from the record *key* (the run id by
contract), never from the decoded value, so it is a pure function of the record and the
resume rule below holds even for bytes that do not decode.

A run id is URL-quoted into the directory name, which can make it three times longer: a
valid run id of 100 ``/`` (``%2F`` each) became a 307-byte name, past the 255 bytes a file
name may have, and the sink stopped on it at every start. A quoted name longer than
`MAX_RUN_DIR_CHARS` is shortened to its first `KEEP_RUN_DIR_CHARS` characters, ``+`` and a
hash of the whole key: still a pure function of the key, and never equal to a name that
was not shortened (quoting escapes every ``+``).

Resume rule: the records of one (run directory, topic, partition) are written in offset
order, so the largest last offset in the file names of that triple is the archive's
high-water mark for it; a record at or below it is already archived and is skipped.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final, NamedTuple
from urllib.parse import quote, unquote

from runwatch.schemas.codec import DecodeError, decode
from runwatch.schemas.events import TICK_RUN_ID, event_name
from runwatch.schemas.records import RawRecord

TICKS_DIR: Final = "_ticks"
UNKEYED_DIR: Final = "_unkeyed"
MAX_RUN_DIR_CHARS: Final = 160
"""Longest run directory value kept as the quoted run id (``run_id=`` and it stay far
below the 255 bytes of a file name)."""
KEEP_RUN_DIR_CHARS: Final = 100
"""Characters of the quoted run id a shortened directory value keeps, for humans."""
SHORTENED: Final = "+"
"""Separates a shortened directory value's prefix from its hash (quoting escapes ``+``)."""
OFFSET_DIGITS: Final = 20
SUFFIX: Final = ".parquet"
COLUMNS: Final[tuple[str, ...]] = (
    "topic",
    "partition",
    "offset",
    "timestamp_ms",
    "key",
    "value",
    "type",
    "run_id",
    "step",
    "ts_ns",
)
_NAME = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)-(?P<first>\d+)-(?P<last>\d+)\.parquet$")


class Stream(NamedTuple):
    """The unit of ordering in the archive: one run directory of one topic partition."""

    run_dir: str
    topic: str
    partition: int


class FileSpan(NamedTuple):
    """What an archive file name says about the file."""

    stream: Stream
    first_offset: int
    last_offset: int


def run_dir_of_key(key: bytes | None) -> str:
    """The run directory value (after ``run_id=``) of a record with ``key``."""
    if key is None:
        return UNKEYED_DIR
    text = key.decode("utf-8", "replace")
    if text == TICK_RUN_ID:
        return TICKS_DIR
    quoted = quote(text, safe="-_.~") or UNKEYED_DIR
    if len(quoted) <= MAX_RUN_DIR_CHARS:
        return quoted
    digest = hashlib.blake2b(key, digest_size=10).hexdigest()
    head = quoted[:KEEP_RUN_DIR_CHARS]
    if "%" in head[-2:]:  # never cut an escape in half
        head = head[: head.rindex("%")]
    return f"{head}{SHORTENED}{digest}"


def run_dir_of_run(run_id: str) -> str:
    """The run directory value of a run id (as `run_dir_of_key` gives for its records)."""
    return run_dir_of_key(run_id.encode())


def stream_of(record: RawRecord) -> Stream:
    """The stream a record belongs to."""
    return Stream(run_dir_of_key(record.key), record.topic, record.partition)


def file_name(stream: Stream, first_offset: int, last_offset: int) -> str:
    """The file name (within its run directory) of a flush of ``stream``."""
    return (
        f"{stream.topic}-{stream.partition}-"
        f"{first_offset:0{OFFSET_DIGITS}d}-{last_offset:0{OFFSET_DIGITS}d}{SUFFIX}"
    )


def relative_path(stream: Stream, first_offset: int, last_offset: int) -> str:
    """``run_id=<run>/<file name>``."""
    return f"run_id={stream.run_dir}/{file_name(stream, first_offset, last_offset)}"


def parse_path(path: Path) -> FileSpan | None:
    """The span an archive file's path names; None for anything else (temp files)."""
    parent = path.parent.name
    if not parent.startswith("run_id="):
        return None
    match = _NAME.match(path.name)
    if match is None:
        return None
    stream = Stream(parent[len("run_id=") :], match["topic"], int(match["partition"]))
    return FileSpan(stream, int(match["first"]), int(match["last"]))


def high_water_marks(spans: Iterable[FileSpan]) -> dict[Stream, int]:
    """The largest archived offset of every stream."""
    out: dict[Stream, int] = {}
    for span in spans:
        if span.last_offset > out.get(span.stream, -1):
            out[span.stream] = span.last_offset
    return out


def is_archived(record: RawRecord, marks: dict[Stream, int]) -> bool:
    """True when ``record`` is at or below its stream's high-water mark."""
    return record.offset <= marks.get(stream_of(record), -1)


def row_of(record: RawRecord) -> dict[str, Any]:
    """One archive row: the record's position and exact bytes, plus decoded columns.

    ``type``, ``run_id``, ``step`` and ``ts_ns`` are there for queries; they are None when
    the value does not decode (the raw bytes are always kept).
    """
    row: dict[str, Any] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "key": record.key,
        "value": record.value,
        "type": None,
        "run_id": None,
        "step": None,
        "ts_ns": None,
    }
    if record.value is not None:
        try:
            event = decode(record.value)
        except DecodeError:
            return row
        step = getattr(event, "step", None)
        row.update(
            type=event_name(event),
            run_id=event.run_id,
            step=step if isinstance(step, int) else None,
            ts_ns=event.ts_ns,
        )
    return row


def record_of(row: dict[str, Any]) -> RawRecord:
    """The Kafka record an archive row holds (the inverse of `row_of` for the position)."""
    return RawRecord(
        row["topic"],
        int(row["partition"]),
        int(row["offset"]),
        row["key"],
        row["value"],
        int(row["timestamp_ms"] or 0),
    )


def run_of_dir(run_dir: str) -> str | None:
    """The run id a run directory value stands for (inverse of `run_dir_of_run`).

    None for a shortened value (its rows' ``run_id`` column says which run it is).
    """
    if SHORTENED in run_dir:
        return None
    return unquote(run_dir)
