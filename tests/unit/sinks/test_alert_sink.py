from __future__ import annotations

import io

from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.records import RawRecord
from runwatch.schemas.topics import names
from runwatch.sinks.alert_log import DeliveryLog
from runwatch.sinks.alerts import AlertSettings, AlertSink
from runwatch.sinks.delivery_figures import receiver_label
from runwatch.sinks.webhook import RetryPolicy

from .events import anomaly, completed, restart
from .recorder import Recorder

T = names("p")
FAST = RetryPolicy(attempts=3, base_delay_s=0.01, max_delay_s=0.02, timeout_s=5.0)


def rec(topic, offset, event):
    return RawRecord(topic, 0, offset, encode_key(event.run_id), encode(event), 0)


def make(tmp_path, url, **kw):
    settings = AlertSettings(webhooks=(url,), group_wait_s=1.0, retry=FAST, **kw)
    out = io.StringIO()
    return AlertSink(settings, T, DeliveryLog(tmp_path / "a.jsonl"), out=out), out


def test_grouped_per_run_deduplicated_and_not_resent_after_a_restart(tmp_path):
    records = [
        rec(T.anomalies, 0, anomaly(step=1)),
        rec(T.anomalies, 1, anomaly(step=1)),  # identical duplicate
        rec(T.anomalies, 2, anomaly(run="r2", step=1)),
        rec(T.commands, 0, restart(cause="v-r1-loss_spike-1")),
        rec(T.controller, 0, completed()),
    ]
    with Recorder(fail_first=1) as server:
        sink, out = make(tmp_path, server.url)
        sink.handle(records, now_s=0.0)
        assert sink.pending_offsets() == {
            (T.anomalies, 0): 0,
            (T.commands, 0): 0,
            (T.controller, 0): 0,
        }
        sink.tick(1.0)
        assert sink.pending_offsets() == {}
        bodies = server.wait_for(lambda b: len(b) == 2)
        by_run = {b["run"]: [a["id"] for a in b["alerts"]] for b in bodies}
        assert by_run == {
            "r1": ["v-r1-loss_spike-1", "restart_requested:c1", "restart_completed:c1"],
            "r2": ["v-r2-loss_spike-1"],
        }
        assert server.attempts == 3  # the first POST got a 500 and was retried
        assert len(out.getvalue().splitlines()) == 4
        assert sink.stats.duplicates == 1
        sink.log.close()
        # crash before the commit: a new sink reads the same records again
        again, out2 = make(tmp_path, server.url)
        again.handle(records, now_s=5.0)
        again.flush()
        assert again.stats.alerts == 0 and out2.getvalue() == ""
        assert len(server.bodies) == 2


def test_the_rate_limit_counts_what_it_suppressed(tmp_path):
    records = [rec(T.anomalies, i, anomaly(step=i)) for i in range(5)]
    with Recorder() as server:
        sink, out = make(tmp_path, server.url, max_alerts_per_min=2)
        sink.handle(records, now_s=0.0)
        sink.flush()
        (body,) = server.wait_for(lambda b: len(b) == 1)
        assert len(body["alerts"]) == 2 and body["suppressed"] == 0
        assert sink.stats.suppressed == 3
        sink.handle([rec(T.anomalies, 9, anomaly(step=9))], now_s=30.0)
        sink.flush()
        second = server.wait_for(lambda b: len(b) == 2)[1]
        assert [a["id"] for a in second["alerts"]] == ["v-r1-loss_spike-9"]
        assert second["suppressed"] == 3
        assert "3 alert(s) suppressed" in out.getvalue()


def test_a_dead_webhook_is_reported_and_does_not_block_the_console(tmp_path, capsys):
    with Recorder(fail_first=100) as server:
        sink, out = make(tmp_path, server.url)
        sink.handle([rec(T.anomalies, 0, anomaly())], now_s=0.0)
        sink.flush()
    assert sink.stats.failed_posts == 1 and "loss_spike" in out.getvalue()
    assert "failed after 3 attempt(s)" in capsys.readouterr().err


def _samples(sink):
    return {
        (s.name, s.labels.get("receiver")): s.value
        for family in sink.figures.collect()
        for s in family.samples
    }


def test_a_receiver_down_past_the_retries_gets_the_alert_after_a_sinks_restart(tmp_path):
    port = Recorder.free_port()
    url = f"http://127.0.0.1:{port}/hook"
    records = [rec(T.anomalies, 0, anomaly(step=1))]
    sink, out = make(tmp_path, url)
    sink.handle(records, now_s=0.0)
    sink.flush()  # nothing listens: 3 attempts fail
    assert sink.stats.failed_posts == 1 and "loss_spike" in out.getvalue()
    assert [p.target for p in sink.log.pending()] == [url]
    assert sink.pending_offsets() == {}  # the record may be committed: the log owes it
    label = receiver_label(url)
    assert _samples(sink)[("runwatch_alert_deliveries_pending", label)] == 1
    assert _samples(sink)[("runwatch_alert_delivery_failed_attempts_total", label)] == 3
    # a second alert while the receiver owes one queues behind it, no POST tried
    sink.handle([rec(T.anomalies, 1, anomaly(step=2))], now_s=0.0)
    sink.flush()
    assert len(sink.log.pending(url)) == 2 and sink.stats.posts == 1
    sink.log.close()

    with Recorder(port=port) as server:  # the receiver comes back; the sinks restart
        again, out2 = make(tmp_path, url)
        again.handle([*records, rec(T.anomalies, 1, anomaly(step=2))], now_s=10.0)
        assert again.stats.duplicates == 2  # owed counts as handled: not grouped again
        again.tick(10.0)
        bodies = server.wait_for(lambda b: len(b) == 2)
        assert [[a["id"] for a in b["alerts"]] for b in bodies] == [
            ["v-r1-loss_spike-1"],
            ["v-r1-loss_spike-2"],
        ]
        assert again.log.pending() == [] and out2.getvalue() == ""
        assert _samples(again)[("runwatch_alert_deliveries_pending", label)] == 0
        assert _samples(again)[("runwatch_alert_deliveries_total", label)] == 2
        again.log.close()
        third, _ = make(tmp_path, url)
        third.handle(records, now_s=20.0)
        third.flush()
        third.tick(20.0)
        assert len(server.bodies) == 2 and third.log.pending() == []


def test_pending_deliveries_back_off_between_tries(tmp_path):
    # 3 attempts of the first POST and 2 single tries fail; the third try goes through
    with Recorder(fail_first=5) as server:
        sink, _ = make(tmp_path, server.url)
        sink.handle([rec(T.anomalies, 0, anomaly())], now_s=0.0)
        sink.tick(1.0)
        assert server.attempts == 3 and len(sink.log.pending()) == 1
        tries = []
        for now in (1.0, 1.001, 2.0, 2.001, 4.0, 4.001, 8.0):
            sink.tick(now)
            tries.append(server.attempts)
        # never two tries in the same millisecond: each failure pushes the next one out
        assert tries == [3, 3, 4, 4, 5, 5, 6]
        server.wait_for(lambda b: len(b) == 1)
        assert sink.log.pending() == [] and sink.stats.retried == 1


def test_a_command_alert_never_precedes_its_cause(tmp_path):
    cause = anomaly(step=5)
    with Recorder() as server:
        sink, out = make(tmp_path, server.url)
        sink.handle([rec(T.commands, 0, restart(cause=cause.verdict_id))], now_s=0.0)
        sink.tick(1.5)  # its window closed, but the verdict behind it is not in yet
        assert out.getvalue() == "" and server.bodies == []
        sink.handle([rec(T.anomalies, 0, cause)], now_s=2.0)
        sink.tick(2.0)
        (body,) = server.wait_for(lambda b: len(b) == 1)
        assert [a["id"] for a in body["alerts"]] == [cause.verdict_id, "restart_requested:c1"]
        kinds = [line.split()[2:4] for line in out.getvalue().splitlines()]
        assert [k[1].split(":")[0] for k in kinds] == ["loss_spike", "restart_requested"]


def test_deliveries_owed_to_a_webhook_no_longer_configured_are_kept_not_sent(tmp_path):
    port = Recorder.free_port()
    url = f"http://127.0.0.1:{port}/hook"
    sink, _ = make(tmp_path, url)
    sink.handle([rec(T.anomalies, 0, anomaly())], now_s=0.0)
    sink.flush()
    sink.log.close()
    with Recorder(port=port) as server, Recorder() as other:
        again, _ = make(tmp_path, other.url)  # the operator now passes another webhook
        again.tick(10.0)
        assert server.attempts == 0 and [p.target for p in again.log.pending()] == [url]
