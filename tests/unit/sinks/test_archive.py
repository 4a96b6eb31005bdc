from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from runwatch.processors.audit import records_of_run
from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.records import RawRecord
from runwatch.schemas.topics import names
from runwatch.sinks.archive import ArchiveSink, scan_marks
from runwatch.sinks.archive_layout import (
    Stream,
    file_name,
    high_water_marks,
    parse_path,
    row_of,
    run_dir_of_key,
    run_of_dir,
)
from runwatch.sinks.archive_read import archived_prefixes, load_archived_run_log, run_history

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
    "run_id",
    ["/" * 100, "x" * 255, "é" * 120, "a" * 99 + "/" * 60, "+" * 200],
    ids=["slashes", "long", "utf8", "cut-escape", "plus"],
)
def test_a_long_run_id_gets_a_bounded_directory_of_its_own(run_id, tmp_path):
    """A valid run id must not make a file name the file system refuses (and stop the sink)."""
    run_dir = run_dir_of_key(run_id.encode())
    assert len(f"run_id={run_dir}".encode()) <= 200
    assert run_dir == run_dir_of_key(run_id.encode())  # a pure function of the key
    assert run_dir != run_dir_of_key((run_id + "x").encode())
    assert "%" not in run_dir[-22:-19]  # no escape cut in half before the hash
    assert run_of_dir(run_dir) is None
    (tmp_path / f"run_id={run_dir}").mkdir()  # the file system takes it


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
        (rec(T.steps, 0, 7, step(n=3)), {"type": "step", "run_id": "r1", "step": 3}),
        (rec(T.heartbeats, 0, 8, tick()), {"type": "tick", "run_id": "*", "step": None}),
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
        ("r1", "run_started", None),
        ("r1", "step", 1),
        ("r2", "step", 1),
        ("r1", "step", 2),
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


HOUR_MS = 3_600_000


def _tick_records(n, partition=0, start_ms=0, step_ms=1000):
    return [
        RawRecord(
            T.heartbeats,
            partition,
            i,
            b"*",
            encode(tick(partition=partition, ts_s=(start_ms + i * step_ms) / 1000)),
            start_ms + i * step_ms,
        )
        for i in range(n)
    ]


def _archive_in_flushes(root, records, per_flush):
    sink = ArchiveSink(root, compact_interval_s=0)
    for i in range(0, len(records), per_flush):
        sink.handle(records[i : i + per_flush], now_s=0.0)
        sink.flush()
    return sink


def test_compaction_leaves_one_file_per_stream_per_closed_hour(tmp_path):
    from runwatch.sinks.archive_compact import compact

    # two hours and a bit of ticks (one per 10 s) flushed 5 at a time, and a run's records
    ticks = _tick_records(2 * 360 + 3, step_ms=10_000)
    _archive_in_flushes(tmp_path, ticks, per_flush=5)
    own = [rec(T.heartbeats, 0, 10_000 + i, heartbeat(rank=0, n=i)) for i in range(3)]
    _archive_in_flushes(tmp_path, own, per_flush=1)
    before = run_history(tmp_path, "r1", T.heartbeats)
    marks = scan_marks(tmp_path)
    assert len(list(tmp_path.rglob("*.parquet"))) == 145 + 3

    stats = compact(tmp_path, now_ms=2 * HOUR_MS + 10_000)
    assert stats.merged_files == 144 + 3
    tick_files = sorted(p.name for p in (tmp_path / "run_id=_ticks").glob("*.parquet"))
    # hours 0 and 1 closed: one file each; the open hour 2 keeps its own
    assert len(tick_files) == 2 + 1 and stats.done
    assert tick_files[0] == file_name(Stream("_ticks", T.heartbeats, 0), 0, 359)
    assert tick_files[1] == file_name(Stream("_ticks", T.heartbeats, 0), 360, 719)
    assert len(list((tmp_path / "run_id=r1").glob("*.parquet"))) == 1  # hour 0 of 1970
    assert scan_marks(tmp_path) == marks
    assert run_history(tmp_path, "r1", T.heartbeats) == before  # the audit reads the same
    assert compact(tmp_path, now_ms=2 * HOUR_MS + 10_000).merged_files == 0  # settled


def test_a_crash_mid_compaction_leaves_duplicates_the_readers_drop_and_the_next_removes(
    tmp_path,
):
    from runwatch.sinks.archive_compact import compact

    ticks = _tick_records(20)
    _archive_in_flushes(tmp_path, ticks, per_flush=5)
    small = sorted((tmp_path / "run_id=_ticks").glob("*.parquet"))
    kept = [p.read_bytes() for p in small[:2]]
    compact(tmp_path, now_ms=HOUR_MS)
    for path, data in zip(small[:2], kept, strict=True):  # as if the unlinks never happened
        path.write_bytes(data)
    hb = [rec(T.heartbeats, 0, 100, heartbeat(rank=0))]
    _archive_in_flushes(tmp_path, hb, per_flush=1)
    got = run_history(tmp_path, "r1", T.heartbeats)[T.heartbeats]
    assert [r.offset for r in got] == [*range(20), 100]  # each position once
    assert compact(tmp_path, now_ms=HOUR_MS).removed_leftovers == 2
    assert len(list((tmp_path / "run_id=_ticks").glob("*.parquet"))) == 1


def test_a_file_inside_another_span_but_with_other_rows_is_kept():
    from runwatch.sinks.archive_compact import ArchiveFile, covered, plan_merges
    from runwatch.sinks.archive_layout import FileSpan

    s = Stream("_ticks", T.heartbeats, 0)
    spans = [FileSpan(s, 0, 9), FileSpan(s, 3, 4), FileSpan(s, 10, 12)]
    assert covered(spans) == [(1, 0)]  # a candidate only: compact() compares the rows
    files = [
        ArchiveFile(Path(f"f{i}"), sp, hour)
        for i, (sp, hour) in enumerate(
            [
                (FileSpan(s, 0, 4), 0),
                (FileSpan(s, 5, 9), 0),
                (FileSpan(s, 10, 14), 1),
                (FileSpan(s, 15, 19), 1),
                (FileSpan(s, 20, 24), 2),
            ]
        )
    ]
    groups = plan_merges(files, before_hour=2)
    assert [[f.path.name for f in g] for g in groups] == [["f0", "f1"], ["f2", "f3"]]


def test_the_sink_compacts_its_own_partitions_on_its_interval(tmp_path):
    now_ms = [HOUR_MS + 1]
    sink = ArchiveSink(
        tmp_path, flush_interval_s=0, compact_interval_s=100, wall_ms=lambda: now_ms[0]
    )
    sink.on_assigned([(T.heartbeats, 0)])
    for r in _tick_records(20):
        sink.handle([r], now_s=0.0)
        sink.flush()
    sink.tick(0.0)  # schedules the first compaction, a minute on
    assert len(list(tmp_path.rglob("*.parquet"))) == 20
    sink.tick(60.0)
    assert len(list(tmp_path.rglob("*.parquet"))) == 1 and sink.files_merged == 20
