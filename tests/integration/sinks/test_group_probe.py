"""The processors' group probe against the real broker: lag and workers of a real group."""

from __future__ import annotations

import pytest
from kafka import KafkaConsumer, KafkaProducer

from runwatch.schemas.topics import names
from runwatch.sinks.group_probe import GroupProbe

pytestmark = pytest.mark.integration


def test_the_probe_sees_a_groups_lag_and_its_members(kafka_bootstrap, topic_prefix, make_topics):
    make_topics(topic_prefix, partitions=1)
    steps = names(topic_prefix).steps
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for _ in range(10):
        producer.send(steps, b"x", partition=0)
    producer.flush(30)
    producer.close()
    group = f"{topic_prefix}-processors"
    consumer = KafkaConsumer(
        steps,
        bootstrap_servers=kafka_bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=4,
    )
    probe = GroupProbe(kafka_bootstrap, group)
    try:
        read = 0
        while read < 4:
            read += sum(len(m) for m in consumer.poll(1000, max_records=4).values())
        consumer.commit()
        sample = probe.sample()
        assert sample.lag == {(steps, 0): 10 - read}
        assert sample.workers == 1
        consumer.close()
        assert probe.sample().workers == 0  # no worker left: the lag stays, nobody works on it
        assert probe.sample().lag == {(steps, 0): 10 - read}
        assert GroupProbe(kafka_bootstrap, f"{topic_prefix}-nobody").sample() == ({}, 0)
    finally:
        probe.stop()
