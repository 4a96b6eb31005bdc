"""A worker on topics of different partition counts: each input read as the cluster has it."""

from __future__ import annotations

import time

import pytest

from runwatch import admin
from runwatch.processors.app import partition_for
from runwatch.processors.fleet import latest_states
from runwatch.processors.settings import changelog_topic
from runwatch.schemas.events import Tick
from runwatch.schemas.topics import FOLD_ORDER, TopicRole, TopicSpec, folding, names

from .harness import WAIT_S, Reader, Trainer, workers

pytestmark = pytest.mark.integration

SETS = ("rank_heartbeat_threshold=10", "hang_timeout_s=600", "dead_rank_timeout_s=600")
# no two input topics alike, and none the worker's --partitions (2) or the catalogue's
COUNTS = {"steps": 3, "heartbeats": 5, "checkpoints": 1, "anomalies": 4, "runs": 1}
RUNS = ("run-a", "run-d", "run-g", "run-h", "run-j", "run-l")
STEPS = 25
WORLD = 2


def test_worker_uses_each_input_topics_own_partition_count(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path
):
    make_topics(topic_prefix, partitions=COUNTS)
    topics = names(topic_prefix)
    # runs spread over several partitions of each topic: every partition count matters
    assert {partition_for(r, COUNTS["heartbeats"]) for r in RUNS} == set(range(5))
    assert {partition_for(r, COUNTS["steps"]) for r in RUNS} == set(range(3))
    app_id = f"{topic_prefix}-app"
    trainers = {r: Trainer(kafka_bootstrap, topic_prefix, r, world_size=WORLD) for r in RUNS}
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=2, sets=SETS) as start:
        start()
        for t in trainers.values():
            t.start(0)
        for s in range(1, STEPS + 1):
            for t in trainers.values():
                t.step(s)
        for t in trainers.values():
            t.checkpoint(STEPS)
            t.flush()
        # every run's states land, exactly once per event
        deadline = time.monotonic() + WAIT_S
        while True:
            views = latest_states(kafka_bootstrap, app_id)
            done = all(
                r in views
                and views[r].steps is not None
                and views[r].steps.steps_observed == STEPS
                and views[r].liveness is not None
                and views[r].liveness.heartbeats == WORLD * STEPS
                for r in RUNS
            )
            if done:
                break
            assert time.monotonic() < deadline, {
                r: (v.steps and v.steps.steps_observed, v.liveness and v.liveness.heartbeats)
                for r, v in views.items()
            }
            time.sleep(0.2)  # polling a changelog, not synchronising on time
        # a Tick in every heartbeat partition, each saying which one it is in
        reader = Reader(kafka_bootstrap, topics.heartbeats)
        want = set(range(COUNTS["heartbeats"]))

        def ticked(events) -> bool:
            return {e.partition for e in events if isinstance(e, Tick)} >= want

        reader.wait_for(ticked)
        ticks = [(r.partition, e) for r, e in zip(reader.raw, reader.events, strict=True)]
        reader.close()
        assert all(p == e.partition for p, e in ticks if isinstance(e, Tick))
        assert {e.partition for _, e in ticks if isinstance(e, Tick)} == want
        for t in trainers.values():
            t.close()
    # each table's changelog is co-partitioned with its input topic
    have = admin.list_topics(kafka_bootstrap)
    for role in FOLD_ORDER:
        table = folding(role).table
        assert have[changelog_topic(app_id, table)] == have[topics.of(role)], role
    assert have[topics.heartbeats] == COUNTS["heartbeats"]
    assert have[topics.steps] == COUNTS["steps"]
    assert have[topics.commands] == 4  # not named: the catalogue's default


def test_worker_refuses_a_changelog_partitioned_unlike_its_input(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path
):
    make_topics(topic_prefix, partitions={"heartbeats": 3, "steps": 2})
    app_id = f"{topic_prefix}-app"
    admin.create_topics(
        kafka_bootstrap,
        [
            TopicSpec(
                name=changelog_topic(app_id, folding(TopicRole.HEARTBEATS).table),
                partitions=2,
                compacted=True,
                retention_ms=None,
                carries="a changelog left by a worker before heartbeats were repartitioned",
            )
        ],
    )
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=2) as start:
        worker = start()
        assert worker.wait(120) == 2, worker.log_tail()
        tail = worker.log_tail()
        assert "liveness-changelog has 2 partitions but its input" in tail
        assert "Traceback" not in tail
