"""The RocksDB store: a SIGKILLed worker's successor resumes from the local databases.

Same scenario and checks as `test_resilience`'s SIGKILL test (exact step and heartbeat
counts, every audit agrees, each verdict once), with the tables in RocksDB: the successor
reopens the first worker's data dir, so its states come from the local databases plus
the changelog past their offsets, not from a full replay.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from runwatch.processors.settings import changelog_topic

from .harness import workers
from .test_resilience import (
    SETS,
    STEPS,
    _all_applied_exactly,
    _check_exact_and_audited,
    _feed,
    _wait_states,
    trainers,  # noqa: F401 (the fixture)
)

pytest.importorskip("rocksdict", reason="the rocksdb store needs runwatch[rocksdb]")

pytestmark = pytest.mark.integration

TABLES = ("step-health", "liveness", "policy", "checkpoints")


def _databases(data_dir: Path) -> set[str]:
    """The table databases faust opened under a worker's data dir (``<table>-<p>.db``)."""
    return {p.name for p in data_dir.glob("v*/tables/*.db") if p.is_dir()}


def test_sigkilled_rocksdb_worker_successor_resumes_exactly(
    kafka_bootstrap,
    topic_prefix,
    tmp_path,
    trainers,  # noqa: F811
):
    app_id = f"{topic_prefix}-app"
    data_dir = tmp_path / "worker-data"
    store = ["--store", "rocksdb", "--data-dir", str(data_dir)]
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=2, sets=SETS) as start:
        first = start(extra=store)
        _feed(kafka_bootstrap, topic_prefix, 1, 40, trainers)
        feeder = threading.Thread(
            target=_feed, args=(kafka_bootstrap, topic_prefix, 41, STEPS, trainers)
        )
        feeder.start()
        _wait_states(
            kafka_bootstrap,
            app_id,
            lambda v: any(x.steps and x.steps.steps_observed >= 30 for x in v.values()),
        )
        # The states live in RocksDB, one database per table partition the worker holds.
        assert {f"{t}-{p}.db" for t in TABLES for p in (0, 1)} <= _databases(data_dir)
        first.kill()
        feeder.join()
        successor = start(extra=store)  # same host, same data dir: the databases reopened
        _wait_states(kafka_bootstrap, app_id, _all_applied_exactly(STEPS))
        _check_exact_and_audited(kafka_bootstrap, topic_prefix, STEPS)
        assert successor.stop() == 0, successor.log_tail(40)
    # Each database keeps the offset of its changelog partition's newest record (what a
    # successor on this host reads past): the worker sets it once Kafka acknowledged it.
    for table in TABLES:
        topic = changelog_topic(app_id, table)
        ends = _end_offsets(kafka_bootstrap, topic)
        for partition, end in ends.items():
            if end == 0:
                continue  # nothing written to it (a table no record reached there)
            persisted = _persisted_offset(data_dir, f"{table}-{partition}.db")
            assert persisted == end - 1, (topic, partition, persisted, end)


def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        return {tp.partition: end for tp, end in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def _persisted_offset(data_dir: Path, name: str) -> int | None:
    """The changelog offset faust's RocksDB store keeps in database ``name`` (read only)."""
    import rocksdict

    (path,) = data_dir.glob(f"v*/tables/{name}")
    db = rocksdict.Rdict(
        str(path),
        options=rocksdict.Options(raw_mode=True),
        access_type=rocksdict.AccessType.read_only(),
    )
    try:
        raw = db.get(b"__faust\0offset__")
    finally:
        db.close()
    return None if raw is None else int(raw)
