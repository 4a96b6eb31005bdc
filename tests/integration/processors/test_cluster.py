"""A replicated 3-node cluster: a broker SIGKILLed mid-stream loses nothing and stops nothing.

The cluster is three real KRaft JVMs on loopback (`runwatch.broker.ephemeral_cluster`), the
worker a real `runwatch processors` process. The broker killed is the leader of the busiest
partition (the one carrying run-a's steps); the runs keep streaming through the leader
change, a loss spike injected after the kill must still be detected, every run's states
count every step and heartbeat exactly once, every audit agrees, and the restarted broker
is back in the ISR of every partition it replicates.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runwatch import admin
from runwatch.broker import EmbeddedCluster, ephemeral_cluster
from runwatch.cmd.audit import render
from runwatch.processors.app import CHANGELOG_COMPACTION, partition_for
from runwatch.processors.audit import audit, load_run_log
from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.fleet import RunView, latest_states
from runwatch.processors.settings import changelog_topic
from runwatch.schemas.topics import FOLD_ORDER, folding, names

from .harness import Reader, Trainer, short, wait_until, workers

pytestmark = pytest.mark.integration

SETS = ("rank_heartbeat_threshold=10", "hang_timeout_s=600", "dead_rank_timeout_s=600")
CFG = with_overrides(DetectorConfig(), dict(s.split("=") for s in SETS))
RUNS = ("run-a", "run-b", "run-c")
PARTITIONS = 2
STEPS = 90
KILL_FEED_TO = 45  # the feeder streams 21..45 while the broker is killed
SPIKE_AT = 60  # fed after the kill: verdicts must continue on the new leaders


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    with ephemeral_cluster(tmp_path_factory.mktemp("cluster"), nodes=3) as running:
        yield running


def _feed(first: int, last: int, trainers: dict[str, Trainer]) -> None:
    for s in range(first, last + 1):
        for t in trainers.values():
            t.step(s, loss=9.0 if s == SPIKE_AT else None)


def _applied(views: dict[str, RunView], last: int) -> bool:
    return all(
        r in views
        and views[r].steps is not None
        and views[r].steps.steps_observed == last
        and views[r].liveness is not None
        and views[r].liveness.heartbeats == 2 * last
        for r in RUNS
    )


def _partitions(bootstrap: str, topics: list[str]) -> dict[tuple[str, int], dict[str, Any]]:
    with admin.admin_client(bootstrap) as client:
        described = client.describe_topics(topics)
    return {
        (t.get("name") or t.get("topic"), p["partition_index"]): p
        for t in described
        for p in t.get("partitions") or []
    }


def _topic_config(bootstrap: str, topic: str, key: str) -> str | None:
    from kafka.admin import ConfigResource, ConfigResourceType

    with admin.admin_client(bootstrap) as client:
        described = client.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    found = described["topic"][topic]
    value = found.get(key)
    return value if value is None or isinstance(value, str) else str(value.get("value", value))


def test_broker_sigkill_mid_stream_loses_nothing_and_catches_up(
    cluster: EmbeddedCluster, tmp_path: Path
) -> None:
    bootstrap = cluster.bootstrap
    prefix = f"c{uuid.uuid4().hex[:10]}"
    topics = names(prefix)
    app_id = f"{prefix}-app"
    rule = admin.cluster_replication(bootstrap)
    assert (rule.factor, rule.min_insync) == (3, 2)
    admin.create_catalogue(bootstrap, prefix=prefix, partitions=PARTITIONS)
    changelogs = [changelog_topic(app_id, folding(role).table) for role in FOLD_ORDER]
    trainers = {run: Trainer(bootstrap, prefix, run, seed=i) for i, run in enumerate(RUNS)}
    try:
        with workers(bootstrap, prefix, tmp_path, partitions=PARTITIONS, sets=SETS) as start:
            for t in trainers.values():
                t.start(0)
            start()
            _feed(1, 20, trainers)
            wait_until(
                "the worker to apply steps",
                lambda: latest_states(bootstrap, app_id),
                lambda v: any(x.steps and x.steps.steps_observed >= 10 for x in v.values()),
            )
            # the catalogue and the worker's changelogs: 3 replicas, min ISR 2
            every = [topics.steps, topics.heartbeats, topics.anomalies, *changelogs]
            before = _partitions(bootstrap, every)
            assert {len(p["replica_nodes"]) for p in before.values()} == {3}, before
            for topic in (topics.steps, changelogs[0]):
                assert _topic_config(bootstrap, topic, "min.insync.replicas") == "2", topic
            # changelog segments roll, so compaction bounds a successor's replay
            for name, value in CHANGELOG_COMPACTION.items():
                assert _topic_config(bootstrap, changelogs[0], name) == value, name

            busy = (topics.steps, partition_for("run-a", PARTITIONS))
            victim = int(before[busy]["leader_id"])
            feeder = threading.Thread(target=_feed, args=(21, KILL_FEED_TO, trainers))
            feeder.start()
            wait_until(
                "the stream to be under way",
                lambda: latest_states(bootstrap, app_id),
                lambda v: any(x.steps and x.steps.steps_observed >= 25 for x in v.values()),
            )
            assert cluster.kill(victim)
            feeder.join()
            _feed(KILL_FEED_TO + 1, STEPS, trainers)  # the spike comes after the kill

            views = wait_until(
                "every step and heartbeat applied once",
                lambda: latest_states(bootstrap, app_id),
                lambda v: _applied(v, STEPS),
            )
            moved = _partitions(bootstrap, [topics.steps])[busy]
            assert moved["leader_id"] != victim and victim not in moved["isr_nodes"]

            cluster.start(victim)
            wait_until(
                f"node {victim} back in the ISR of all its partitions",
                lambda: _partitions(bootstrap, every),
                lambda parts: all(
                    victim in p["isr_nodes"] for p in parts.values() if victim in p["replica_nodes"]
                ),
            )
            _check_verdicts_and_audits(bootstrap, prefix, views)
    finally:
        for t in trainers.values():
            t.close()


def _check_verdicts_and_audits(bootstrap: str, prefix: str, views: dict[str, RunView]) -> None:
    reader = Reader(bootstrap, names(prefix).anomalies)
    events = reader.wait_for(lambda ev: len({e.verdict_id for e in ev}) >= len(RUNS))
    reader.close()
    distinct: dict[str, Any] = {}
    for e in events:
        distinct.setdefault(e.verdict_id, e)
    by_run: dict[str, list[Any]] = {}
    for e in distinct.values():
        by_run.setdefault(e.run_id, []).append(short(e))
    for run in RUNS:
        assert views[run].steps is not None and views[run].steps.steps_observed == STEPS
        assert views[run].liveness is not None and views[run].liveness.heartbeats == 2 * STEPS
        assert by_run.get(run) == [("loss_spike", SPIKE_AT, 0)], (run, by_run)
        log = load_run_log(bootstrap, prefix, run)
        receipt = audit(log, CFG)
        assert receipt.agrees, (run, render(receipt))


def test_cli_covers_every_node_and_restarts_one(
    cluster: EmbeddedCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    from runwatch.cli import main

    data = ["--data-dir", str(cluster.data_dir)]
    assert main(["broker", "status", *data]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == cluster.bootstrap and err.count("runs on") == 3
    assert main(["broker", "stop", *data, "--node", "3"]) == 0
    assert main(["broker", "status", *data]) == 1
    assert "node 3: not running" in capsys.readouterr().err
    assert main(["broker", "start", *data]) == 0  # starts what does not run: node 3
    assert main(["broker", "status", *data, "--node", "3"]) == 0
    assert main(["broker", "start", *data, "--nodes", "5"]) == 1  # not the recorded size
    assert "holds a cluster of 3 nodes" in capsys.readouterr().err
