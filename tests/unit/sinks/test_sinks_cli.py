from __future__ import annotations

import pytest

from runwatch.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "choose at least one sink"),
        (["--metrics", "--webhook", "http://x"], "--webhook needs --alerts"),
        (["--alerts", "--webhook", "ftp://x"], "http(s) URL"),
        (["--alerts", "--max-alerts-per-min", "0"], "must be > 0"),
        (["--alerts", "--group-wait-s", "-1"], "must be >= 0"),
        (["--metrics", "--metrics-port", "70000"], "--metrics-port"),
    ],
)
def test_bad_arguments_are_one_line_usage_errors(argv, message, capsys):
    assert main(["sinks", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_audit_from_a_missing_archive_is_a_usage_error(tmp_path, capsys):
    assert main(["audit", "--run", "r", "--from-archive", str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err
