"""Alerts in the real Alertmanager: firing with their labels, resolved, silenced, and kept.

A real Kafka broker, the Alertmanager sink reading it (in a thread, or `runwatch sinks
--alertmanager` as a process), and Debian's `prometheus-alertmanager` on a loopback port;
what Alertmanager holds is read back through its API (`GET /api/v2/alerts`) and `amtool`.
Event times are now: Alertmanager judges ``endsAt`` against its own clock.
"""

from __future__ import annotations

import os
import time

import pytest

from runwatch.procs import ManagedProcess
from runwatch.schemas.topics import names
from runwatch.sinks.alertmanager import AlertmanagerSettings, AlertmanagerSink
from runwatch.sinks.consumer import StartFrom
from runwatch.sinks.webhook import RetryPolicy
from tests.integration.sinks.alertmanager import RealAlertmanager, by_run
from tests.integration.sinks.test_alerts_metrics import Running, publish
from tests.unit.sinks.events import anomaly, completed, ended, restart, started
from tests.unit.sinks.recorder import Recorder

pytestmark = pytest.mark.integration

QUICK = RetryPolicy(attempts=1, base_delay_s=0.05, max_delay_s=0.1, timeout_s=2.0)


def make_sink(t, urls, *, lines=None, **kw):
    kw.setdefault("settle_s", 0.2)
    settings = AlertmanagerSettings(urls=tuple(urls), retry=QUICK, pending_max_delay_s=0.5, **kw)
    say = lines.append if lines is not None else print
    return AlertmanagerSink(settings, t, say=say)


class Sinking:
    """The Alertmanager sink reading the broker in a thread, from the beginning (REPLAY)."""

    def __init__(self, sink, bootstrap, group):
        self.sink = sink
        self.running = Running(sink, bootstrap, sink.topics, group, start=StartFrom.REPLAY)

    def __enter__(self):
        self.running.__enter__()
        self.running.wait_ready()
        return self.sink

    def __exit__(self, *exc):
        try:
            self.running.__exit__(*exc)
        finally:
            self.sink.close()


def of_run(alerts, run):
    return {a["labels"]["alertname"]: a for a in alerts if a["labels"]["run"] == run}


def identities(alerts, run):
    """``(alertname, incarnation)`` of a run's alerts: two incarnations' alerts of one name
    are two alerts, and a wait must tell them apart."""
    return {
        (a["labels"]["alertname"], a["labels"].get("incarnation"))
        for a in alerts
        if a["labels"]["run"] == run
    }


def test_a_run_with_a_spike_a_nan_rollback_and_a_dead_rank_fires_resolves_and_ends(
    kafka_bootstrap, topic_prefix, make_topics, alertmanager
):
    make_topics(topic_prefix, partitions=2)
    t = names(topic_prefix)
    # One timeline, fixed before anything is published and wholly in the past: the order of
    # verdicts, restart and ends is the log's, never how long the waits between took (an end
    # dated from the clock after a quick first wait fell before the verdict it had to end).
    base = time.time() - 60
    tags = {"team": "llm", "cluster": "west", "model": "gpt-1b"}
    publish(
        kafka_bootstrap,
        [
            (t.runs, started(run="ra", ts_s=base, tags=tags)),
            (t.anomalies, anomaly(run="ra", kind="loss_spike", step=30, ts_s=base + 10)),
            (t.anomalies, anomaly(run="ra", kind="nonfinite_loss", step=41, ts_s=base + 10.1)),
            (t.anomalies, anomaly(run="ra", kind="dead_rank", rank=3, step=41, ts_s=base + 10.2)),
        ],
    )
    sink = make_sink(
        t,
        [alertmanager.url],
        ui_url="http://127.0.0.1:8080",
        runbook_url="https://runbooks.example/runbooks.md",
    )
    with Sinking(sink, kafka_bootstrap, f"{topic_prefix}-am"):
        alerts = alertmanager.wait_alerts(lambda a: len(of_run(a, "ra")) == 3)
        got = of_run(alerts, "ra")
        assert set(got) == {"loss_spike", "nonfinite_loss", "dead_rank"}
        assert got["dead_rank"]["labels"] == {
            "alertname": "dead_rank",
            "run": "ra",
            "severity": "critical",
            "incarnation": "0",
            "rank": "3",
            **tags,
        }
        assert got["loss_spike"]["labels"]["severity"] == "warning"
        assert "rank" not in got["loss_spike"]["labels"]  # the emitting rank is no identity
        for name, alert in got.items():
            assert alert["status"]["state"] == "active"
            assert alert["generatorURL"] == "http://127.0.0.1:8080/run/ra"
            anchor = name.replace("_", "-")
            assert (
                alert["annotations"]["runbook_url"]
                == f"https://runbooks.example/runbooks.md#{anchor}"
            )
            assert alert["annotations"]["summary"] and alert["annotations"]["description"]

        # the rollback: the gang is stopped and comes back as incarnation 1, where a rank
        # dies (later on the timeline, still in the past: an end is past when the sink reads it)
        t0 = base + 20
        publish(
            kafka_bootstrap,
            [
                (
                    t.commands,
                    restart(
                        run="ra", cid="c1", ts_s=t0, action="rollback", cause_kind="nonfinite_loss"
                    ),
                ),
                (t.runs, ended(run="ra", ts_s=t0 + 0.5, status="stopped")),
                (t.runs, started(run="ra", incarnation=1, ts_s=t0 + 2, tags=tags)),
                (t.controller, completed(run="ra", cid="c1", ts_s=t0 + 2.1)),
                (
                    t.anomalies,
                    anomaly(
                        run="ra", kind="dead_rank", rank=5, step=44, ts_s=t0 + 3, incarnation=1
                    ),
                ),
            ],
        )
        # incarnation 0's dead rank resolves when the gang stops; until the sink has read
        # that far, Alertmanager still lists it beside the restart
        alerts = alertmanager.wait_alerts(
            lambda a: identities(a, "ra") == {("restart_requested", "0"), ("dead_rank", "1")}
        )
        got = of_run(alerts, "ra")
        assert got["dead_rank"]["labels"]["incarnation"] == "1"
        assert got["dead_rank"]["labels"]["rank"] == "5"
        assert got["restart_requested"]["labels"]["incarnation"] == "0"
        assert "rollback" in got["restart_requested"]["annotations"]["summary"]

        # the run ends: what is wrong with it is over; the restart stays shown a while
        publish(kafka_bootstrap, [(t.runs, ended(run="ra", ts_s=time.time()))])
        alerts = alertmanager.wait_alerts(lambda a: set(of_run(a, "ra")) == {"restart_requested"})


def test_a_silence_on_one_run_silences_that_run_only(
    kafka_bootstrap, topic_prefix, make_topics, alertmanager
):
    make_topics(topic_prefix, partitions=2)
    t = names(topic_prefix)
    now = time.time()
    publish(
        kafka_bootstrap,
        [
            (t.anomalies, anomaly(run="quiet-me", kind="hang", rank=None, ts_s=now)),
            (t.anomalies, anomaly(run="quiet-me", kind="loss_spike", ts_s=now)),
            (t.anomalies, anomaly(run="page-me", kind="hang", rank=None, ts_s=now)),
        ],
    )
    with Sinking(make_sink(t, [alertmanager.url]), kafka_bootstrap, f"{topic_prefix}-am"):
        alertmanager.wait_alerts(lambda a: len(a) == 3)
        silence = alertmanager.amtool(
            "silence",
            "add",
            "run=quiet-me",
            "--comment=maintenance",
            "--author=test",
            "--duration=1h",
        ).strip()
        assert silence
        alerts = alertmanager.wait_alerts(
            lambda a: all(
                x["status"]["state"] == "suppressed" for x in a if x["labels"]["run"] == "quiet-me"
            )
        )
        states = {(a["labels"]["run"], a["labels"]["alertname"]): a["status"] for a in alerts}
        assert states[("quiet-me", "hang")]["silencedBy"] == [silence]
        assert states[("quiet-me", "loss_spike")]["silencedBy"] == [silence]
        assert states[("page-me", "hang")] == {
            "state": "active",
            "silencedBy": [],
            "inhibitedBy": [],
        }
        unsilenced = alertmanager.alerts(silenced="false")
        assert by_run(unsilenced) == {"page-me": {"hang"}}


def test_an_alertmanager_that_was_down_gets_everything_once_it_is_back(
    kafka_bootstrap, topic_prefix, make_topics, alertmanager
):
    make_topics(topic_prefix, partitions=2)
    t = names(topic_prefix)
    lines: list[str] = []
    # re-sends far apart: what brings the alerts back is the retry, not the periodic re-send
    sink = make_sink(t, [alertmanager.url], lines=lines, resend_s=3600.0)
    with Sinking(sink, kafka_bootstrap, f"{topic_prefix}-am"):
        publish(
            kafka_bootstrap,
            [(t.anomalies, anomaly(run="ra", kind="hang", rank=None, ts_s=time.time()))],
        )
        alertmanager.wait_alerts(lambda a: by_run(a) == {"ra": {"hang"}})

        alertmanager.stop()  # down: alerts are produced meanwhile, and one run recovers
        now = time.time()
        publish(
            kafka_bootstrap,
            [
                (t.anomalies, anomaly(run="ra", kind="dead_rank", rank=1, ts_s=now)),
                (t.anomalies, anomaly(run="rb", kind="nonfinite_loss", ts_s=now)),
                (t.anomalies, anomaly(run="rc", kind="hang", rank=None, ts_s=now)),
                (t.runs, started(run="rc", incarnation=1, ts_s=now + 1)),
            ],
        )
        deadline = time.monotonic() + 60
        while sink.clients[0].failures < 2 and time.monotonic() < deadline:
            sink.clients[0].wait_delivered(0.2)  # waits on the client's own condition
        assert sink.clients[0].failures >= 2 and sink.clients[0].pending_count() >= 1
        assert any("failed" in line and "retried with backoff" in line for line in lines)

        alertmanager.start()  # back, with no alerts in memory: it must be sent all of them
        alerts = alertmanager.wait_alerts(
            lambda a: by_run(a) == {"ra": {"hang", "dead_rank"}, "rb": {"nonfinite_loss"}},
            timeout_s=30,
        )
        assert all(a["status"]["state"] == "active" for a in alerts)
        assert any("is back after" in line for line in lines)
        assert sink.clients[0].wait_delivered(30)
        figures = {
            (s.name, s.labels["receiver"]): s.value
            for f in sink.figures.collect()
            for s in f.samples
        }
        receiver = alertmanager.url
        assert figures[("runwatch_alert_delivery_failed_attempts_total", receiver)] >= 2
        assert figures[("runwatch_alert_deliveries_pending", receiver)] == 0


@pytest.fixture
def start_sinks(kafka_bootstrap, topic_prefix, tmp_path):
    """Start `runwatch sinks --alertmanager URL` processes; every one is stopped at the end."""
    started_: list[ManagedProcess] = []

    def start(name, url):
        args = ["sinks", "--alertmanager", url, "--group-wait-s", "0.2",
                "--webhook-backoff-s", "0.05", "--pending-max-delay-s", "0.5",
                "--ui-url", "http://127.0.0.1:8080",
                "--bootstrap", kafka_bootstrap, "--prefix", topic_prefix]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = ManagedProcess.runwatch(name, args, tmp_path / f"{name}.log", env=env)
        started_.append(proc)
        return proc

    yield start
    for proc in started_:
        proc.stop()


def test_a_sinks_restart_fires_nothing_twice_and_resolves_what_ended_meanwhile(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path, start_sinks
):
    make_topics(topic_prefix, partitions=2)
    t = names(topic_prefix)
    workdir = tmp_path / "am"
    workdir.mkdir()
    with Recorder() as hook:  # where Alertmanager sends its notifications
        am = RealAlertmanager(workdir, hook=hook.url)
        am.start()
        try:
            now = time.time()
            publish(
                kafka_bootstrap,
                [
                    (t.anomalies, anomaly(run="stays", kind="hang", rank=None, ts_s=now)),
                    (t.anomalies, anomaly(run="heals", kind="dead_rank", rank=2, ts_s=now)),
                ],
            )
            first = start_sinks("sinks-1", am.url)
            before = am.wait_alerts(
                lambda a: by_run(a) == {"stays": {"hang"}, "heals": {"dead_rank"}}
            )
            hook.wait_for(lambda b: {n["groupLabels"]["run"] for n in b} == {"stays", "heals"})
            first.kill()  # no goodbye: its alerts stay in Alertmanager until their endsAt

            publish(
                kafka_bootstrap, [(t.runs, started(run="heals", incarnation=1, ts_s=time.time()))]
            )
            second = start_sinks("sinks-2", am.url)
            after = am.wait_alerts(lambda a: by_run(a) == {"stays": {"hang"}}, timeout_s=90)
            # the same alert: same fingerprint, same start
            (hang_before,) = [a for a in before if a["labels"]["run"] == "stays"]
            assert [(a["fingerprint"], a["startsAt"]) for a in after] == [
                (hang_before["fingerprint"], hang_before["startsAt"])
            ]
            resolved = hook.wait_for(
                lambda b: any(
                    n["status"] == "resolved" and n["groupLabels"]["run"] == "heals" for n in b
                )
            )
            firing_stays = [
                n
                for n in resolved
                if n["groupLabels"]["run"] == "stays" and n["status"] == "firing"
            ]
            assert len(firing_stays) == 1, resolved  # paged once, not again after the restart
            assert "Traceback" not in second.log_path.read_text()
            second.stop()
        finally:
            am.stop()
