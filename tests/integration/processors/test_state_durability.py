"""A state write Kafka does not store holds the commit: a successor applies every record.

What the soak lost (issue 18: one partition's liveness states ~30 s behind the committed
offset after a worker was SIGKILLed) comes from offsets committed past table writes that
Kafka never stored. faust's own commit trusted its producer flush, which returns after
0.1 s without a message handed on even when writes are still in faust's buffer, and never
looks at a changelog send that failed; a worker then went on from its in-memory table, so
nothing showed until it died and its successor restored the older states from the
changelog and resumed from the newer commit.

The fault here is real and lands at a chosen point: the heartbeats table's changelog topic
is given a ``max.message.bytes`` no state fits in, so the broker refuses every state write
to it (MESSAGE_SIZE_TOO_LARGE, not retriable) while the verdicts, the steps table and the
offset commits go through, the soak's picture. The worker must not commit past the
heartbeats it could not store; it stops (exit 1). Then the topic takes states again, the
worker's successor restores, and every heartbeat is applied exactly once.
"""

from __future__ import annotations

import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from runwatch.processors.fleet import committed_offsets, latest_states, wait_until_processed
from runwatch.processors.settings import changelog_topic
from runwatch.procs import ManagedProcess
from runwatch.schemas.topics import TopicRole, folding, names

from .harness import WAIT_S, Trainer, workers

pytestmark = pytest.mark.integration

SETS = ("rank_heartbeat_threshold=10", "hang_timeout_s=600", "dead_rank_timeout_s=600")
RUN, WORLD, STEPS, FAULT_AT = "state-durability", 2, 40, 20


def _set_max_message_bytes(bootstrap: str, topic: str, value: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        resource = ConfigResource(
            ConfigResourceType.TOPIC, topic, configs={"max.message.bytes": value}
        )
        admin.alter_configs([resource])
    finally:
        admin.close()


def _end_offsets(bootstrap: str, topic: str) -> dict[tuple[str, int], int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return {(tp.topic, tp.partition): n for tp, n in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def _stopped_or_committed_past(
    worker: ManagedProcess, bootstrap: str, app_id: str, ends: dict[tuple[str, int], int]
) -> str:
    """Wait until the worker exits (it could not store the states) or commits past ``ends``."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if worker.returncode is not None:
            return "stopped"
        done = committed_offsets(bootstrap, app_id)
        if all(done.get(tp, 0) >= n for tp, n in ends.items()):
            return "committed"
        time.sleep(0.2)  # commits land on the broker's schedule; poll them and the process
    raise AssertionError("the worker neither stopped nor committed the records")


def test_offsets_are_not_committed_past_states_kafka_refused(
    kafka_bootstrap, topic_prefix, make_topics, tmp_path
):
    make_topics(topic_prefix, partitions=1)
    topics = names(topic_prefix)
    app_id = f"{topic_prefix}-app"
    changelog = changelog_topic(app_id, folding(TopicRole.HEARTBEATS).table)
    with workers(kafka_bootstrap, topic_prefix, tmp_path, partitions=1, sets=SETS) as start:
        first = start()
        trainer = Trainer(kafka_bootstrap, topic_prefix, RUN, world_size=WORLD)
        trainer.start(0)
        for s in range(1, FAULT_AT + 1):
            trainer.step(s)
        trainer.flush()
        wait_until_processed(
            kafka_bootstrap, app_id, [topics.steps, topics.heartbeats], timeout_s=WAIT_S
        )
        # From here the broker refuses every liveness state write; nothing else changes.
        _set_max_message_bytes(kafka_bootstrap, changelog, "64")
        for s in range(FAULT_AT + 1, STEPS + 1):
            trainer.step(s)
        trainer.close()
        ends = _end_offsets(kafka_bootstrap, topics.heartbeats)
        outcome = _stopped_or_committed_past(first, kafka_bootstrap, app_id, ends)
        first_log = first.log_path.read_text(errors="replace")
        first.kill()  # where the soak's SIGKILL landed: after the refused writes

        _set_max_message_bytes(kafka_bootstrap, changelog, str(1024 * 1024))
        start()
        wait_until_processed(
            kafka_bootstrap, app_id, [topics.steps, topics.heartbeats], timeout_s=WAIT_S
        )
        view = latest_states(kafka_bootstrap, app_id)[RUN]
    assert view.steps is not None and view.steps.steps_observed == STEPS
    # Before the fix: 2 * FAULT_AT, the states of the heartbeats after the fault lost.
    assert view.liveness is not None and view.liveness.heartbeats == WORLD * STEPS
    assert outcome == "stopped", "committed past heartbeats whose states Kafka refused"
    assert "could not be applied whole" in first_log, first_log[-3000:]
