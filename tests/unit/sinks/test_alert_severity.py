from __future__ import annotations

import io

import pytest

from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.records import RawRecord
from runwatch.schemas.topics import names
from runwatch.sinks.alert_log import DeliveryLog
from runwatch.sinks.alert_policy import SEVERITY_ORDER, pages
from runwatch.sinks.alerts import AlertSettings, AlertSink

from .events import anomaly

T = names("p")


def test_severity_order_is_the_schema_s() -> None:
    assert SEVERITY_ORDER == ("info", "warning", "critical")


@pytest.mark.parametrize(
    ("severity", "minimum", "expected"),
    [
        ("info", "warning", False),
        ("warning", "warning", True),
        ("critical", "warning", True),
        ("info", "info", True),
        ("warning", "critical", False),
    ],
)
def test_pages(severity, minimum, expected) -> None:
    assert pages(severity, minimum) is expected


def _records():
    events = [anomaly(kind="grad_norm_spike", step=1), anomaly(kind="loss_spike", step=2)]
    return [
        RawRecord(T.anomalies, 0, i, encode_key(e.run_id), encode(e), 0)
        for i, e in enumerate(events)
    ]


@pytest.mark.parametrize(("minimum", "alerted"), [("warning", 1), ("info", 2)])
def test_sink_alerts_by_severity(tmp_path, minimum, alerted) -> None:
    out = io.StringIO()
    settings = AlertSettings(group_wait_s=0.0, min_severity=minimum)
    sink = AlertSink(settings, T, DeliveryLog(tmp_path / "a.jsonl"), out=out)
    sink.handle(_records(), now_s=0.0)
    sink.flush()
    assert sink.stats.alerts == alerted
    assert sink.stats.below_min_severity == 2 - alerted
    assert ("grad_norm_spike" in out.getvalue()) is (minimum == "info")
    sink.log.close()
