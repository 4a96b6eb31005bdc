"""`processors.changelog_batches.hand_over` against a real broker, with a real aiokafka producer.

A producer whose batches hold about a kilobyte, so a partition's records fill several:
every record lands in the partition its key names, in the order given, under its key with
its value (a tombstone as a null value); each record's answer (its batch's future and its
place) gives its offset; a record the test seam refuses is not sent; a partition the topic
does not have gives its records the producer's error and the others go on.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer
from kafka import KafkaConsumer, TopicPartition

from runwatch import admin
from runwatch.processors.changelog_batches import Handed, hand_over
from runwatch.schemas.topics import TopicSpec

pytestmark = pytest.mark.integration

PARTITIONS = 3


def _topic(bootstrap: str, name: str) -> str:
    spec = TopicSpec(
        name=name, partitions=PARTITIONS, compacted=True, retention_ms=None, carries="states"
    )
    admin.create_topics(bootstrap, [spec])
    return name


def _read(bootstrap: str, topic: str) -> dict[int, list[tuple[int, bytes, bytes | None]]]:
    """Each partition's ``(offset, key, value)`` records, read to its end."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        out: dict[int, list[tuple[int, bytes, bytes | None]]] = {p: [] for p in range(PARTITIONS)}
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for tp, records in consumer.poll(timeout_ms=500).items():
                out[tp.partition] += [(r.offset, r.key, r.value) for r in records]
        return out
    finally:
        consumer.close()


async def _hand_over(bootstrap: str, topic: str, records, partition_of, check=lambda: None):
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_batch_size=1024, acks="all")
    await producer.start()
    try:
        answers = await hand_over(producer, topic, records, partition_of, check)
        handed = [a for a in answers if isinstance(a, Handed)]
        metadata = await asyncio.gather(*{a.ack for a in handed})
        assert all(m.topic == topic for m in metadata)
        offsets = [
            None if not isinstance(a, Handed) else (await a.ack).offset + a.place for a in answers
        ]
        return answers, offsets
    finally:
        await producer.stop()


def test_each_partitions_records_go_whole_in_order_with_their_offsets(
    kafka_bootstrap, topic_prefix
):
    topic = _topic(kafka_bootstrap, f"{topic_prefix}-states")
    records = [(f"run-{i % 7}".encode(), bytes([i]) * 300) for i in range(40)]
    records.append((b"run-3", None))  # a tombstone
    refused = {5, 17}
    where = {p: [] for p in range(PARTITIONS)}  # records in the order their partition takes

    def partition_of(key: bytes) -> int:
        return int(key.rsplit(b"-", 1)[1]) % PARTITIONS

    for index, (key, _) in enumerate(records):
        where[partition_of(key)].append(index)
    order = [i for p in sorted(where, key=lambda p: min(where[p])) for i in where[p]]
    checked = iter(order)

    def check() -> None:
        if next(checked) in refused:
            raise RuntimeError("refused by the seam")

    answers, offsets = asyncio.run(_hand_over(kafka_bootstrap, topic, records, partition_of, check))
    assert [i for i, a in enumerate(answers) if not isinstance(a, Handed)] == sorted(refused)
    assert len({a.ack for a in answers if isinstance(a, Handed)}) > PARTITIONS, "several batches"
    stored = _read(kafka_bootstrap, topic)
    for partition, indexes in where.items():
        sent = [i for i in indexes if i not in refused]
        assert [(k, v) for _, k, v in stored[partition]] == [records[i] for i in sent]
        assert [o for o, _, _ in stored[partition]] == [offsets[i] for i in sent]


def test_a_partition_the_topic_lacks_fails_its_records_only(kafka_bootstrap, topic_prefix):
    topic = _topic(kafka_bootstrap, f"{topic_prefix}-states")
    records = [(b"a", b"1"), (b"b", b"2"), (b"a", b"3")]

    def partition_of(key: bytes) -> int:
        return 0 if key == b"a" else PARTITIONS + 5  # no such partition

    answers, offsets = asyncio.run(_hand_over(kafka_bootstrap, topic, records, partition_of))
    assert isinstance(answers[1], BaseException)
    assert isinstance(answers[0], Handed) and isinstance(answers[2], Handed)
    assert [(k, v) for _, k, v in _read(kafka_bootstrap, topic)[0]] == [(b"a", b"1"), (b"a", b"3")]
    assert offsets[2] == offsets[0] + 1
