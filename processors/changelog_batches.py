"""A table's changelog records handed to aiokafka whole, one record batch per partition.

faust stores a table value through ``table[key] = value``: its change hook asks the
producer's partitioner for the key's partition, wraps the record in a ``FutureMessage``,
queues it in its ``ProducerBuffer``, and a task of the event loop later sends it through
``Topic.publish_message`` (a lock, sensors) and aiokafka's ``send`` (metadata, partition,
accumulator): 30-40 µs of Python a record, every one on the worker's one thread. A fleet's
worker writes the states of every run a second touched, once a second (~1,000 records):
15-60 ms of each flush on the rounds' path, where a spike's step waits for it, and the
buffer's sends after it (`bench/fleet.py --keep`, the workers' ``write_ms``).

The batch path knows each key's partition already (the tables use the default
partitioner and are co-partitioned with their inputs: `processors.logread.partition_for`),
so `hand_over` appends a flush's records to one aiokafka ``BatchBuilder`` per partition
(a new one when it is full) and submits each with ``send_batch``: the records go in
their order within each partition, under the same keys and partitions as faust's, and
Kafka acknowledges each batch once. A record's answer is its batch's future and its place
in the batch (`Handed`). The caller stores the value locally only once its record is
handed over (`processors.app._Agent.write_unwritten`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast


@dataclass(frozen=True, slots=True)
class Handed:
    """A record handed to the producer.

    Attributes:
        ack: The future of its batch (aiokafka's ``RecordMetadata`` of the batch: its
            topic, partition and base offset), or of its own record.
        place: Its offset within the batch (the record's offset is the base offset plus
            this).
    """

    ack: asyncio.Future[Any]
    place: int


Record = tuple[bytes, bytes | None]
"""A changelog record: its key and value (None: a tombstone)."""


async def hand_over(
    producer: Any,
    topic: str,
    records: Sequence[Record],
    partition_of: Callable[[bytes], int],
    check: Callable[[], None] = lambda: None,
) -> list[Handed | BaseException]:
    """Hand ``records`` to ``producer`` (aiokafka's), one batch per partition.

    Rules, per record, in partition order of first appearance, then in the given order:
        1. ``check`` runs first (a test seam); what it raises is the record's answer and
           the record is not sent.
        2. The record joins its partition's open batch; a full batch is submitted and a
           new one opened for it.
        3. A batch whose submission raises (the producer closed, its queue full past the
           request timeout, no metadata for the partition) gives that error as the answer
           of each of its records: none of them was handed over.

    Args:
        producer: A started ``aiokafka.AIOKafkaProducer``.
        topic: The changelog topic.
        records: ``(key, value)`` pairs.
        partition_of: The partition of a key.
        check: Called before each record is appended.

    Returns:
        Per record, in the order given: where it went (`Handed`), or the error that kept
        it from the producer.
    """
    answers: list[Handed | BaseException | None] = [None] * len(records)
    groups: dict[int, list[int]] = {}
    for index, (key, _) in enumerate(records):
        groups.setdefault(partition_of(key), []).append(index)
    for partition, indexes in groups.items():
        batch, members = producer.create_batch(), []
        for index in indexes:
            key, value = records[index]
            try:
                check()
            except Exception as exc:  # rule 1
                answers[index] = exc
                continue
            place = batch.append(timestamp=None, key=key, value=value)
            if place is None:  # rule 2: full (the first record of a batch always fits)
                await _submit(producer, topic, partition, batch, members, answers)
                batch, members = producer.create_batch(), []
                place = batch.append(timestamp=None, key=key, value=value)
            members.append((index, place.offset))
        if members:
            await _submit(producer, topic, partition, batch, members, answers)
    return cast(list[Handed | BaseException], answers)  # each index answered above


async def _submit(
    producer: Any,
    topic: str,
    partition: int,
    batch: Any,
    members: list[tuple[int, int]],
    answers: list[Handed | BaseException | None],
) -> None:
    """Submit ``batch`` and answer each of its ``members`` (record index, place)."""
    batch.close()  # nothing else the producer sends joins it
    try:
        ack = await producer.send_batch(batch, topic, partition=partition)
    except Exception as exc:  # rule 3
        for index, _ in members:
            answers[index] = exc
        return
    for index, place in members:
        answers[index] = Handed(ack, place)


__all__ = ["Handed", "Record", "hand_over"]
