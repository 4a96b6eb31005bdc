"""RunEmitter against a real Kafka broker: every event type, NaN, an outage, and back."""

from __future__ import annotations

import math
import shutil
import socket
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runwatch import admin
from runwatch.broker import EmbeddedBroker
from runwatch.processors.logread import partition_for
from runwatch.producers import EmitterStats, RunEmitter
from runwatch.schemas.codec import decode
from runwatch.schemas.events import (
    CheckpointCommitted,
    CheckpointFailed,
    Heartbeat,
    LoaderState,
    ModelFlopConfig,
    ParallelPlan,
    RunEnded,
    RunStarted,
    StepCompleted,
)
from runwatch.schemas.topics import names
from tests.integration.producers.conftest import Consume, consume_records

pytestmark = pytest.mark.integration


def input_topics(prefix: str) -> list[str]:
    topics = names(prefix)
    return [topics.runs, topics.steps, topics.heartbeats, topics.checkpoints]


def partition_counts(bootstrap: str, topics: list[str]) -> dict[str, int]:
    """Each topic's partition count, from the cluster's metadata."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        return {t: len(consumer.partitions_for_topic(t) or ()) for t in topics}
    finally:
        consumer.close()


def test_every_input_event_round_trips_through_kafka(
    kafka_bootstrap: str, topic_prefix: str, make_topics: Callable[..., Any], consume: Consume
) -> None:
    make_topics(topic_prefix)
    topics = names(topic_prefix)
    run_id = f"run-{topic_prefix}"
    flops = ModelFlopConfig(n_params=124_356_864, n_layer=12, n_head=12, d_model=768, seq_len=1024)
    state = LoaderState(seed=1, epoch=0, rank=0, world_size=2, batch_idx=3, global_sample=96)
    with RunEmitter(
        run_id, bootstrap=kafka_bootstrap, topic_prefix=topic_prefix, rank=0, world_size=2
    ) as em:
        em.run_started(
            flop_config=flops,
            plan=ParallelPlan(dp_shard=2),
            peak_flops_per_s=624e12,
            dtype="bf16",
            vocab_size=50257,
            tags={"model": "gpt2"},
            thresholds={"loss_z_thresh": 8.0},
        )
        em.step(1, loss=3.1, step_time_s=0.25, grad_norm=0.9, tokens=65536, lr=6e-4)
        em.step(2, loss=3.0, step_time_s=0.26, skipped=True, restart_from_step=1)
        em.heartbeat(2, step_time_s=0.25)
        em.checkpoint_committed(2, "/ckpt/2", loader_states=[state], size_bytes=123, write_s=1.5)
        em.checkpoint_failed(3, "/ckpt/3", "No space left on device")
        em.run_ended("failed", final_step=3, reason="disk full")
        assert em.flush(30.0)
    assert em.stats == EmitterStats(enqueued=7, delivered=7, dropped=0, failed=0, buffered=0)

    # run_started and run_ended go to three topics each: 2 * 3 + 5 = 11 records.
    records = consume(input_topics(topic_prefix), 11)
    assert len(records) == 11
    by_topic: dict[str, list[Any]] = defaultdict(list)
    counts = partition_counts(kafka_bootstrap, sorted({r.topic for r in records}))
    for record in records:
        assert record.key == run_id.encode()
        by_topic[record.topic].append(decode(record.value))
        # the default partitioner (murmur2 of the key), whatever each topic's count
        assert record.partition == partition_for(run_id, counts[record.topic]), record.topic
    for events in by_topic.values():
        events.sort(key=lambda e: e.seq)
    assert [type(e) for e in by_topic[topics.runs]] == [RunStarted, RunEnded]
    assert [type(e) for e in by_topic[topics.steps]] == [
        RunStarted,
        StepCompleted,
        StepCompleted,
        RunEnded,
    ]
    assert [type(e) for e in by_topic[topics.heartbeats]] == [RunStarted, Heartbeat, RunEnded]
    assert [type(e) for e in by_topic[topics.checkpoints]] == [
        CheckpointCommitted,
        CheckpointFailed,
    ]
    started = by_topic[topics.runs][0]
    assert started.flop_config == flops and started.world_size == 2
    assert started.plan == ParallelPlan(dp_shard=2) and started.peak_flops_per_s == 624e12
    step = by_topic[topics.steps][1]
    assert (step.step, step.loss, step.tokens, step.data_parallel_size) == (1, 3.1, 65536, 2)
    assert by_topic[topics.steps][2].restart_from_step == 1
    heartbeat = by_topic[topics.heartbeats][1]
    assert heartbeat.host == socket.gethostname() and heartbeat.pid > 0
    committed = by_topic[topics.checkpoints][0]
    assert committed.loader_states == (state,) and committed.size_bytes == 123
    ended = by_topic[topics.runs][1]
    assert (ended.status, ended.final_step, ended.reason) == ("failed", 3, "disk full")


def test_nan_and_infinite_losses_survive_the_broker(
    kafka_bootstrap: str, topic_prefix: str, make_topics: Callable[..., Any], consume: Consume
) -> None:
    make_topics(topic_prefix)
    values = [math.nan, math.inf, -math.inf, 2.5]
    with RunEmitter("nan-run", bootstrap=kafka_bootstrap, topic_prefix=topic_prefix) as em:
        for i, value in enumerate(values):
            em.step(i, loss=value, step_time_s=0.1, grad_norm=value)
        assert em.flush(30.0)
    records = consume([names(topic_prefix).steps], len(values))
    events = sorted((decode(r.value) for r in records), key=lambda e: e.step)
    assert len(events) == len(values)
    assert math.isnan(events[0].loss) and math.isnan(events[0].grad_norm)
    assert [e.loss for e in events[1:]] == [math.inf, -math.inf, 2.5]
    assert [e.grad_norm for e in events[1:]] == [math.inf, -math.inf, 2.5]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.skipif(shutil.which("java") is None, reason="the embedded broker needs java")
def test_broker_down_then_up_then_down_again(tmp_path: Path) -> None:
    """Nothing listens at first; then a broker starts there, stops and starts again."""
    port = _free_port()
    bootstrap = f"127.0.0.1:{port}"
    prefix = "outage"
    topics = names(prefix)
    broker = EmbeddedBroker(tmp_path / "broker", port=port)
    em = RunEmitter("outage-run", bootstrap=bootstrap, topic_prefix=prefix, max_buffered=1000)
    try:
        started = time.perf_counter()
        em.run_started()
        for step in range(20):
            em.step(step, loss=1.0 / (step + 1), step_time_s=0.1)
            em.heartbeat(step)
        calls_s = time.perf_counter() - started
        assert calls_s < 1.0, f"41 calls with no broker took {calls_s:.3f} s"
        assert em.stats.buffered == 41 and em.stats.delivered == 0

        broker.start()
        admin.create_catalogue(bootstrap, prefix=prefix, partitions=2)
        assert em.flush(60.0), em.stats
        first = consume_records(bootstrap, [topics.steps], 21, timeout_s=30)
        assert sorted(e.seq for e in map(decode, (r.value for r in first))) == [
            1,
            *range(2, 42, 2),
        ]

        broker.stop()
        started = time.perf_counter()
        for step in range(20, 30):
            em.step(step, loss=0.5, step_time_s=0.1)
        assert time.perf_counter() - started < 1.0
        broker.start()
        em.run_ended("completed", final_step=29)
        assert em.close(60.0), em.stats
        assert em.stats == EmitterStats(enqueued=52, delivered=52, dropped=0, failed=0, buffered=0)
        records = consume_records(bootstrap, [topics.steps], 32, timeout_s=30)
        events = [decode(r.value) for r in records]
        steps = sorted(e.step for e in events if isinstance(e, StepCompleted))
        assert steps == list(range(30))  # none lost, none duplicated
        assert sum(isinstance(e, RunEnded) for e in events) == 1
    finally:
        em.close(1.0)
        broker.stop()
