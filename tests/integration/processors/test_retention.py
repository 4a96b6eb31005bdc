"""A live worker evicts the liveness state of a run that ended past its retention.

Issue 19, finding 10: 100,000 run ids grew a worker without bound, none ever evicted. The
run here ended two days ago in log time (its records say so; the past is not bounded), so
the first Tick of the processors' clock after it is past `ENDED_RETENTION_NS`: its state
is deleted from the table (a tombstone in the changelog) while a live run's stays.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kafka import KafkaProducer

from runwatch.processors.core.retention import ENDED_RETENTION_NS
from runwatch.processors.fleet import latest_states, wait_until_processed
from runwatch.schemas.topics import names

from .harness import workers

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
