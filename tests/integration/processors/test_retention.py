"""A live worker evicts the states of runs past their retention and caps a partition.

Issue 19, finding 10: 100,000 run ids grew a worker without bound, none ever evicted. The
run here ended two days ago in log time (its records say so; the past is not bounded), so
the first Tick of the processors' clock after it is past `ENDED_RETENTION_NS`: its state
is deleted from the table (a tombstone in the changelog) while a live run's stays. Steps
partitions carry no Ticks: their sweep is the record at a multiple of
`SWEEP_EVERY_RECORDS`, and a partition full of flood run ids refuses the next new one.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kafka import KafkaProducer

from runwatch.processors.core.retention import (
    ENDED_RETENTION_NS,
    MAX_RUNS_PER_PARTITION,
    SWEEP_EVERY_RECORDS,
)
from runwatch.processors.fleet import latest_states, wait_until_processed
from runwatch.schemas.events import DeadLetter
from runwatch.schemas.topics import names

from .harness import Reader, workers

pytestmark = pytest.mark.integration

WAIT_S = 180.0  # a worker starting on a loaded 2-core box


def _raw(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def test_an_ended_run_past_retention_is_evicted_and_a_live_one_kept(
    kafka_bootstrap: str, topic_prefix: str, make_topics: Any, tmp_path: Any
) -> None:
    make_topics(topic_prefix, partitions=1)
    topics = names(topic_prefix)
    now_ns = time.time_ns()
    then_ns = now_ns - 2 * ENDED_RETENTION_NS
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    old = [
        _raw(type="run_started.v1", run_id="old", ts_ns=then_ns, world_size=1),
        _raw(type="heartbeat.v1", run_id="old", ts_ns=then_ns, rank=0, step=1),
        _raw(type="run_ended.v1", run_id="old", ts_ns=then_ns + 10**9, status="completed"),
    ]
    for value in old:
        producer.send(topics.heartbeats, key=b"old", value=value).get(30)
    fresh = [
        _raw(type="run_started.v1", run_id="fresh", ts_ns=now_ns, world_size=1),
        _raw(type="heartbeat.v1", run_id="fresh", ts_ns=now_ns, rank=0, step=1),
    ]
    for value in fresh:
        producer.send(topics.heartbeats, key=b"fresh", value=value).get(30)
    producer.close()
    app_id = f"{topic_prefix}-app"
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=1) as start:
        worker = start()
        wait_until_processed(kafka_bootstrap, app_id, [topics.heartbeats], timeout_s=WAIT_S)
        deadline = time.monotonic() + WAIT_S
        views = latest_states(kafka_bootstrap, app_id)
        while "fresh" not in views or "old" in views:  # polling a changelog
            assert time.monotonic() < deadline, sorted(views)
            time.sleep(0.2)
            views = latest_states(kafka_bootstrap, app_id)
        log_text = worker.log_path.read_text(errors="replace")
    assert "Crashed" not in log_text, log_text[-3000:]
    live = views["fresh"].liveness
    assert live is not None and live.heartbeats == 1 and live.live


def test_a_steps_partition_is_swept_at_its_offsets_and_refuses_runs_past_its_cap(
    kafka_bootstrap: str, topic_prefix: str, make_topics: Any, tmp_path: Any
) -> None:
    make_topics(topic_prefix, partitions=1)
    topics = names(topic_prefix)
    now_ns = time.time_ns()
    then_ns = now_ns - 2 * ENDED_RETENTION_NS
    values = [  # offsets 0, 1, 2: a run that ended two days ago
        _raw(type="run_started.v1", run_id="old", ts_ns=then_ns, world_size=1),
        _raw(type="step.v1", run_id="old", ts_ns=then_ns, step=1, loss=2.0, step_time_s=1.0),
        _raw(type="run_ended.v1", run_id="old", ts_ns=then_ns + 10**9, status="completed"),
        _raw(type="run_started.v1", run_id="fresh", ts_ns=now_ns, world_size=1),
    ]
    n = 0
    while len(values) <= SWEEP_EVERY_RECORDS:  # the last one, at offset 1024, sweeps
        n += 1
        values.append(
            _raw(type="step.v1", run_id="fresh", ts_ns=now_ns, step=n, loss=2.0, step_time_s=1.0)
        )
    flood = [f"flood-{i:05d}" for i in range(MAX_RUNS_PER_PARTITION)]  # "fresh" + 2047 fill it
    values += [
        _raw(type="step.v1", run_id=run, ts_ns=now_ns, step=1, loss=2.0, step_time_s=1.0)
        for run in flood
    ]
    values.append(
        _raw(type="step.v1", run_id="fresh", ts_ns=now_ns, step=n + 1, loss=2.0, step_time_s=1.0)
    )
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=5)
    for value in values:
        run_id = json.loads(value)["run_id"]
        producer.send(topics.steps, key=run_id.encode(), value=value)
    producer.flush(60)
    producer.close()
    app_id = f"{topic_prefix}-app"
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=1) as start:
        worker = start()
        wait_until_processed(kafka_bootstrap, app_id, [topics.steps], timeout_s=WAIT_S)
        dead_reader = Reader(kafka_bootstrap, topics.deadletter)
        dead = dead_reader.wait_for(lambda ev: len(ev) >= 1)
        dead_reader.close()
        deadline = time.monotonic() + WAIT_S
        views = latest_states(kafka_bootstrap, app_id)
        while (
            (view := views.get("fresh")) is None
            or view.steps is None
            or (view.steps.last_step != n + 1)
        ):  # polling a changelog
            assert time.monotonic() < deadline, sorted(views)[:5]
            time.sleep(0.2)
            views = latest_states(kafka_bootstrap, app_id)
        log_text = worker.log_path.read_text(errors="replace")
    assert "Crashed" not in log_text, log_text[-3000:]
    assert "old" not in views  # swept at offset 1024 (a tombstone after its states)
    steps_held = {run for run, v in views.items() if v.steps is not None}
    assert steps_held == {"fresh", *flood[:-1]}  # the cap: 2048 runs
    (letter,) = dead
    assert isinstance(letter, DeadLetter) and letter.run_id == flood[-1]
    assert "PartitionFull" in letter.reason and letter.stage == "fold"
