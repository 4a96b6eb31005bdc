"""`controller.logwatch.LineReader`: the lines of a rank's output file, read without waiting."""

from __future__ import annotations

from pathlib import Path

from runwatch.controller.logwatch import LineReader


def test_a_line_counts_once_its_newline_is_written(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    reader = LineReader(log)
    assert reader.lines() == []  # not created yet: empty, no error
    log.write_bytes(b"iter 1: loss 3.0, time 1.00ms\niter 2: lo")
    assert reader.lines() == ["iter 1: loss 3.0, time 1.00ms"]
    with log.open("ab") as f:
        f.write(b"ss 2.9, time 1.00ms\n")
    assert reader.lines() == ["iter 2: loss 2.9, time 1.00ms"]
    assert reader.lines() == []


def test_carriage_returns_split_lines_and_bad_bytes_do_not_stop_the_reader(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_bytes(b"10%|#\r50%|#####\r\nstep: 1, loss: 2.0, dt: 0.1\xff\n")
    assert reader_lines(log) == ["10%|#", "50%|#####", "step: 1, loss: 2.0, dt: 0.1\ufffd"]


def test_drain_returns_the_unterminated_last_line(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_bytes(b"a\nb")
    reader = LineReader(log)
    assert reader.drain() == ["a", "b"]
    assert reader.drain() == []


def test_from_end_skips_what_was_written_before_and_a_partial_line(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_bytes(b"old 1\nold 2\nhalf of a li")
    reader = LineReader(log, from_end=True)
    with log.open("ab") as f:
        f.write(b"ne\nnew 3\n")
    assert reader.lines() == ["new 3"]


def test_a_large_backlog_is_read_whole(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    lines = [f"iter {i}: loss 1.0, time 1.00ms" + "x" * 100 for i in range(20_000)]
    log.write_text("\n".join(lines) + "\n")  # > 2 MiB: several reads
    assert LineReader(log).lines() == lines


def reader_lines(path: Path) -> list[str]:
    return LineReader(path).lines()
