"""``runwatch tail-log``: bad arguments are one-line usage errors (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runwatch.cli import main


@pytest.fixture
def log(tmp_path: Path) -> Path:
    path = tmp_path / "train.log"
    path.write_text("step: 1, loss: 3.0, dt: 0.25\n")
    return path


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--format", "csv"], "unknown format 'csv'"),
        (["--format", "regex"], "needs --regex"),
        (["--format", "regex", "--regex", r"(?P<step>\d+)"], "loss"),
        (["--format", "regex", "--regex", "(?P<step"], "invalid --regex"),
        (["--format", "seed", "--tokens-per-step", "-1"], "--tokens-per-step"),
        (["--vocab-size", "1"], "--vocab-size must be >= 2"),
        (["--tag", "team"], "--tag takes KEY=VALUE, got 'team'"),
        (["--tag", "=llm"], "--tag takes KEY=VALUE"),
    ],
)
def test_bad_arguments(
    log: Path, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["tail-log", str(log), "--run-id", "r", "--bootstrap", "b:1", *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1 and err.startswith("runwatch tail-log: ")


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tail-log", str(tmp_path / "nope.log"), "--run-id", "r", "--format", "seed"])
    err = capsys.readouterr().err
    assert code == 2 and "no such file" in err and err.count("\n") == 1


def test_missing_run_id(
    log: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("RUNWATCH_RUN_ID", raising=False)
    code = main(["tail-log", str(log), "--format", "seed", "--bootstrap", "b:1"])
    assert code == 2 and "--run-id" in capsys.readouterr().err


def test_regex_alone_implies_the_regex_format(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["tail-log", str(log), "--run-id", "r", "--bootstrap", "b:1", "--regex", "(?P<x"])
    assert code == 2 and "invalid --regex" in capsys.readouterr().err
