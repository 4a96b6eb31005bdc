"""The Alertmanager sink's posting rules, against a recording HTTP server.

What Alertmanager itself does with the posts (fires, resolves, silences) is tested against
the real binary in tests/integration/sinks/test_alertmanager.py.
"""

from __future__ import annotations

from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.records import RawRecord
from runwatch.schemas.topics import names
from runwatch.sinks.alert_conditions import fold
from runwatch.sinks.alertmanager import (
    API_PATH,
    AlertmanagerSettings,
    AlertmanagerSink,
    postable,
    run_page,
)
from runwatch.sinks.delivery_figures import receiver_label
from runwatch.sinks.webhook import RetryPolicy

from .events import S, anomaly, completed, ended, restart, started
from .recorder import Recorder

T = names("p")
FAST = RetryPolicy(attempts=1, base_delay_s=0.01, max_delay_s=0.02, timeout_s=5.0)


class Clock:
    """The sink's wall clock, moved by the test."""

    def __init__(self, now_s: float) -> None:
        self.now_ns = int(now_s * S)

    def __call__(self) -> int:
        return self.now_ns


def rec(topic, offset, event):
    return RawRecord(topic, 0, offset, encode_key(event.run_id), encode(event), 0)


def records(*items):
    return [rec(topic, i, event) for i, (topic, event) in enumerate(items)]


def make(urls, clock, **kw):
    kw.setdefault("settle_s", 1.0)
    settings = AlertmanagerSettings(urls=tuple(urls), retry=FAST, pending_max_delay_s=0.05, **kw)
    lines: list[str] = []
    sink = AlertmanagerSink(settings, T, wall_ns=clock, say=lines.append)
    return sink, lines


def caught_up(sink):
    sink.on_assigned([(t, 0) for t in sink.topics])
    sink.on_lag({(t, 0): 0 for t in sink.topics})


def alerts_in(bodies):
    """The latest posted state of each alert, by alertname (and rank)."""
    out = {}
    for body in bodies:
        for item in body:
            labels = item["labels"]
            out[(labels["alertname"], labels.get("rank"))] = item
    return out


def posted(server, n):
    return server.wait_for(lambda b: sum(len(x) for x in b) >= n)


# --------------------------------------------------------------------------- the payload


def test_a_postable_alert_has_the_labels_links_and_times_alertmanager_needs():
    _, (alert,) = fold(
        fold(None, started(tags={"team": "llm"}))[0], anomaly(kind="dead_rank", rank=2, ts_s=100)
    )
    settings = AlertmanagerSettings(
        urls=("http://am",),
        ui_url="http://ui.example:8080/",
        runbook_url="https://docs.example/runbooks.md",
        horizon_s=240,
    )
    item = postable(alert, settings, now_ns=1000 * S)
    assert item["labels"] == {
        "alertname": "dead_rank",
        "run": "r1",
        "severity": "critical",
        "incarnation": "0",
        "rank": "2",
        "team": "llm",
    }
    assert item["annotations"]["runbook_url"] == "https://docs.example/runbooks.md#dead-rank"
    assert {"summary", "description", "alert_id"} <= set(item["annotations"])
    assert item["generatorURL"] == "http://ui.example:8080/run/r1"
    assert item["startsAt"] == "1970-01-01T00:01:40.000000Z"
    assert item["endsAt"] == "1970-01-01T00:20:40.000000Z"  # now + horizon: still firing
    # an end before the horizon is the end; an end before the start is the start
    assert postable(alert, settings, now_ns=100 * S - 10_000 * S)["endsAt"] == item["startsAt"]


def test_run_pages_quote_the_run_id():
    assert run_page("http://ui", "a b/c") == "http://ui/run/a%20b%2Fc"


def test_no_generator_url_without_a_web_view():
    _, (alert,) = fold(None, anomaly(ts_s=100))
    assert "generatorURL" not in postable(alert, AlertmanagerSettings(urls=()), now_ns=0)


# --------------------------------------------------------------------------- when it posts


def test_nothing_is_posted_before_the_replay_caught_up_then_what_fires_or_just_ended():
    clock = Clock(5100)
    with Recorder() as server:
        sink, _ = make([server.url], clock)
        try:
            sink.handle(
                records(
                    (T.runs, started(tags={"team": "llm"})),
                    (T.anomalies, anomaly(kind="hang", rank=None, ts_s=150)),
                    (T.commands, restart(cid="c1", ts_s=151, cause_kind="hang")),
                    (T.runs, started(incarnation=1, ts_s=158, tags={"team": "llm"})),
                    (T.controller, completed(cid="c1", ts_s=160)),  # the hang ended at 158
                    (T.anomalies, anomaly(kind="straggler", rank=1, ts_s=3000, incarnation=1)),
                    (T.anomalies, anomaly(kind="loss_spike", ts_s=5000, incarnation=1)),
                    (T.anomalies, anomaly(kind="dead_rank", rank=2, ts_s=5001, incarnation=1)),
                ),
                now_s=0.0,
            )
            sink.tick(5.0)
            assert server.bodies == [] and not sink.caught_up
            sink.on_assigned([(t, 0) for t in sink.topics])
            sink.on_lag({(T.runs, 0): 0})  # not every partition sampled yet
            assert not sink.caught_up
            sink.on_lag({(t, 0): (1 if t == T.anomalies else 0) for t in sink.topics})
            assert not sink.caught_up
            sink.on_lag({(t, 0): 0 for t in sink.topics})
            assert sink.caught_up
            (body,) = posted(server, 3)
            got = {a["labels"]["alertname"]: a for a in body}
            # the hang and the restart ended over an hour ago (--keep); restart_completed is
            # info, below the default --min-severity
            assert set(got) == {"straggler", "loss_spike", "dead_rank"}
            assert got["straggler"]["endsAt"] == "1970-01-01T01:00:00.000000Z"  # ended
            # firing: now + the horizon (the episode would end at 5600 s, after it)
            assert got["loss_spike"]["endsAt"] == "1970-01-01T01:29:00.000000Z"
            assert got["dead_rank"]["endsAt"] == "1970-01-01T01:29:00.000000Z"
            assert server.attempts == 1
        finally:
            sink.close()


def test_a_new_alert_settles_first_and_one_that_ended_meanwhile_is_never_posted():
    clock = Clock(1000)
    with Recorder() as server:
        sink, _ = make([server.url], clock, settle_s=1.0)
        try:
            caught_up(sink)
            sink.handle(records((T.anomalies, anomaly(kind="hang", rank=None, ts_s=999))), 10.0)
            sink.tick(10.5)
            assert server.attempts == 0 and len(sink.staged) == 1
            sink.handle(records((T.runs, started(tags={"team": "llm"}))), 10.6)  # tags arrive
            sink.tick(11.0)  # the untagged alert ended (relabelled): dropped unposted
            sink.tick(11.6)  # the tagged one has settled
            (body,) = posted(server, 1)
            assert body[0]["labels"]["team"] == "llm"  # posted once, with the run's tags
            # a dead rank healed within the settle window pages nobody
            sink.handle(
                records(
                    (T.anomalies, anomaly(kind="dead_rank", rank=1, ts_s=1000, step=40)),
                    (T.runs, ended(ts_s=1000.5, status="stopped")),
                ),
                12.0,
            )
            sink.tick(13.5)
            assert sink.staged == {} and server.attempts == 1
        finally:
            sink.close()


def test_a_posted_alert_that_ends_is_posted_ended_at_once():
    clock = Clock(1000)
    with Recorder() as server:
        sink, _ = make([server.url], clock, settle_s=0.0)
        try:
            caught_up(sink)
            sink.handle(records((T.anomalies, anomaly(kind="dead_rank", rank=1, ts_s=990))), 1.0)
            sink.tick(1.0)
            posted(server, 1)
            sink.handle(records((T.runs, ended(ts_s=995, status="stopped"))), 2.0)
            bodies = posted(server, 2)
            assert bodies[-1][0]["endsAt"] == "1970-01-01T00:16:35.000000Z"
        finally:
            sink.close()


def test_firing_alerts_are_posted_again_every_resend_interval():
    clock = Clock(1000)
    with Recorder() as server:
        sink, _ = make([server.url], clock, settle_s=0.0, resend_s=60.0, horizon_s=240.0)
        try:
            caught_up(sink)
            sink.handle(records((T.anomalies, anomaly(kind="hang", rank=None, ts_s=990))), 0.0)
            sink.tick(0.0)
            first = posted(server, 1)[0][0]
            sink.tick(30.0)
            sink.tick(59.0)
            assert server.attempts == 1
            clock.now_ns += 60 * S
            sink.tick(60.0)
            second = posted(server, 2)[1][0]
            assert second["labels"] == first["labels"] and second["startsAt"] == first["startsAt"]
            assert second["endsAt"] > first["endsAt"]  # pushed ahead: still firing
        finally:
            sink.close()


def test_info_verdicts_are_not_posted_unless_asked():
    clock = Clock(1000)
    with Recorder() as server:
        for min_severity, expected in (("warning", 0), ("info", 1)):
            sink, _ = make([server.url], clock, settle_s=0.0, min_severity=min_severity)
            try:
                caught_up(sink)
                sink.handle(records((T.anomalies, anomaly(kind="grad_norm_spike", ts_s=999))), 0)
                sink.tick(0.0)
                assert len(sink.sent) == expected
            finally:
                sink.close()


# --------------------------------------------------------------------------- delivery


def _samples(sink):
    return {
        (s.name, s.labels.get("receiver")): s.value
        for family in sink.figures.collect()
        for s in family.samples
    }


def test_an_alertmanager_that_fails_is_retried_and_then_sent_everything_active():
    clock = Clock(1000)
    with Recorder(fail_first=3, status_when_failing=503) as server, Recorder() as other:
        sink, lines = make([server.url, other.url], clock, settle_s=0.0)
        try:
            caught_up(sink)
            sink.handle(
                records(
                    (T.anomalies, anomaly(kind="hang", rank=None, ts_s=990)),
                    (T.anomalies, anomaly(kind="dead_rank", rank=3, ts_s=991)),
                ),
                0.0,
            )
            sink.tick(0.0)
            assert len(posted(other, 2)) == 1  # the healthy one is not held up
            got = alerts_in(posted(server, 2))
            assert set(got) == {("hang", None), ("dead_rank", "3")}
            assert server.attempts >= 4
            label = receiver_label(server.url)
            assert _samples(sink)[("runwatch_alert_delivery_failed_attempts_total", label)] == 3
            assert any(
                "failed (HTTP 503" in line and "retried with backoff" in line for line in lines
            )
            assert sink.clients[0].wait_delivered(30)
            assert any("is back after 3 failed request(s)" in line for line in lines)
            sink.tick(0.1)  # it came back: every active alert goes to it again
            bodies = posted(server, 4)
            assert len(alerts_in(bodies[1:])) == 2 and sink.stats.snapshots == 2
            assert sink.clients[0].wait_delivered(30)
            assert _samples(sink)[("runwatch_alert_deliveries_pending", label)] == 0
            assert _samples(sink)[("runwatch_alert_deliveries_total", label)] >= 2
        finally:
            sink.close()


def test_a_refused_post_is_said_and_not_retried():
    clock = Clock(1000)
    with Recorder(fail_first=1, status_when_failing=400) as server:
        sink, lines = make([server.url], clock, settle_s=0.0)
        try:
            caught_up(sink)
            sink.handle(records((T.anomalies, anomaly(kind="hang", rank=None, ts_s=990))), 0.0)
            sink.tick(0.0)
            assert sink.clients[0].wait_delivered(30)
            assert any("refused 1 alert(s) (HTTP 400" in line for line in lines)
        finally:
            sink.close()
    assert server.attempts == 1


def test_the_endpoint_is_alertmanagers_api_v2():
    sink, _ = make(["http://am.example:9093/"], Clock(0))
    try:
        assert sink.clients[0].endpoint == "http://am.example:9093" + API_PATH
    finally:
        sink.close()
