"""Hostile records on a live partition: dead letters, counted; the records around them judged.

Before the fix one such record (a step of 2**70, a 100,000-deep array) crashed the agent,
the rest of its batch was never dead-lettered, and a spike sent afterwards to the same
partition was never judged; the audit of the run ended in a RecursionError.
"""

from __future__ import annotations

import json
import time

import pytest
from kafka import KafkaProducer

from runwatch.cmd.audit import render
from runwatch.processors.audit import audit, load_run_log
from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.fleet import wait_until_processed
from runwatch.schemas.codec import encode
from runwatch.schemas.events import DeadLetter, Heartbeat, RunStarted
from runwatch.schemas.topics import names

from .harness import Reader, Trainer, short, workers
from .test_resilience import _wait_states

pytestmark = pytest.mark.integration

SETS = ("rank_heartbeat_threshold=10", "hang_timeout_s=600", "dead_rank_timeout_s=600")
CFG = with_overrides(DetectorConfig(), dict(s.split("=") for s in SETS))
RUN = "hostile-run"
OTHER = "hostile-thresholds"
STEPS, SPIKE_AT = 60, 50


def _step(**fields: object) -> bytes:
    base: dict[str, object] = {"type": "step.v1", "run_id": RUN, "ts_ns": 1, "step": 1}
    base.update({"loss": 1.0, "step_time_s": 0.1, **fields})
    return json.dumps(base).encode()


DEEP = b"[" * 100_000 + b"]" * 100_000


def _hostile(topics) -> list[tuple[str, bytes]]:
    return [
        (topics.steps, _step(step=2**70)),
        (topics.steps, _step(step=2**63)),
        (topics.steps, _step(step=-7)),
        (topics.steps, _step(tokens=2**64)),
        (topics.steps, DEEP),
        (topics.steps, b'{"type":"step.v1","run_id":"hostile-run","junk":' + DEEP + b"}"),
        (topics.steps, _step(run_id="h" * 20_000)),
        (topics.steps, _step().replace(b'"step": 1', b'"step": NaN')),
        (topics.steps, _step(step="NaN")),
        (topics.steps, b'{"type":"step.v1","run_id":"hostile-run","ts_ns":1}'),
        (topics.steps, "\u202e\x00\U0001f4a5 junk".encode() + b"\xff\xfe"),
        (topics.steps, encode(Heartbeat(run_id=RUN, ts_ns=1, rank=0, step=1))),
        (topics.steps, _step(run_id="someone-else")),
        (
            topics.heartbeats,
            b'{"type":"heartbeat.v1","run_id":"hostile-run","ts_ns":1,"rank":-1,"step":3}',
        ),
        (topics.heartbeats, DEEP),
        (
            topics.heartbeats,
            json.dumps(
                {"type": "run_started.v1", "run_id": RUN, "ts_ns": 1, "world_size": 2**40}
            ).encode(),
        ),
    ]


def _shifted() -> list[bytes]:
    """Records none of which is an event, that read as three if joined as lines.

    The first leaves a field open, the second closes it with one brace too many, the third
    holds two events: a worker that once decoded a chunk's records as lines of one buffer
    took them for three heartbeats of the run, each on its neighbour's offset.
    """
    beat = encode(Heartbeat(run_id=RUN, ts_ns=1, rank=0, step=1))
    return [beat[:-1] + b',"x":', beat + b"}", beat + b" " + beat]


def test_hostile_records_are_dead_lettered_and_the_partition_goes_on(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path
):
    make_topics(topic_prefix, partitions=2)
    topics = names(topic_prefix)
    hostile = _hostile(topics)
    shifted = _shifted()
    raw = KafkaProducer(bootstrap_servers=kafka_bootstrap, max_request_size=2 * 1024 * 1024)
    lingering = KafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=500)  # one batch
    trainer = Trainer(kafka_bootstrap, topic_prefix, RUN, world_size=2)
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=2, sets=SETS) as start:
        worker = start()
        trainer.start(0)
        for s in range(1, STEPS + 1):
            trainer.step(s, loss=9.0 if s == SPIKE_AT else None)
            if s <= len(hostile):  # interleaved with the healthy run, same key, same partition
                topic, value = hostile[s - 1]
                raw.send(topic, key=RUN.encode(), value=value).get(30)
        trainer.close()
        # A run threshold that once overflowed an int64 of the liveness state on the next
        # heartbeat (an "encode" dead letter): now clamped into its range
        # (`RUN_THRESHOLD_BOUNDS`), so the run's records are judged and none is refused.
        # (Now-dated: a run silent since 1970 would be evicted at the next Tick, retention.)
        now_ns = time.time_ns()
        started = RunStarted(
            run_id=OTHER,
            ts_ns=now_ns,
            world_size=1,
            thresholds={"rank_heartbeat_threshold": 1e300},
        )
        raw.send(topics.heartbeats, key=OTHER.encode(), value=encode(started))
        raw.send(
            topics.heartbeats,
            key=OTHER.encode(),
            value=encode(Heartbeat(run_id=OTHER, ts_ns=now_ns + 1, rank=0, step=1)),
        )
        raw.flush(30)

        anomalies = Reader(kafka_bootstrap, topics.anomalies)
        got = anomalies.wait_for(lambda ev: any(e.kind == "loss_spike" for e in ev))
        anomalies.close()
        _wait_states(
            kafka_bootstrap,
            f"{topic_prefix}-app",
            lambda v: (
                RUN in v
                and v[RUN].steps is not None
                and v[RUN].steps.steps_observed == STEPS
                and v[RUN].liveness is not None
                and v[RUN].liveness.heartbeats == 2 * STEPS
                and OTHER in v
                and v[OTHER].liveness is not None
                and v[OTHER].liveness.heartbeats == 1
            ),
        )
        # Once the worker has folded everything before them, in one batch of their own:
        # side by side in the partition (nothing else writes to it now), in one round.
        for value in shifted:
            lingering.send(topics.heartbeats, key=RUN.encode(), value=value)
        lingering.flush(30)
        dead_reader = Reader(kafka_bootstrap, topics.deadletter)
        dead = dead_reader.wait_for(lambda ev: len(ev) >= len(hostile) + len(shifted))
        dead_reader.close()
        # The audit reads the log as it is now: first let the policy judge every anomaly the
        # detectors published, or a command still on its way reads as "missing".
        app_id = f"{topic_prefix}-app"
        wait_until_processed(kafka_bootstrap, app_id, [topics.steps, topics.heartbeats])
        wait_until_processed(kafka_bootstrap, app_id, [topics.anomalies])
        log_text = worker.log_path.read_text(errors="replace")
    raw.close()
    lingering.close()

    assert "Crashed" not in log_text, log_text[-3000:]
    assert [short(a) for a in got] == [("loss_spike", SPIKE_AT, 0)]  # judged after them
    assert all(isinstance(d, DeadLetter) for d in dead)
    mine = [d for d in dead if d.key == RUN.encode()]
    assert len(mine) == len(hostile) + len(shifted)  # every one, exactly once
    assert {d.stage for d in mine} == {"decode"}
    assert sorted(d.payload for d in mine) == sorted([v for _, v in hostile] + shifted)
    assert [d for d in dead if d.key == OTHER.encode()] == []

    receipt = audit(load_run_log(kafka_bootstrap, topic_prefix, RUN), CFG)
    assert receipt.agrees, render(receipt)
    assert receipt.dead_letters == len(hostile) + len(shifted)
    other_receipt = audit(load_run_log(kafka_bootstrap, topic_prefix, OTHER), CFG)
    assert other_receipt.agrees and other_receipt.dead_letters == 0, render(other_receipt)
