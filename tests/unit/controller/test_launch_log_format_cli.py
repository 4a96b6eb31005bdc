"""`runwatch launch --log-format`: bad arguments are one-line usage errors, before any Kafka."""

from __future__ import annotations

import pytest

from runwatch.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--log-format", "regex"], "--log-format regex needs --log-regex PATTERN"),
        (["--log-format", "regex", "--log-regex", "x("], "invalid --log-regex"),
        (["--log-format", "regex", "--log-regex", r"(?P<step>\d+)"], "named group(s) loss"),
        (["--log-regex", r"(?P<step>\d+) (?P<loss>\S+)"], "go with --log-format"),
        (["--tokens-per-step", "8"], "go with --log-format"),
        (["--log-format", "nanogpt", "--tokens-per-step", "-1"], "--tokens-per-step must be >= 0"),
    ],
)
def test_bad_log_format_arguments_are_one_line_usage_errors(argv, message, capsys, tmp_path):
    base = ["launch", "--nproc", "1", "--state-dir", str(tmp_path), "--bootstrap", "127.0.0.1:1"]
    code = main([*base, *argv, "--", "python", "train.py"])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_an_unknown_log_format_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["launch", "--nproc", "1", "--log-format", "json", "--", "python", "train.py"])
    assert exc.value.code == 2
    assert "invalid choice: 'json'" in capsys.readouterr().err
