from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from processors.audit import records_of_run
from processors.intake import RawRecord
from schemas.codec import encode, encode_key
from schemas.topics import names
from sinks.archive import ArchiveSink, scan_marks
from sinks.archive_layout import (
    Stream,
    file_name,
    high_water_marks,
    parse_path,
    row_of,
    run_dir_of_key,
    run_of_dir,
)
from sinks.archive_read import archived_prefixes, load_archived_run_log, run_history

from .events import anomaly, heartbeat, started, step, tick

T = names("p")


def rec(topic, partition, offset, event=None, key=None, value=None):
    if event is not None:
        key = b"*" if event.run_id == "*" else encode_key(event.run_id)
        value = encode(event)
    return RawRecord(topic, partition, offset, key, value, 1000 + offset)


@pytest.mark.parametrize(
    ("key", "run_dir"),
    [
        (b"r1", "r1"),
        (b"*", "_ticks"),
        (None, "_unkeyed"),
        (b"", "_unkeyed"),
        (b"a/b c", "a%2Fb%20c"),
    ],
)
def test_run_dir_of_key(key, run_dir):
    assert run_dir_of_key(key) == run_dir
    if key:
        assert run_of_dir(run_dir) in (key.decode(), "_ticks")


@pytest.mark.parametrize(
    ("topic", "partition", "first", "last"),
    [("p.steps", 0, 0, 9), ("my-prefix.heartbeats", 12, 5, 123456789012)],
)
def test_file_name_round_trips(tmp_path, topic, partition, first, last):
    stream = Stream("r1", topic, partition)
    path = tmp_path / "run_id=r1" / file_name(stream, first, last)
    span = parse_path(path)
    assert span is not None and span.stream == stream
    assert (span.first_offset, span.last_offset) == (first, last)


@pytest.mark.parametrize(
    "path", ["run_id=r1/.x.parquet.tmp", "other/p.steps-0-1-2.parquet", "run_id=r1/notes.txt"]
)
def test_other_files_are_not_archive_files(path):
    assert parse_path(Path(path)) is None


def test_high_water_marks_per_stream():
    a, b = Stream("r1", "t", 0), Stream("r2", "t", 0)
    spans = [
        parse_path(Path(f"run_id={s.run_dir}") / file_name(s, f, last))
        for s, f, last in [(a, 0, 4), (a, 5, 9), (b, 2, 3)]
    ]
    assert high_water_marks(spans) == {a: 9, b: 3}


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (rec(T.steps, 0, 7, step(n=3)), {"type": "StepCompleted", "run_id": "r1", "step": 3}),
        (rec(T.heartbeats, 0, 8, tick()), {"type": "Tick", "run_id": "*", "step": None}),
        (rec(T.steps, 0, 9, key=b"r1", value=b"not json"), {"type": None, "run_id": None}),
        (rec(T.steps, 0, 10, key=b"r1", value=None), {"type": None, "value": None}),
    ],
)
def test_row_of(record, expected):
    row = row_of(record)
    assert (row["topic"], row["partition"], row["offset"], row["key"]) == record[:4]
    assert row["value"] == record.value and row["timestamp_ms"] == record.timestamp_ms
    assert {k: row[k] for k in expected} == expected


def _history():
    return [
        rec(T.steps, 0, 0, started()),
        rec(T.steps, 0, 1, step(n=1)),
        rec(T.steps, 0, 2, step(run="r2", n=1)),
        rec(T.heartbeats, 0, 0, heartbeat(rank=0)),
        rec(T.heartbeats, 0, 1, tick(partition=0)),
        rec(T.heartbeats, 1, 0, tick(partition=1)),
        rec(T.anomalies, 0, 0, anomaly()),
        rec(T.steps, 0, 3, step(n=2)),
    ]


def test_archive_writes_per_run_files_that_duckdb_reads(tmp_path):
    sink = ArchiveSink(tmp_path, flush_interval_s=1.0)
    sink.handle(_history(), now_s=0.0)
    assert sink.pending_offsets() == {
        (T.steps, 0): 0,
        (T.heartbeats, 0): 0,
        (T.heartbeats, 1): 0,
        (T.anomalies, 0): 0,
    }
    sink.tick(0.5)
    assert not list(tmp_path.rglob("*.parquet"))
    sink.tick(1.0)
    assert sink.pending_offsets() == {}
    dirs = sorted(p.name for p in tmp_path.iterdir())
    assert dirs == ["run_id=_ticks", "run_id=r1", "run_id=r2"]
    glob = f"{tmp_path}/**/*.parquet"
    con = duckdb.connect()
    assert con.execute(
        f"SELECT count(*) FROM read_parquet('{glob}', hive_partitioning=true)"
    ).fetchone() == (8,)
    got = con.execute(
        f"SELECT run_id, type, step FROM read_parquet('{glob}', hive_partitioning=true) "
        "WHERE topic = 'p.steps' ORDER BY \"offset\""
    ).fetchall()
    assert got == [
        ("r1", "RunStarted", None),
        ("r1", "StepCompleted", 1),
        ("r2", "StepCompleted", 1),
        ("r1", "StepCompleted", 2),
    ]


def test_a_restart_skips_what_the_files_hold(tmp_path):
    history = _history()
    first = ArchiveSink(tmp_path)
    first.handle(history[:5], now_s=0.0)
    first.flush()
    # crash before the commit: the next incarnation sees everything again
    second = ArchiveSink(tmp_path)
    assert scan_marks(tmp_path)[Stream("r1", T.steps, 0)] == 1
    second.handle(history, now_s=0.0)
    second.flush()
    assert second.skipped == 5 and second.rows_written == 3
    con = duckdb.connect()
    glob = f"{tmp_path}/**/*.parquet"
    rows, distinct = con.execute(
        f"SELECT count(*), count(DISTINCT (topic, partition, \"offset\")) FROM read_parquet('{glob}')"
    ).fetchone()
    assert rows == distinct == 8


def test_a_crash_between_two_runs_files_loses_nothing(tmp_path):
    # r1's and r2's records interleave in one partition; only r1's file made it to disk
    history = _history()
    only_r1 = [r for r in history if r.key == b"r1"]
    first = ArchiveSink(tmp_path)
    first.handle(only_r1, now_s=0.0)
    first.flush()
    second = ArchiveSink(tmp_path)
    second.handle(history, now_s=0.0)
    second.flush()
    r2 = run_history(tmp_path, "r2", T.heartbeats)
    assert [r.offset for r in r2[T.steps]] == [2]


def test_history_read_back_is_what_kafka_held(tmp_path):
    history = _history()
    sink = ArchiveSink(tmp_path)
    sink.handle(history, now_s=0.0)
    sink.flush()
    got = run_history(tmp_path, "r1", T.heartbeats)
    # ticks of the run's heartbeat partition 0 only; the run's records, exact bytes
    assert [(r.partition, r.offset) for r in got[T.heartbeats]] == [(0, 0), (0, 1)]
    want = sorted(
        (r for r in history if r.key == b"r1" and r.topic == T.steps), key=lambda r: r.offset
    )
    assert got[T.steps] == want
    by_topic: dict[str, list[RawRecord]] = {}
    for r in sorted(history, key=lambda r: (r.topic, r.partition, r.offset)):
        if r.key in (b"r1", b"*"):
            by_topic.setdefault(r.topic, []).append(r)
    assert load_archived_run_log(tmp_path, "p", "r1") == records_of_run("r1", by_topic, T)
    assert archived_prefixes(tmp_path) == {"p"}
