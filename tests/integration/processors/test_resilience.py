"""Crash, scale-out and bad input: nothing lost, nothing applied twice, audit agrees."""

from __future__ import annotations

import threading
import time

import pytest
from kafka import KafkaProducer

from runwatch.cmd.audit import render
from runwatch.processors.audit import audit, load_run_log
from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.fleet import latest_states
from runwatch.schemas.codec import encode
from runwatch.schemas.events import DeadLetter, Heartbeat
from runwatch.schemas.topics import names

from .harness import WAIT_S, Reader, Trainer, short, workers

pytestmark = pytest.mark.integration

SETS = ("rank_heartbeat_threshold=10", "hang_timeout_s=600", "dead_rank_timeout_s=600")
CFG = with_overrides(DetectorConfig(), dict(s.split("=") for s in SETS))
RUNS = ("run-a", "run-b", "run-c", "run-d")
STEPS = 120
SPIKE_AT = 100
DEAD_RUN, DEAD_AFTER = "run-c", 60


def _feed(bootstrap: str, prefix: str, first: int, last: int, trainers: dict[str, Trainer]) -> None:
    for s in range(first, last + 1):
        for run, t in trainers.items():
            silent = (1,) if run == DEAD_RUN and s > DEAD_AFTER else ()
            t.step(s, loss=9.0 if s == SPIKE_AT else None, silent=silent)


def _expected_heartbeats(run: str, last: int) -> int:
    return 2 * last - (max(0, last - DEAD_AFTER) if run == DEAD_RUN else 0)


def _wait_states(bootstrap: str, app_id: str, done, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while True:
        views = latest_states(bootstrap, app_id)
        if done(views):
            return views
        if time.monotonic() > deadline:
            raise AssertionError(
                {k: (v.steps and v.steps.steps_observed) for k, v in views.items()}
            )
        time.sleep(0.2)  # polling a changelog, not synchronising on time


def _all_applied_exactly(last: int):
    def done(views) -> bool:
        return all(
            r in views
            and views[r].steps is not None
            and views[r].steps.steps_observed == last
            and views[r].liveness is not None
            and views[r].liveness.heartbeats == _expected_heartbeats(r, last)
            for r in RUNS
        )

    return done


def _anomalies_by_run(bootstrap: str, prefix: str) -> dict[str, list]:
    """Distinct recorded verdicts per run, once all the expected ones are there."""
    reader = Reader(bootstrap, names(prefix).anomalies)
    want = len(RUNS) + 1
    events = reader.wait_for(lambda ev: len({e.verdict_id for e in ev}) >= want)
    reader.close()
    seen: dict[str, object] = {}
    for e in events:
        seen.setdefault(e.verdict_id, e)
    out: dict[str, list] = {}
    for e in seen.values():
        out.setdefault(e.run_id, []).append(short(e))
    return out


def _check_exact_and_audited(bootstrap: str, prefix: str, last: int) -> None:
    # the policy acts on the anomalies after they are published: wait for its command
    # (the dead rank's respawn) before auditing, or the audit would race the worker
    commands = Reader(bootstrap, names(prefix).commands)
    commands.wait_for(lambda ev: any(c.run_id == DEAD_RUN for c in ev))
    commands.close()
    views = latest_states(bootstrap, f"{prefix}-app")
    recorded = _anomalies_by_run(bootstrap, prefix)
    for run in RUNS:
        # exactly once on state: a redelivered event applied twice would count twice
        assert views[run].steps.steps_observed == last
        assert views[run].liveness.heartbeats == _expected_heartbeats(run, last)
        expected = [("loss_spike", SPIKE_AT, 0)]
        if run == DEAD_RUN:
            expected.append(("dead_rank", DEAD_AFTER + 11, 1, 0))
        assert sorted(recorded[run]) == sorted(expected), run
        log = load_run_log(bootstrap, prefix, run)
        receipt = audit(log, CFG)
        assert receipt.agrees, (
            run,
            render(receipt),
            [short(e) for _, _, e in log.recorded_anomalies],
            [short(c) for c in log.recorded_commands],
        )


@pytest.fixture
def trainers(kafka_bootstrap, topic_prefix, make_topics):
    make_topics(topic_prefix, partitions=2)
    ts = {}
    for i, run in enumerate(RUNS):
        ts[run] = Trainer(kafka_bootstrap, topic_prefix, run, seed=i)
        ts[run].start(0)
    yield ts
    for t in ts.values():
        t.close()


def test_sigkill_mid_stream_loses_nothing_and_applies_nothing_twice(
    kafka_bootstrap, topic_prefix, tmp_path, trainers
):
    app_id = f"{topic_prefix}-app"
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=2, sets=SETS) as start:
        first = start()
        _feed(kafka_bootstrap, topic_prefix, 1, 40, trainers)
        feeder = threading.Thread(
            target=_feed, args=(kafka_bootstrap, topic_prefix, 41, STEPS, trainers)
        )
        feeder.start()
        # kill while the worker is in the middle of the stream
        _wait_states(
            kafka_bootstrap,
            app_id,
            lambda v: any(x.steps and x.steps.steps_observed >= 30 for x in v.values()),
        )
        first.kill()
        feeder.join()
        start()
        _wait_states(kafka_bootstrap, app_id, _all_applied_exactly(STEPS))
        _check_exact_and_audited(kafka_bootstrap, topic_prefix, STEPS)


def test_a_second_worker_joins_and_takes_over(kafka_bootstrap, topic_prefix, tmp_path, trainers):
    app_id = f"{topic_prefix}-app"
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=2, sets=SETS) as start:
        first = start()
        _feed(kafka_bootstrap, topic_prefix, 1, 40, trainers)
        feeder = threading.Thread(
            target=_feed, args=(kafka_bootstrap, topic_prefix, 41, 100, trainers)
        )
        feeder.start()
        _wait_states(
            kafka_bootstrap,
            app_id,
            lambda v: any(x.steps and x.steps.steps_observed >= 30 for x in v.values()),
        )
        start()  # joins mid-stream: a rebalance splits the partitions
        feeder.join()
        _wait_states(kafka_bootstrap, app_id, _all_applied_exactly(100))
        first.stop()  # and the newcomer must now own every partition
        _feed(kafka_bootstrap, topic_prefix, 101, STEPS, trainers)
        _wait_states(kafka_bootstrap, app_id, _all_applied_exactly(STEPS))
        _check_exact_and_audited(kafka_bootstrap, topic_prefix, STEPS)


def test_bad_input_goes_to_the_dead_letter_topic(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path
):
    make_topics(topic_prefix, partitions=2)
    topics = names(topic_prefix)
    run = "run-bad"
    trainer = Trainer(kafka_bootstrap, topic_prefix, run)
    raw = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    bad = [
        (topics.steps, b"\x00\xffnot json", "not JSON"),
        (topics.steps, b'{"type":"step.v7","run_id":"run-bad","ts_ns":1}', "unknown event type"),
        (
            topics.steps,
            b'{"type":"step.v1","run_id":"run-bad","ts_ns":1,"step":"x","loss":1,"step_time_s":1}',
            "$.step",
        ),
        (topics.steps, encode(Heartbeat(run_id=run, ts_ns=1, rank=0, step=1)), "does not belong"),
        (topics.heartbeats, b"[]", "JSON object"),
    ]
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=2, sets=SETS) as start:
        start()
        trainer.start(0)
        for s in range(1, 61):
            trainer.step(s, loss=9.0 if s == 40 else None)
            if s == 20:
                for topic, value, _ in bad:
                    raw.send(topic, key=run.encode(), value=value)
                raw.flush()
        trainer.close()
        dead = Reader(kafka_bootstrap, topics.deadletter).wait_for(lambda ev: len(ev) >= len(bad))
        anomalies = Reader(kafka_bootstrap, topics.anomalies).wait_for(lambda ev: len(ev) >= 1)
    raw.close()
    assert all(isinstance(d, DeadLetter) for d in dead)
    by_payload = {d.payload: d for d in dead}
    for topic, value, reason in bad:
        letter = by_payload[value]
        assert reason in letter.reason
        assert letter.source.topic == topic and letter.source.offset >= 0
        assert letter.key == run.encode()
    assert [short(a) for a in anomalies] == [("loss_spike", 40, 0)]
    receipt = audit(load_run_log(kafka_bootstrap, topic_prefix, run), CFG)
    assert receipt.agrees and receipt.dead_letters == len(bad)
