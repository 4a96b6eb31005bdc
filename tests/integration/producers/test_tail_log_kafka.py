"""``runwatch tail-log`` end to end: log lines in a file, step events out of Kafka."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runwatch.cli import main
from runwatch.schemas.codec import decode
from runwatch.schemas.events import RunStarted, StepCompleted
from runwatch.schemas.topics import names
from tests.integration.producers.conftest import Consume

pytestmark = pytest.mark.integration


def test_tail_log_exit_at_eof_sends_every_step_line(
    tmp_path: Path,
    kafka_bootstrap: str,
    topic_prefix: str,
    make_topics: Callable[..., Any],
    consume: Consume,
) -> None:
    make_topics(topic_prefix)
    log = tmp_path / "training.log"
    lines = [f"step: {s}, loss: {4.0 - 0.05 * s:.3f}, dt: 0.25" for s in range(1, 21)]
    lines.insert(5, "Warning: something unrelated")
    lines.append("step: 21, loss: nan, dt: 0.25")
    log.write_text("\n".join(lines) + "\n")
    code = main(
        [
            "tail-log",
            str(log),
            "--run-id",
            "seed-run",
            "--format",
            "seed",
            "--from-start",
            "--exit-at-eof",
            "--bootstrap",
            kafka_bootstrap,
            "--topic-prefix",
            topic_prefix,
            "--tokens-per-step",
            "32768",
        ]
    )
    assert code == 0
    records = consume([names(topic_prefix).steps], 22)
    events = sorted((decode(r.value) for r in records), key=lambda e: e.seq)
    assert all(r.key == b"seed-run" for r in records)
    assert isinstance(events[0], RunStarted)
    steps = events[1:]
    assert all(isinstance(e, StepCompleted) for e in steps)
    assert [e.step for e in steps] == list(range(1, 22))
    assert steps[0].loss == 3.95 and steps[0].step_time_s == 0.25 and steps[0].tokens == 32768
    assert math.isnan(steps[-1].loss)


def test_tail_log_follows_a_growing_file_until_sigterm(
    tmp_path: Path,
    kafka_bootstrap: str,
    topic_prefix: str,
    make_topics: Callable[..., Any],
    consume: Consume,
) -> None:
    make_topics(topic_prefix)
    log = tmp_path / "train.log"
    log.write_text("iter 0: loss 10.9000, time 900.00ms, mfu -100.00%\n")  # before the tail
    env = {**os.environ, "RUNWATCH_BOOTSTRAP": kafka_bootstrap}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runwatch.cli",
            "tail-log",
            str(log),
            "--run-id",
            "nano-run",
            "--format",
            "nanogpt",
            "--topic-prefix",
            topic_prefix,
            "--poll-interval-s",
            "0.05",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        steps_topic = names(topic_prefix).steps
        # The RunStarted shows the tail is running (and positioned at the end of the file).
        assert consume([steps_topic], 1, timeout_s=60), "tail-log never announced the run"
        with log.open("a") as out:
            out.write("iter 1: loss 10.5000, time 250.00ms, mfu 30.10%\n")
            out.write("step 250: train loss 3.1234, val loss 3.2345\n")
            out.write("iter 2: loss inf, time 25")
            out.flush()
            out.write("0.00ms, mfu 30.10%\n")
        records = consume([steps_topic], 3, timeout_s=60)
        events = sorted((decode(r.value) for r in records), key=lambda e: e.seq)
        assert [type(e) for e in events] == [RunStarted, StepCompleted, StepCompleted]
        assert [(e.step, e.loss, e.step_time_s) for e in events[1:]] == [
            (1, 10.5, 0.25),
            (2, math.inf, 0.25),
        ]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "2 step(s)" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
