"""Which records the audit reads: the run's partition, from its first RunStarted on."""

from __future__ import annotations

import time

import msgspec
import pytest
from kafka import KafkaProducer

from runwatch import admin
from runwatch.processors.audit import START_MARGIN_MS, audit, load_run_log, records_of_run
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.logread import partition_for, read_history
from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import Event, Heartbeat, RunStarted, StepCompleted
from runwatch.schemas.topics import names

pytestmark = pytest.mark.integration

HOUR_MS = 3600 * 1000


def _step(run: str, n: int, ts_ms: int) -> StepCompleted:
    return StepCompleted(
        run_id=run, ts_ns=ts_ms * 10**6, step=n, loss=3.0, step_time_s=0.1, grad_norm=1.0
    )


def test_the_audit_starts_at_the_runs_first_run_started(kafka_bootstrap, topic_prefix):
    # Topics on the writers' clock (CreateTime): a cluster whose input topics could not be
    # switched to the broker's (docs/core.md), and the one way to date a record two hours
    # back here; the read starts from the RunStarted record's timestamp either way.
    specs = admin.catalogue(topic_prefix, 3)
    admin.create_topics(
        kafka_bootstrap, [msgspec.structs.replace(s, broker_time=False) for s in specs]
    )
    t = names(topic_prefix)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")

    def send(topic: str, event: Event, ts_ms: int) -> None:
        producer.send(topic, key=encode_key(event.run_id), value=encode(event), timestamp_ms=ts_ms)

    now_ms = int(time.time() * 1000)
    old_ms = now_ms - 2 * HOUR_MS
    for run, incarnation in (("fresh", 0), ("resumed", 1)):
        # a stray record of the run from long before its (first surviving) RunStarted
        send(t.steps, _step(run, 0, old_ms), old_ms)
        started = RunStarted(
            run_id=run, ts_ns=now_ms * 10**6, world_size=1, incarnation=incarnation
        )
        for topic in (t.runs, t.steps, t.heartbeats):
            send(topic, started, now_ms)
        for n in range(1, 6):
            send(t.steps, _step(run, n, now_ms + n), now_ms + n)
            beat = Heartbeat(run_id=run, ts_ns=(now_ms + n) * 10**6, rank=0, step=n)
            send(t.heartbeats, beat, now_ms + n)
    producer.flush(30)
    producer.close()

    cfg = DetectorConfig()
    topics = [t.steps, t.heartbeats, t.checkpoints, t.anomalies, t.commands]
    history = read_history(kafka_bootstrap, topics)

    fresh = load_run_log(kafka_bootstrap, topic_prefix, "fresh")
    assert fresh.start_ts_ms == now_ms - START_MARGIN_MS
    steps = [e.step for role, _, e in fresh.inputs if role == "steps" and hasattr(e, "step")]
    assert steps == [1, 2, 3, 4, 5]  # the stray record of two hours before is not read
    whole = records_of_run("fresh", history, names(topic_prefix))
    assert len(whole.inputs) == len(fresh.inputs) + 1
    assert {s.partition for _, s, _ in fresh.inputs} == {partition_for("fresh", 3)}

    # incarnation 0's RunStarted is gone: read the partition from its beginning
    resumed = load_run_log(kafka_bootstrap, topic_prefix, "resumed")
    assert resumed.start_ts_ms is None
    assert resumed == records_of_run("resumed", history, names(topic_prefix))
    assert audit(resumed, cfg).input_records == 1 + 2 + 10
