"""Records that try to steer verdicts through time, written as an attacker would.

The writing side is plain kafka-python with raw JSON bytes: no runwatch code, and the
attacker sets the record's own (CreateTime) timestamp as far ahead as the event's. The
reading side is the fold every reader shares (`schemas.records.split`, then the core's
`Replayer`: what the live agents, the audit and replay run), over the log as the broker
stored it.

Issue 19, finding 2: one ``tick.v1`` dated a day ahead on a heartbeats partition raised
``hang`` and ``dead_rank`` (and a signed respawn) for every live run there, and the future
time carried into each new incarnation. The input topics are created with
``message.timestamp.type=LogAppendTime``: the broker's stamp bounds every event's time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaProducer

from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.replay import Replayer, ReplayResult
from runwatch.processors.logread import read_history
from runwatch.schemas.events import DeadLetter
from runwatch.schemas.records import FUTURE_TS, MAX_FUTURE_SKEW_NS, split
from runwatch.schemas.topics import ROLES, TopicNames, TopicRole, names

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000
CFG = with_overrides(
    DetectorConfig(),
    {"hang_timeout_s": 60, "dead_rank_timeout_s": 30, "startup_timeout_s": 120},
)
INPUTS = (TopicRole.RUNS, TopicRole.STEPS, TopicRole.HEARTBEATS, TopicRole.CHECKPOINTS)


def _raw(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


@pytest.fixture
def attacker(kafka_bootstrap: str) -> Iterator[KafkaProducer]:
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    yield producer
    producer.close()


def _send(producer: KafkaProducer, topic: str, key: str, value: bytes, stamp_ms: int) -> None:
    producer.send(topic, key=key.encode(), value=value, timestamp_ms=stamp_ms).get(30)


def _fold_log(bootstrap: str, topics: TopicNames) -> tuple[ReplayResult, list[DeadLetter], Any]:
    history = read_history(bootstrap, [topics.of(role) for role in INPUTS])
    replayer = Replayer(CFG)
    dead: list[DeadLetter] = []
    for role in INPUTS:
        good, bad = split(history[topics.of(role)], role)
        dead += bad
        replayer.feed((role, source, event) for source, event in good)  # type: ignore[misc]
    return replayer.result(), dead, history


def _live_run(producer: KafkaProducer, topics: TopicNames, run: str, now_ms: int) -> None:
    """A healthy gang of 2 ranks at incarnation 0, reporting now."""
    now_ns = now_ms * 1_000_000
    started = _raw(type="run_started.v1", run_id=run, ts_ns=now_ns, world_size=2)
    _send(producer, topics.runs, run, started, now_ms)
    _send(producer, topics.heartbeats, run, started, now_ms)
    for step in (1, 2, 3):
        for rank in (0, 1):
            beat = _raw(type="heartbeat.v1", run_id=run, ts_ns=now_ns, rank=rank, step=step)
            _send(producer, topics.heartbeats, run, beat, now_ms)


def test_a_tick_a_day_ahead_raises_nothing_for_live_runs(
    kafka_bootstrap: str, topic_prefix: str, make_topics: Any, attacker: KafkaProducer
) -> None:
    make_topics(topic_prefix, partitions=1)
    topics = names(topic_prefix)
    now_ms = int(time.time() * 1000)
    for run in ("victim-a", "victim-b"):
        _live_run(attacker, topics, run, now_ms)
    ahead_ms = now_ms + DAY_MS
    forged = _raw(type="tick.v1", run_id="*", ts_ns=ahead_ms * 1_000_000, partition=0)
    _send(attacker, topics.heartbeats, "*", forged, ahead_ms)
    attacker.flush(30)
    read_at_ns = time.time_ns()

    result, dead, history = _fold_log(kafka_bootstrap, topics)

    # the broker stamped every record with its own clock, not the attacker's
    stamps = [r.timestamp_ms for role in INPUTS for r in history[topics.of(role)]]
    assert stamps and max(stamps) * 1_000_000 <= read_at_ns
    assert dead == []  # the tick was clamped, not refused
    assert [(a.run_id, a.kind) for a in result.anomalies] == []
    assert result.commands == []
    for run in ("victim-a", "victim-b"):
        assert result.liveness[run].log_time_ns <= read_at_ns  # the tick said only "now"
        assert not result.liveness[run].hung


def test_a_future_dated_incarnation_never_carries_into_the_next(
    kafka_bootstrap: str, topic_prefix: str, make_topics: Any, attacker: KafkaProducer
) -> None:
    make_topics(topic_prefix, partitions=1)
    topics = names(topic_prefix)
    run = "victim"
    now_ms = int(time.time() * 1000)
    _live_run(attacker, topics, run, now_ms)
    ahead_ms = now_ms + DAY_MS
    ahead_ns = ahead_ms * 1_000_000
    forged = _raw(type="run_started.v1", run_id=run, ts_ns=ahead_ns, world_size=2, incarnation=1)
    _send(attacker, topics.runs, run, forged, ahead_ms)
    _send(attacker, topics.heartbeats, run, forged, ahead_ms)
    forged_beat = _raw(type="heartbeat.v1", run_id=run, ts_ns=ahead_ns, rank=0, step=4)
    _send(attacker, topics.heartbeats, run, forged_beat, ahead_ms)
    # the real next incarnation, and the processors' clock ticking after it
    now_ns = now_ms * 1_000_000
    real = _raw(type="run_started.v1", run_id=run, ts_ns=now_ns, world_size=2, incarnation=1)
    _send(attacker, topics.heartbeats, run, real, now_ms)
    tick = _raw(type="tick.v1", run_id="*", ts_ns=now_ns + 1_000_000, partition=0)
    _send(attacker, topics.heartbeats, "*", tick, now_ms)
    attacker.flush(30)
    read_at_ns = time.time_ns()

    result, dead, _ = _fold_log(kafka_bootstrap, topics)

    future = [d for d in dead if d.reason.startswith(FUTURE_TS)]
    assert len(future) == 3  # the forged RunStarted on both topics and the forged heartbeat
    assert all(d.payload in (forged, forged_beat) for d in future)
    state = result.liveness[run]
    assert state.incarnation == 1
    assert state.log_time_ns <= read_at_ns + MAX_FUTURE_SKEW_NS
    assert [(a.kind, a.incarnation) for a in result.anomalies] == []
    assert result.commands == []


def test_every_input_topic_is_stamped_by_the_broker() -> None:
    assert {role for role, spec in ROLES.items() if spec.broker_time} == set(INPUTS)


def test_a_forged_huge_hang_timeout_does_not_disable_hang_detection(
    kafka_bootstrap: str, topic_prefix: str, make_topics: Any, attacker: KafkaProducer
) -> None:
    # Issue 19, finding 1: `RunStarted.thresholds` of `hang_timeout_s: 1e12` switched hang
    # detection off for the run. A run's thresholds are clamped into their ranges.
    make_topics(topic_prefix, partitions=1)
    topics = names(topic_prefix)
    run = "victim"
    now_ms = int(time.time() * 1000)
    then_ns = (now_ms - 2 * DAY_MS) * 1_000_000  # two days ago: the past is not bounded
    started = _raw(
        type="run_started.v1",
        run_id=run,
        ts_ns=then_ns,
        world_size=1,
        thresholds={"hang_timeout_s": 1e12, "dead_rank_timeout_s": 1e12},
    )
    _send(attacker, topics.heartbeats, run, started, now_ms)
    beat = _raw(type="heartbeat.v1", run_id=run, ts_ns=then_ns, rank=0, step=1)
    _send(attacker, topics.heartbeats, run, beat, now_ms)
    tick = _raw(type="tick.v1", run_id="*", ts_ns=now_ms * 1_000_000, partition=0)
    _send(attacker, topics.heartbeats, "*", tick, now_ms)
    attacker.flush(30)

    result, dead, _ = _fold_log(kafka_bootstrap, topics)

    assert dead == []
    hangs = [a for a in result.anomalies if a.kind == "hang"]
    assert [(a.run_id, a.threshold) for a in hangs] == [(run, 86_400.0)]


def test_a_live_worker_ignores_a_tick_a_day_ahead(
    kafka_bootstrap: str,
    topic_prefix: str,
    make_topics: Any,
    attacker: KafkaProducer,
    tmp_path: Any,
) -> None:
    # The same attack against the processors themselves: a live gang reporting, a forged
    # tick a day ahead in its partition, the gang reporting on. No hang, no dead rank, no
    # command (before: both verdicts and a signed respawn).
    from runwatch.processors.fleet import wait_until_processed
    from tests.integration.processors.harness import Trainer, workers

    make_topics(topic_prefix, partitions=1)
    topics = names(topic_prefix)
    app_id = f"{topic_prefix}-app"
    sets = ("rank_heartbeat_threshold=10", "hang_timeout_s=600", "dead_rank_timeout_s=600")
    trainer = Trainer(kafka_bootstrap, topic_prefix, "victim", world_size=2)
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=1, sets=sets) as start:
        start()
        trainer.start(0)
        for step in range(1, 11):
            trainer.step(step)
        ahead_ms = int(time.time() * 1000) + DAY_MS
        forged = _raw(type="tick.v1", run_id="*", ts_ns=ahead_ms * 1_000_000, partition=0)
        _send(attacker, topics.heartbeats, "*", forged, ahead_ms)
        for step in range(11, 21):
            trainer.step(step)
        trainer.close()
        wait_until_processed(kafka_bootstrap, app_id, [topics.heartbeats], timeout_s=180)
        wait_until_processed(kafka_bootstrap, app_id, [topics.anomalies], timeout_s=180)
        out = read_history(kafka_bootstrap, [topics.anomalies, topics.commands])
    verdicts = split(out[topics.anomalies], TopicRole.ANOMALIES)[0]
    assert [(e.run_id, e.kind) for _, e in verdicts] == []  # type: ignore[union-attr]
    assert out[topics.commands] == []


def test_topics_create_gives_an_existing_input_topic_the_broker_s_clock(
    kafka_bootstrap: str, topic_prefix: str, attacker: KafkaProducer
) -> None:
    # A deployment whose topics predate the bound: `runwatch topics create` (and every
    # component's start) sets LogAppendTime on them, so a writer's timestamp stops counting.
    from runwatch import admin
    from runwatch.schemas.topics import TopicSpec, catalogue

    topics = names(topic_prefix)
    old = TopicSpec(
        name=topics.heartbeats, partitions=1, compacted=False, retention_ms=None, carries="old"
    )
    assert "message.timestamp.type" not in old.configs()
    admin.create_topics(kafka_bootstrap, [old])
    # (Kafka 4 refuses a CreateTime more than message.timestamp.after.max.ms, an hour, ahead)
    ahead_ms = int(time.time() * 1000) + 30 * 60 * 1000
    _send(attacker, topics.heartbeats, "r", b"before", ahead_ms)
    created = admin.create_topics(kafka_bootstrap, catalogue(topic_prefix, 1))
    assert created[topics.heartbeats] is False  # it existed: altered, not created
    # A topic's new config reaches the partition leader through the metadata log a moment
    # later: poll (a record at a time) until the broker stamps one itself.
    deadline = time.monotonic() + 30
    stamped: list[int] = []
    while True:
        value = f"after-{len(stamped)}".encode()
        _send(attacker, topics.heartbeats, "r", value, ahead_ms)
        sent_ms = int(time.time() * 1000)
        history = read_history(kafka_bootstrap, [topics.heartbeats])[topics.heartbeats]
        stamps = {r.value: r.timestamp_ms for r in history}
        stamped.append(stamps[value])
        if stamps[value] <= sent_ms:  # LogAppendTime: the broker's clock
            break
        assert time.monotonic() < deadline, stamped
    assert stamps[b"before"] == ahead_ms  # CreateTime: the writer's word
