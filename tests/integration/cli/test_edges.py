"""The CLI's edges against the session broker: --prefix on status and topics list,
tail-log finding its format, output without terminal codes when it is not a terminal,
help with defaults. Real processors, real Kafka, the real CLI in subprocesses."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from runwatch.procs import ManagedProcess
from runwatch.schemas.topics import catalogue
from tests.integration.cli.cli import runwatch

WAIT_S = 180.0


def test_topics_list_prefix_shows_only_that_prefix(
    kafka_bootstrap: str, make_topics, topic_prefix: str
) -> None:
    make_topics(topic_prefix, partitions=1)
    make_topics(f"{topic_prefix}x", partitions=1)  # a prefix that starts the same
    result = runwatch("topics", "list", "--bootstrap", kafka_bootstrap, "--prefix", topic_prefix)
    assert result.returncode == 0, result.stderr
    listed = [line.split("\t")[0] for line in result.stdout.splitlines()]
    assert listed == sorted(spec.name for spec in catalogue(topic_prefix))


def test_tail_log_without_a_step_line_says_so(kafka_bootstrap: str, tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("loading...\nstep 250: train loss 3.1, val loss 3.2\n")
    result = runwatch(
        "tail-log", str(log), "--run-id", "r", "--bootstrap", kafka_bootstrap,
        "--prefix", "tnone", "--from-start", "--exit-at-eof", "--no-announce",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "no step line recognised (tried the nanogpt and seed formats)" in result.stderr


def _status_json(bootstrap: str, prefix: str) -> list[dict[str, object]]:
    result = runwatch("status", "--bootstrap", bootstrap, "--prefix", prefix, "--json")
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_processors_tail_log_and_status_on_one_prefix(
    kafka_bootstrap: str, make_topics, topic_prefix: str, tmp_path: Path
) -> None:
    """processors and status agree on a prefix's app id; tail-log detects the seed format;
    the processors' output, a file, holds no terminal codes."""
    make_topics(topic_prefix, partitions=1)
    worker = ManagedProcess.runwatch(
        "processors",
        ["processors", "--bootstrap", kafka_bootstrap, "--prefix", topic_prefix,
         "--partitions", "1", "--tick-interval", "0.5"],
        tmp_path / "processors.log",
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        log = tmp_path / "train.log"
        log.write_text(
            "banner\n" + "".join(f"step: {i}, loss: {3 - i / 10}, dt: 0.25\n" for i in range(5))
        )
        tail = runwatch(
            "tail-log", str(log), "--run-id", "edge-run", "--bootstrap", kafka_bootstrap,
            "--prefix", topic_prefix, "--from-start", "--exit-at-eof",
        )  # fmt: skip
        assert tail.returncode == 0, tail.stderr
        assert "detected the seed format from 'step: 0, loss: 3.0, dt: 0.25'" in tail.stderr
        assert "5 step(s)" in tail.stderr
        deadline = time.monotonic() + WAIT_S
        rows = _status_json(kafka_bootstrap, topic_prefix)
        while not any(r["run_id"] == "edge-run" and r["last_step"] == 4 for r in rows):
            assert worker.returncode is None, worker.log_tail()
            assert time.monotonic() < deadline, f"status never showed the run: {rows}"
            time.sleep(1.0)  # the processors publish their tables on their own schedule
            rows = _status_json(kafka_bootstrap, topic_prefix)
        assert (
            f"ready (app id {topic_prefix}-processors, event loop " in worker.log_path.read_text()
        )
    finally:
        worker.stop()
    output = worker.log_path.read_bytes()
    assert b"\x1b" not in output, output[-400:]


def test_processors_output_holds_no_terminal_codes(
    kafka_bootstrap: str, make_topics, topic_prefix: str, tmp_path: Path
) -> None:
    """faust's spinner wrote ESC[?25l / ESC[?25h into the worker's redirected stdout."""
    from runwatch.processors.fleet import latest_states

    make_topics(topic_prefix, partitions=1)
    app_id = f"{topic_prefix}-app"
    worker = ManagedProcess.runwatch(
        "processors",
        ["processors", "--bootstrap", kafka_bootstrap, "--prefix", topic_prefix,
         "--app-id", app_id, "--partitions", "1", "--tick-interval", "0.5"],
        tmp_path / "processors.log",
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        log = tmp_path / "train.log"
        log.write_text("step: 0, loss: 3.0, dt: 0.25\nstep: 1, loss: 2.9, dt: 0.25\n")
        tail = runwatch(
            "tail-log", str(log), "--run-id", "esc-run", "--bootstrap", kafka_bootstrap,
            "--prefix", topic_prefix, "--format", "seed", "--from-start", "--exit-at-eof",
        )  # fmt: skip
        assert tail.returncode == 0, tail.stderr
        deadline = time.monotonic() + WAIT_S
        while "esc-run" not in latest_states(kafka_bootstrap, app_id):
            assert worker.returncode is None, worker.log_tail()
            assert time.monotonic() < deadline, "the processors never folded the run"
            time.sleep(1.0)  # the processors publish their tables on their own schedule
    finally:
        worker.stop()
    output = worker.log_path.read_bytes()
    assert b"\x1b" not in output, output[-400:]


def test_sinks_help_shows_defaults() -> None:
    text = " ".join(runwatch("sinks", "--help").stdout.split())
    assert re.search(r"--webhook-attempts N [^()]*\(default: 5\)", text), text
    assert re.search(r"--metrics-port N [^()]*\(default: 9464\)", text), text
