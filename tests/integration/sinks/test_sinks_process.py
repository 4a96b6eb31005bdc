"""`runwatch sinks --alerts` as an operator runs it: a receiver that is down, a SIGKILL.

A webhook receiver (a real stdlib HTTP server on 127.0.0.1) is down while a verdict is
alerted, longer than the POST retries; the sinks process is SIGKILLed; the receiver comes
up; a new sinks process with the same group and state directory must deliver the owed
alert, say what it waited for while the dead member's session ran out, and then deliver
new alerts after it, in order.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from runwatch.procs import ManagedProcess
from runwatch.schemas.topics import names
from tests.integration.sinks.test_alerts_metrics import publish
from tests.unit.sinks.events import anomaly
from tests.unit.sinks.recorder import Recorder

pytestmark = pytest.mark.integration

SESSION_S = 12  # the killed process's session: its partitions are held this long


def wait_for_line(proc: ManagedProcess, needle: str, timeout_s: float = 90.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        text = proc.log_path.read_text(errors="replace") if proc.log_path.exists() else ""
        for line in text.splitlines():
            if needle in line:
                return line
        if proc.returncode is not None:
            raise AssertionError(f"{proc.name} exited {proc.returncode}:\n{proc.log_tail(40)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {needle!r} in {proc.name}'s log:\n{proc.log_tail(40)}")
        time.sleep(0.1)  # polling a log file: the line decides, not the sleep


@pytest.fixture
def start_sinks(kafka_bootstrap, topic_prefix, tmp_path):
    """Start `runwatch sinks --alerts` processes; every one is stopped at the end."""
    started: list[ManagedProcess] = []

    def start(name: str, url: str, state: Path) -> ManagedProcess:
        args = ["sinks", "--alerts", "--webhook", url, "--webhook-attempts", "2",
                "--webhook-backoff-s", "0.05", "--pending-max-delay-s", "1",
                "--group-wait-s", "0.1", "--cause-wait-s", "0",
                "--session-timeout", str(SESSION_S), "--state-dir", str(state),
                "--bootstrap", kafka_bootstrap, "--prefix", topic_prefix]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = ManagedProcess.runwatch(name, args, tmp_path / f"{name}.log", env=env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def test_an_alert_owed_to_a_receiver_that_was_down_survives_a_sigkill(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path, start_sinks
):
    make_topics(topic_prefix, partitions=1)
    t = names(topic_prefix)
    port = Recorder.free_port()
    url = f"http://127.0.0.1:{port}/hook"
    state = tmp_path / "state"

    first = start_sinks("sinks-1", url, state)
    wait_for_line(first, "alerts: assigned")
    publish(kafka_bootstrap, [(t.anomalies, anomaly(run="ra", kind="hang", step=5))])
    wait_for_line(first, "kept pending, will retry: v-ra-hang-5")
    first.kill()  # no flush, no commit, no LeaveGroup

    with Recorder(port=port) as receiver:  # the receiver is back
        second = start_sinks("sinks-2", url, state)
        (body,) = receiver.wait_for(lambda b: len(b) >= 1, timeout_s=120)
        assert [a["id"] for a in body["alerts"]] == ["v-ra-hang-5"]
        # it said what it waited for while the killed member's session ran out
        waiting = wait_for_line(second, "to assign partitions")
        assert "rebalance" in waiting and "session times out" in waiting
        wait_for_line(second, "alerts: assigned")
        publish(kafka_bootstrap, [(t.anomalies, anomaly(run="ra", kind="hang", step=6))])
        bodies = receiver.wait_for(lambda b: len(b) >= 2, timeout_s=60)
        assert [a["id"] for b in bodies for a in b["alerts"]] == ["v-ra-hang-5", "v-ra-hang-6"]
        assert "took the pending delivery: v-ra-hang-5" in second.log_path.read_text()
        second.stop()
    log = second.log_path.read_text()
    assert "Traceback" not in log and "Traceback" not in first.log_path.read_text()
