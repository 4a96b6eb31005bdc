"""With ``RUNWATCH_BOOTSTRAP`` set, the example emits every event kind to a real broker."""

from __future__ import annotations

import collections
import math

import pytest

from runwatch.schemas.codec import decode
from runwatch.schemas.events import (
    CheckpointCommitted,
    Heartbeat,
    ModelFlopConfig,
    ParallelPlan,
    RunEnded,
    RunStarted,
    StepCompleted,
)

pytestmark = [pytest.mark.torch, pytest.mark.integration]


def test_gang_emits_to_kafka(kafka_bootstrap, topic_prefix, make_topics, gang_control, tmp_path):
    from kafka import KafkaConsumer

    start_gang, wait_gang = gang_control
    specs = make_topics(topic_prefix)
    env = {
        "RUNWATCH_BOOTSTRAP": kafka_bootstrap,
        "RUNWATCH_TOPIC_PREFIX": topic_prefix,
        "RUNWATCH_RUN_ID": "emit-test",
    }
    args = [
        "--steps",
        "8",
        "--checkpoint-dir",
        str(tmp_path / "ckpt"),
        "--checkpoint-every",
        "4",
        "--inject",
        "nan@6",
        "--skip-nonfinite",
    ]
    gang = wait_gang(
        start_gang(2, args, tmp_path / "trace", env=env, emit=True), tmp_path / "trace"
    )
    assert gang.returncodes == [0, 0], "\n".join(gang.logs)

    consumer = KafkaConsumer(
        *[s.name for s in specs],
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
    )
    by_topic: dict[str, list] = collections.defaultdict(list)
    for record in consumer:
        by_topic[record.topic.removeprefix(f"{topic_prefix}.")].append(decode(record.value))
    consumer.close()

    (started,) = [e for e in by_topic["runs"] if isinstance(e, RunStarted)]
    assert started.run_id == "emit-test" and started.world_size == 2
    assert started.plan == ParallelPlan(dp_replicate=2)
    assert started.flop_config == ModelFlopConfig(
        n_params=116_480, n_layer=2, n_head=4, d_model=64, seq_len=64
    )
    steps = [e for e in by_topic["steps"] if isinstance(e, StepCompleted)]
    assert [s.step for s in steps] == list(range(1, 9))
    assert math.isnan(steps[5].loss) and steps[5].skipped
    assert all(s.tokens == 16 * 64 and s.data_parallel_size == 2 for s in steps)
    beats = collections.Counter(e.rank for e in by_topic["heartbeats"] if isinstance(e, Heartbeat))
    assert beats == {0: 8, 1: 8}
    commits = [e for e in by_topic["checkpoints"] if isinstance(e, CheckpointCommitted)]
    assert [c.step for c in commits] == [4, 8]
    assert all(len(c.loader_states) == 2 for c in commits)
    (ended,) = [e for e in by_topic["runs"] if isinstance(e, RunEnded)]
    assert ended.status == "completed" and ended.final_step == 8
