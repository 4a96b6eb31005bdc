"""`runwatch audit` against real workers: lag is PENDING, never DISAGREES; `--all` finds forgeries.

The workers are `runwatch processors` subprocesses; the audits are `runwatch audit`
subprocesses, so exit codes and output are the user's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from runwatch.processors.lag import GroupOffsets
from runwatch.processors.logread import partition_for, read_history
from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import AnomalyDetected
from runwatch.schemas.topics import names

from .harness import WAIT_S, Reader, Trainer, workers

pytestmark = pytest.mark.integration


def runwatch_audit(bootstrap: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "runwatch.cli", "audit", "--bootstrap", bootstrap),
            *("--prefix", prefix, "--app-id", f"{prefix}-app", *args),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def wait_for_group(bootstrap: str, prefix: str, group: str) -> None:
    deadline = time.monotonic() + WAIT_S
    with GroupOffsets(bootstrap, group) as offsets:
        while not offsets.exists([names(prefix).steps]):
            assert time.monotonic() < deadline, f"group {group} never committed"
            time.sleep(0.2)  # polling the coordinator for the first commit


def spiked(run: str):
    return lambda events: any(
        isinstance(e, AnomalyDetected) and e.run_id == run and e.kind == "loss_spike"
        for e in events
    )


def test_a_stopped_worker_makes_the_audit_pending_then_it_agrees(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path
):
    make_topics(topic_prefix, partitions=2)
    run = "run-lag"
    anomalies = Reader(kafka_bootstrap, names(topic_prefix).anomalies)
    trainer = Trainer(kafka_bootstrap, topic_prefix, run)
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=2) as start:
        worker = start()
        trainer.start(0)
        for s in range(1, 31):
            trainer.step(s, loss=9.0 if s == 25 else None)
        anomalies.wait_for(spiked(run))
        wait_for_group(kafka_bootstrap, topic_prefix, f"{topic_prefix}-app")
        assert worker.stop() is not None
        # mid-run, nobody processing: 20 steps, 40 heartbeats, a second spike, the end
        for s in range(31, 51):
            trainer.step(s, loss=12.0 if s == 45 else None)
        trainer.end("completed")

        out = runwatch_audit(kafka_bootstrap, topic_prefix, "--run", run, "--wait", "1", "--json")
        assert out.returncode == 3, (out.returncode, out.stdout, out.stderr)
        receipt = json.loads(out.stdout)
        assert receipt["verdict"] == "PENDING"
        assert receipt["progress"]["group_found"]
        assert sum(p["pending"] for p in receipt["progress"]["partitions"]) >= 20 + 40 + 2
        text = runwatch_audit(kafka_bootstrap, topic_prefix, "--run", run, "--wait", "0")
        assert text.returncode == 3 and "PENDING" in text.stdout and "DISAGREES" not in text.stdout

        start()  # the worker comes back and catches up; the audit waits for it
        out = runwatch_audit(kafka_bootstrap, topic_prefix, "--run", run, "--wait", "180")
        assert out.returncode == 0, (out.stdout, out.stderr)
        assert "every verdict reproduced" in out.stdout
        # the spike sent while nobody was processing was judged after the restart, and
        # the audit compared it (it waited for it instead of calling it missing)
        events = anomalies.wait_for(
            lambda ev: any(isinstance(e, AnomalyDetected) and e.step == 45 for e in ev)
        )
        recorded = {e.verdict_id for e in events if isinstance(e, AnomalyDetected)}
        again = runwatch_audit(kafka_bootstrap, topic_prefix, "--run", run, "--json")
        assert again.returncode == 0, again.stdout
        assert set(json.loads(again.stdout)["anomalies"]["matched"]) == recorded
        # a group that never committed cannot tell lag: said, with the group that did
        unknown = runwatch_audit(kafka_bootstrap, topic_prefix, "--run", run, "--app-id", "nope")
        assert unknown.returncode == 0, unknown.stdout
        assert "no consumer group 'nope'" in unknown.stdout and "cannot tell lag" in unknown.stdout
        assert f"{topic_prefix}-app" in unknown.stdout
        # nor can a group that commits only on other topics (another prefix): never PENDING
        elsewhere = KafkaConsumer(
            bootstrap_servers=kafka_bootstrap, group_id=f"{topic_prefix}-elsewhere"
        )
        controller = TopicPartition(names(topic_prefix).controller, 0)
        elsewhere.assign([controller])
        elsewhere.commit({controller: OffsetAndMetadata(0, "", -1)})
        elsewhere.close()
        other = runwatch_audit(
            kafka_bootstrap, topic_prefix, "--run", run, "--app-id", f"{topic_prefix}-elsewhere"
        )
        assert other.returncode == 0 and "cannot tell lag" in other.stdout, other.stdout
    trainer.close()
    anomalies.close()


def test_a_group_that_exists_but_has_not_committed_makes_the_audit_pending(
    kafka_bootstrap, topic_prefix, make_topics
):
    # A worker killed before its first offset commit leaves a group that has joined and
    # processed nothing: that is lag (PENDING), not "no consumer group".
    make_topics(topic_prefix, partitions=1)
    run, group = "run-uncommitted", f"{topic_prefix}-fresh"
    trainer = Trainer(kafka_bootstrap, topic_prefix, run)
    trainer.start(0)
    for s in range(1, 6):
        trainer.step(s)
    trainer.end("completed")
    member = KafkaConsumer(
        names(topic_prefix).steps,
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        enable_auto_commit=False,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not member.assignment():  # joined: the group exists, nothing committed
            assert time.monotonic() < deadline, "the member never joined its group"
            member.poll(timeout_ms=200, max_records=1)
        with GroupOffsets(kafka_bootstrap, group) as offsets:
            assert offsets.committed([TopicPartition(names(topic_prefix).steps, 0)]) == {}
        out = runwatch_audit(
            kafka_bootstrap, topic_prefix, "--run", run, "--app-id", group, "--wait", "1", "--json"
        )
        assert out.returncode == 3, (out.returncode, out.stdout, out.stderr)
        receipt = json.loads(out.stdout)
        assert receipt["verdict"] == "PENDING" and receipt["progress"]["group_found"]
        assert sum(p["pending"] for p in receipt["progress"]["partitions"]) >= 5
    finally:
        member.close(autocommit=False)
        trainer.close()


def test_audit_all_names_the_run_with_a_forged_verdict(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path
):
    make_topics(topic_prefix, partitions=2)
    t = names(topic_prefix)
    runs = ("run-x", "run-y", "run-z")
    anomalies = Reader(kafka_bootstrap, t.anomalies)
    trainers = {r: Trainer(kafka_bootstrap, topic_prefix, r, seed=i) for i, r in enumerate(runs)}
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=2) as start:
        start()
        for tr in trainers.values():
            tr.start(0)
        for s in range(1, 26):
            for r, tr in trainers.items():
                tr.step(s, loss=9.0 if (r == "run-x" and s == 20) else None)
        for tr in trainers.values():
            tr.end("completed")
        anomalies.wait_for(spiked("run-x"))
        forged = AnomalyDetected(
            run_id="run-y",
            ts_ns=time.time_ns(),
            verdict_id="forged-0001",
            kind="loss_spike",
            step=7,
            rank=0,
            value=99.0,
            detail="written by hand, not by the processors",
        )
        producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        producer.send(t.anomalies, key=encode_key("run-y"), value=encode(forged))
        producer.flush(30)
        producer.close()

        out = runwatch_audit(kafka_bootstrap, topic_prefix, "--all", "--wait", "180")
    for tr in trainers.values():
        tr.close()
    anomalies.close()
    assert out.returncode == 1, (out.stdout, out.stderr)
    rows = {line.split()[0]: line for line in out.stdout.splitlines() if line.startswith("run-")}
    assert sorted(rows) == list(runs), out.stdout
    assert rows["run-x"].endswith("AGREES") and rows["run-z"].endswith("AGREES"), out.stdout
    assert rows["run-y"].endswith("DISAGREES"), out.stdout
    assert "1/0/0" in rows["run-x"]  # the real spike, matched
    assert "0/0/1" in rows["run-y"]  # the forged one, unexpected
    assert "audit of run run-y" in out.stdout and "unexpected: loss_spike 7 0" in out.stdout
    # every record of a run is in the partition the audit reads for it
    history = read_history(kafka_bootstrap, [t.steps, t.heartbeats, t.anomalies])
    for records in history.values():
        for r in records:
            if r.key != b"*":
                assert r.partition == partition_for(r.key.decode(), 2), r
