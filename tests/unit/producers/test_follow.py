"""FileFollower: partial lines, truncation, rotation and the stop event."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from runwatch.producers.follow import FileFollower


def test_from_start_with_exit_at_eof_reads_everything(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"a\nb\r\nprogress 1\rprogress 2\rc\n\xffbad\nlast without newline")
    lines = list(FileFollower(log, from_start=True).lines(exit_at_eof=True))
    assert lines == [
        "a",
        "b",
        "progress 1",
        "progress 2",
        "c",
        "\ufffdbad",
        "last without newline",
    ]


def test_default_starts_at_the_end_and_skips_a_half_written_line(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("old 1\nold 2\nhalf of a li")
    stop = threading.Event()
    lines = FileFollower(log, poll_interval_s=0.01).lines(stop)
    with log.open("a") as out:
        out.write("ne\nnew 1\n")
    assert next(lines) == "new 1"
    with log.open("a") as out:
        out.write("new 2 in pie")
        out.flush()
        out.write("ces\n")
    assert next(lines) == "new 2 in pieces"
    stop.set()
    assert list(lines) == []


def test_truncation_restarts_from_the_beginning(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("step 1 long line of text\nstep 2 long line of text\n")
    lines = FileFollower(log, from_start=True, poll_interval_s=0.01).lines()
    assert [next(lines), next(lines)] == ["step 1 long line of text", "step 2 long line of text"]
    log.write_text("restart 1\n")  # truncate and write less than before
    assert next(lines) == "restart 1"
    lines.close()


def test_rotation_by_rename_finishes_the_old_file_then_follows_the_new(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("one\n")
    lines = FileFollower(log, from_start=True, poll_interval_s=0.01).lines()
    assert next(lines) == "one"
    with log.open("a") as out:
        out.write("two\n")
    os.rename(log, tmp_path / "train.log.1")
    log.write_text("three\n")
    assert [next(lines), next(lines)] == ["two", "three"]
    lines.close()


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        FileFollower(tmp_path / "nope.log").lines()


def test_stop_from_another_thread_ends_a_waiting_follow(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("")
    stop = threading.Event()
    timer = threading.Timer(0.05, stop.set)
    timer.start()
    assert list(FileFollower(log, poll_interval_s=0.01).lines(stop)) == []
    timer.join()
