from __future__ import annotations

import msgspec
import pytest

from runwatch.sinks.alert_format import (
    AlertGroup,
    alert_of,
    console_lines,
    rfc3339,
    runwatch_payload,
)

from .events import anomaly, completed, failed, heartbeat, rejected, restart, step


@pytest.mark.parametrize(
    ("event", "alert_id", "kind", "severity", "step_", "rank"),
    [
        (anomaly(kind="loss_spike"), "v-r1-loss_spike-30", "loss_spike", "warning", 30, 0),
        (anomaly(kind="hang", rank=None), "v-r1-hang-30", "hang", "critical", 30, None),
        (
            anomaly(kind="nonfinite_loss"),
            "v-r1-nonfinite_loss-30",
            "nonfinite_loss",
            "critical",
            30,
            0,
        ),
        (restart(), "restart_requested:c1", "restart_requested", "warning", None, None),
        (completed(), "restart_completed:c1", "restart_completed", "info", None, None),
        (failed(), "restart_failed:c1", "restart_failed", "critical", None, None),
        (
            msgspec.structs.replace(failed(), covered=True),  # a healing group answers it
            "restart_failed:c1",
            "restart_failed",
            "info",
            None,
            None,
        ),
        (rejected(), "command_rejected:c1", "command_rejected", "critical", None, None),
    ],
)
def test_alert_of(event, alert_id, kind, severity, step_, rank):
    a = alert_of(event)
    assert a is not None
    assert (a.alert_id, a.kind, a.severity, a.step, a.rank, a.run_id) == (
        alert_id,
        kind,
        severity,
        step_,
        rank,
        "r1",
    )
    assert a.summary and a.description


@pytest.mark.parametrize("event", [step(), heartbeat()])
def test_input_events_raise_no_alert(event):
    assert alert_of(event) is None


@pytest.mark.parametrize(
    ("ts_ns", "text"),
    [
        (0, "1970-01-01T00:00:00.000000Z"),
        (1_700_000_000_123_456_789, "2023-11-14T22:13:20.123457Z"),
    ],
)
def test_rfc3339(ts_ns, text):
    assert rfc3339(ts_ns) == text


def _group(suppressed=0):
    return AlertGroup(
        run_id="r1",
        alerts=(alert_of(anomaly(kind="loss_spike")), alert_of(anomaly(kind="dead_rank", rank=1))),
        suppressed=suppressed,
    )


def test_runwatch_payload():
    p = runwatch_payload(_group(suppressed=3), max_per_min=10)
    assert p["run"] == "r1" and p["suppressed"] == 3 and p["max_alerts_per_min"] == 10
    assert [a["id"] for a in p["alerts"]] == ["v-r1-loss_spike-30", "v-r1-dead_rank-30"]


@pytest.mark.parametrize(("suppressed", "lines"), [(0, 2), (4, 3)])
def test_console_lines_one_per_alert_plus_notice(suppressed, lines):
    out = console_lines(_group(suppressed), max_per_min=10)
    assert len(out) == lines
    assert "run=r1 loss_spike" in out[0] and "[v-r1-loss_spike-30]" in out[0]
    if suppressed:
        assert "4 alert(s) suppressed" in out[-1]


def test_the_console_line_says_each_fact_once():
    event = msgspec.structs.replace(
        anomaly(kind="loss_spike", step=30), detail="loss 5.68 vs median 2.92 (z=13.6)"
    )
    (line,) = console_lines(AlertGroup(run_id="r1", alerts=(alert_of(event),)), 10)
    assert line.endswith(
        "WARNING  run=r1 loss_spike step=30 rank=0: loss 5.68 vs median 2.92 (z=13.6) "
        "[v-r1-loss_spike-30]"
    )
    assert line.count("loss_spike") == 2  # the kind, and inside the alert id
    assert "5.68" in line and line.count("5.68") == 1 and "baseline" not in line


def test_a_verdict_without_detail_shows_its_figures_once():
    event = msgspec.structs.replace(anomaly(), detail="")
    (line,) = console_lines(AlertGroup(run_id="r1", alerts=(alert_of(event),)), 10)
    assert "value 9, baseline 3.7, z 12.5, threshold 6" in line and line.count("value") == 1


def test_restart_and_outcome_alerts_name_their_cause():
    assert alert_of(restart(cause="v9")).cause_id == "v9"
    assert alert_of(completed(cid="c7")).cause_id == "restart_requested:c7"
    assert alert_of(anomaly()).cause_id is None
