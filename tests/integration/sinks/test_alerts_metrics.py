"""Alerts and metrics sinks against the real broker, in threads of the test process."""

from __future__ import annotations

import io
import re
import threading
import time
import urllib.request

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewPartitions

from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.topics import names
from runwatch.sinks.alert_log import DeliveryLog
from runwatch.sinks.alerts import AlertSettings, AlertSink
from runwatch.sinks.consumer import SinkLoop, StartFrom, start_thread
from runwatch.sinks.metrics import MetricsSink
from runwatch.sinks.webhook import RetryPolicy
from tests.unit.sinks.events import (
    anomaly,
    completed,
    ended,
    heartbeat,
    rejected,
    restart,
    started,
    step,
)
from tests.unit.sinks.recorder import Recorder

pytestmark = pytest.mark.integration

FAST = RetryPolicy(attempts=4, base_delay_s=0.05, max_delay_s=0.1, timeout_s=5.0)


def publish(bootstrap, items):
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for topic, event in items:
        producer.send(topic, key=encode_key(event.run_id), value=encode(event))
    producer.flush(30)
    producer.close()


class Running:
    """A sink's consumer loop in a thread; stops on exit."""

    def __init__(self, sink, bootstrap, topics, group, **kwargs):
        kwargs.setdefault("notify", print)
        kwargs.setdefault("poll_timeout_s", 0.1)
        self.stop = threading.Event()
        self.loop = SinkLoop(
            sink,
            bootstrap=bootstrap,
            topics=topics,
            group_id=group,
            stop=self.stop,
            lag_interval_s=0.2,
            **kwargs,
        )

    def __enter__(self):
        self.thread = start_thread(self.loop)
        return self

    def wait_ready(self, timeout_s=60.0):
        assert self.loop.ready.wait(timeout_s), "no partitions assigned"
        assert self.loop.error is None, self.loop.error

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)
        assert self.loop.error is None, self.loop.error


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def sample(text, name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if m and m[1] == name:
            got = ",".join(sorted((m[2] or "").split(","))) if m[2] else ""
            if got == want:
                return float(m[3])
    return None


def scrape_until(port, ok, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        text = scrape(port)
        if ok(text):
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"metrics never matched:\n{text}")
        time.sleep(0.1)  # polling an HTTP endpoint: the wait is on its content, not the sleep


def test_alerts_are_delivered_once_across_a_restart(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path
):
    make_topics(topic_prefix, partitions=2)
    t = names(topic_prefix)
    group = f"{topic_prefix}-alerts"
    publish(
        kafka_bootstrap,
        [
            (t.anomalies, anomaly(run="ra", step=30)),
            (t.anomalies, anomaly(run="ra", step=30)),  # at-least-once duplicate
            (t.anomalies, anomaly(run="rb", kind="hang", step=7, rank=None)),
            (t.commands, restart(run="ra", cid="c1")),
            (t.controller, rejected(run="ra", cid="c1")),
        ],
    )
    with Recorder(fail_first=2) as server:
        settings = AlertSettings(webhooks=(server.url,), group_wait_s=0.3, retry=FAST)
        out = io.StringIO()
        sink = AlertSink(settings, t, DeliveryLog(tmp_path / "state.jsonl"), out=out)
        with Running(sink, kafka_bootstrap, sink.topics, group) as run:
            bodies = server.wait_for(lambda b: sum(len(x["alerts"]) for x in b) >= 4)
        # one join: the topics' metadata came before it (a join without it assigns
        # nothing, and kafka-python can drop the rejoin's assignment: sinks/consumer.py)
        assert run.loop.joins == 1
        sink.log.close()
        ids = sorted(a["id"] for b in bodies for a in b["alerts"])
        assert ids == sorted(
            ["v-ra-loss_spike-30", "v-rb-hang-7", "restart_requested:c1", "command_rejected:c1"]
        )
        assert server.attempts >= 4  # two 500s were retried
        assert {b["run"] for b in bodies} == {"ra", "rb"}
        assert len(out.getvalue().splitlines()) == 4

        # a new process with the same group and state: old alerts stay quiet, new ones go out
        publish(kafka_bootstrap, [(t.anomalies, anomaly(run="ra", kind="straggler", step=31))])
        again = AlertSink(settings, t, DeliveryLog(tmp_path / "state.jsonl"), out=io.StringIO())
        with Running(again, kafka_bootstrap, again.topics, group):
            bodies = server.wait_for(lambda b: len(b) >= len(bodies) + 1, timeout_s=60)
        assert [a["id"] for a in bodies[-1]["alerts"]] == ["v-ra-straggler-31"]
        assert again.stats.duplicates == 0

        # the same group with the state lost and offsets reset would re-alert: the delivery
        # log, not the offsets, is what prevents it
        third = AlertSink(settings, t, DeliveryLog(tmp_path / "state.jsonl"), out=io.StringIO())
        with Running(third, kafka_bootstrap, third.topics, f"{group}-fresh") as run:
            run.wait_ready()
            assert run.loop.joins == 1
            deadline = time.monotonic() + 30
            while third.stats.duplicates < 6 and time.monotonic() < deadline:
                run.loop.ready.wait(0.1)
                time.sleep(0.05)
        assert third.stats.duplicates == 6 and third.stats.alerts == 0
        assert len(server.bodies) == len(bodies)


def test_a_sink_reads_the_partitions_added_to_its_topic(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path
):
    """A partition added under a running sink rejoins its group; no partition is left unread.

    The metadata's change rejoins the group. Polls of 5 ms end while that rejoin is in
    flight, where kafka-python 3.0.12 can drop the join's assignment and leave the old
    partitions revoked and unfetched (`SinkLoop._run_one_consumer`): the sink must then
    start a fresh consumer and read the old partition and the new one.
    """
    make_topics(topic_prefix, partitions=1)
    t = names(topic_prefix)
    notes: list[str] = []
    with Recorder() as server:
        settings = AlertSettings(webhooks=(server.url,), group_wait_s=0.1, retry=FAST)
        sink = AlertSink(settings, t, DeliveryLog(tmp_path / "state.jsonl"), out=io.StringIO())
        with Running(
            sink, kafka_bootstrap, sink.topics, f"{topic_prefix}-alerts",
            poll_timeout_s=0.005, session_timeout_s=6, notify=notes.append,
            client_config={"metadata_max_age_ms": 500},
        ) as run:  # fmt: skip
            run.wait_ready()
            assert run.loop.joins == 1
            publish(kafka_bootstrap, [(t.anomalies, anomaly(run="ra", step=1))])
            server.wait_for(lambda b: len(b) >= 1)
            admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
            admin.create_partitions({t.anomalies: NewPartitions(total_count=2)})
            admin.close()
            # the new partition's join, or a fresh consumer's, with its positions resolved
            deadline = time.monotonic() + 60
            while not any("(join 2); reading" in note for note in notes):
                assert time.monotonic() < deadline, notes
                assert run.loop.error is None, run.loop.error
                time.sleep(0.05)  # polling the notes the loop's thread appends; they decide
            producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
            for partition, step_n in ((0, 2), (1, 3)):
                event = anomaly(run="ra", step=step_n)
                producer.send(
                    t.anomalies, encode(event), encode_key(event.run_id), partition=partition
                )
            producer.flush(30)
            producer.close()
            bodies = server.wait_for(lambda b: sum(len(x["alerts"]) for x in b) >= 3, timeout_s=60)
    ids = sorted(a["id"] for b in bodies for a in b["alerts"])
    assert ids == ["v-ra-loss_spike-1", "v-ra-loss_spike-2", "v-ra-loss_spike-3"], notes


def test_metrics_are_scraped_over_http(kafka_bootstrap, topic_prefix, make_topics):
    make_topics(topic_prefix, partitions=2)
    t = names(topic_prefix)
    sink = MetricsSink(t)
    port = sink.serve(0, "127.0.0.1")
    try:
        with Running(sink, kafka_bootstrap, sink.topics, f"{topic_prefix}-metrics"):
            publish(
                kafka_bootstrap,
                [
                    (t.steps, started(run="rm")),
                    (t.steps, step(run="rm", n=41, loss=2.5)),
                    (t.heartbeats, heartbeat(run="rm", rank=0, ts_s=100)),
                    (t.heartbeats, heartbeat(run="rm", rank=1, ts_s=100)),
                    (t.anomalies, anomaly(run="rm", kind="loss_spike", step=41)),
                    (t.anomalies, anomaly(run="rm", kind="loss_spike", step=41)),
                    (t.anomalies, anomaly(run="rm", kind="dead_rank", step=41, rank=1)),
                    (t.commands, restart(run="rm", cid="c9")),
                    (t.controller, completed(run="rm", cid="c9")),
                ],
            )
            text = scrape_until(
                port,
                lambda x: (
                    sample(x, "runwatch_restart_outcomes_total", run="rm", outcome="completed") == 1
                ),
            )
            assert sample(text, "runwatch_run_loss", run="rm") == 2.5
            assert sample(text, "runwatch_run_grad_norm", run="rm") == 1.25
            assert sample(text, "runwatch_run_last_step", run="rm") == 41
            assert sample(text, "runwatch_run_tokens_per_second", run="rm") == 8192
            assert 0 < sample(text, "runwatch_run_mfu_ratio", run="rm") < 1
            assert sample(text, "runwatch_run_live_ranks", run="rm") == 2
            assert sample(text, "runwatch_anomalies_total", run="rm", kind="loss_spike") == 1
            assert sample(text, "runwatch_anomalies_total", run="rm", kind="dead_rank") == 1
            assert sample(text, "runwatch_restarts_total", run="rm") == 1
            text = scrape_until(port, lambda x: "runwatch_consumer_lag_records{" in x)
            lags = [
                sample(text, "runwatch_consumer_lag_records", topic=tp, partition=p)
                for tp in sink.topics
                for p in (0, 1)
            ]
            assert all(v is not None and v >= 0 for v in lags)
    finally:
        sink.close()


def test_a_new_alert_group_starts_from_now_unless_from_the_beginning(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path
):
    make_topics(topic_prefix, partitions=1)
    t = names(topic_prefix)
    past = [(t.anomalies, anomaly(run="ra", step=s)) for s in (1, 2, 3)]
    publish(kafka_bootstrap, past)
    settings = AlertSettings(group_wait_s=0.1, retry=FAST)

    out = io.StringIO()
    sink = AlertSink(settings, t, DeliveryLog(tmp_path / "a.jsonl"), out=out)
    with Running(
        sink, kafka_bootstrap, sink.topics, f"{topic_prefix}-new", start=StartFrom.LATEST
    ) as run:
        run.wait_ready()
        publish(kafka_bootstrap, [(t.anomalies, anomaly(run="ra", kind="hang", step=4))])
        deadline = time.monotonic() + 30
        while sink.stats.alerts < 1 and time.monotonic() < deadline:
            time.sleep(0.05)  # waiting on the sink's own count
        sink.flush()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and "v-ra-hang-4" in lines[0], lines  # the past stayed quiet

    replay = io.StringIO()
    again = AlertSink(settings, t, DeliveryLog(tmp_path / "b.jsonl"), out=replay)
    with Running(
        again, kafka_bootstrap, again.topics, f"{topic_prefix}-old", start=StartFrom.EARLIEST
    ):
        deadline = time.monotonic() + 30
        while again.stats.alerts < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert again.stats.alerts == 4  # --from-beginning: the whole history, as asked


def test_a_metrics_restart_shows_the_same_per_run_figures(
    kafka_bootstrap, topic_prefix, make_topics
):
    make_topics(topic_prefix, partitions=2)
    t = names(topic_prefix)
    publish(
        kafka_bootstrap,
        [
            (t.steps, started(run="done")),
            (t.steps, step(run="done", n=9, loss=1.5)),
            (t.anomalies, anomaly(run="done", kind="loss_spike", step=9)),
            (t.steps, ended(run="done")),
        ],
    )
    group = f"{topic_prefix}-metrics"
    wanted = {
        ("runwatch_runs_tracked", ()): 1.0,
        ("runwatch_run_last_step", (("run", "done"),)): 9.0,
        ("runwatch_run_loss", (("run", "done"),)): 1.5,
        ("runwatch_anomalies_total", (("kind", "loss_spike"), ("run", "done"))): 1.0,
    }

    def figures(text):
        return {(name, labels): sample(text, name, **dict(labels)) for name, labels in wanted}

    for _ in range(2):  # the same group twice: a restart
        sink = MetricsSink(t)
        port = sink.serve(0, "127.0.0.1")
        try:
            with Running(sink, kafka_bootstrap, sink.topics, group, start=StartFrom.REPLAY):
                text = scrape_until(port, lambda x: figures(x) == wanted, timeout_s=90)
        finally:
            sink.close()
        assert figures(text) == wanted
