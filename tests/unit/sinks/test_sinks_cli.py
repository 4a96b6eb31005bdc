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
        (["--alertmanager", "am:9093"], "--alertmanager expects an http(s) URL"),
        (["--alertmanager", "http://am", "--ui-url", "ui:8080"], "--ui-url expects"),
        (["--alertmanager", "http://am", "--alertmanager-resend-s", "0"], "must be > 0"),
        (["--alerts", "--webhook-format", "alertmanager"], "with --alertmanager URL"),
    ],
)
def test_bad_arguments_are_one_line_usage_errors(argv, message, capsys):
    assert main(["sinks", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_audit_from_a_missing_archive_is_a_usage_error(tmp_path, capsys):
    assert main(["audit", "--run", "r", "--from-archive", str(tmp_path / "nope")]) == 2
    assert "not a directory" in capsys.readouterr().err


def _help_entries(text):
    """``{flag: help text}`` from argparse's --help output."""
    entries, current = {}, None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("--"):
            flag, _, rest = stripped.partition("  ")
            current = flag.split()[0].rstrip(",")
            entries[current] = rest.strip()
        elif current and line.startswith(" " * 10) and stripped:
            entries[current] += " " + stripped
        elif not stripped:
            current = None
    return entries


def test_help_shows_help_and_the_default_of_every_flag(capsys):
    with pytest.raises(SystemExit):
        main(["sinks", "--help"])
    entries = _help_entries(capsys.readouterr().out)
    assert {"--session-timeout", "--from-beginning", "--metrics-host", "--webhook-attempts"} <= set(
        entries
    )
    for flag, text in entries.items():
        assert text, f"{flag} has no help"
    switches = {"--alerts", "--metrics", "--no-console", "--from-beginning", "--help"}
    for flag, text in entries.items():
        if flag not in switches and flag not in ("--archive",):
            assert "default" in text, f"{flag} does not say its default: {text!r}"
    assert "default: 127.0.0.1" in entries["--metrics-host"]
    assert "default: 10.0" in entries["--session-timeout"]


@pytest.mark.integration
def test_a_taken_metrics_port_is_one_line_not_a_traceback(capsys, kafka_bootstrap):
    # a reachable broker: otherwise the broker check (exit 4) answers first
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["sinks", "--metrics", "--metrics-port", str(port), "--bootstrap", kafka_bootstrap]
        assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot serve metrics on 127.0.0.1:{port}" in err[0]
    assert "Traceback" not in err[0]


def test_new_groups_of_each_sink_start_where_documented():
    from runwatch.cmd.sinks import start_of
    from runwatch.sinks.consumer import StartFrom

    assert start_of("alerts", from_beginning=False) is StartFrom.LATEST
    assert start_of("alerts", from_beginning=True) is StartFrom.EARLIEST
    assert start_of("metrics", from_beginning=False) is StartFrom.REPLAY
    assert start_of("archive", from_beginning=False) is StartFrom.EARLIEST
    assert start_of("alertmanager", from_beginning=False) is StartFrom.REPLAY


def test_every_alertmanager_sink_process_has_a_group_of_its_own():
    import os
    import socket

    from runwatch.cmd.sinks import group_of

    assert group_of("alerts", "p-sinks") == "p-sinks-alerts"
    own = group_of("alertmanager", "p-sinks")
    assert own == f"p-sinks-alertmanager-{socket.gethostname()}-{os.getpid()}"


def test_the_alertmanager_sink_alone_is_a_choice(monkeypatch):
    import argparse

    from runwatch.cmd.sinks import _alertmanagers, _validate, configure

    parser = argparse.ArgumentParser()
    configure(parser)
    monkeypatch.setenv("RUNWATCH_ALERTMANAGER", "http://a:9093, http://b:9093")
    args = parser.parse_args([])
    managers = _alertmanagers(args)
    assert managers == ["http://a:9093", "http://b:9093"]
    _validate(args, [], managers)  # no UsageError
