"""Helpers for the producer integration tests: read what the emitter wrote, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

Consume = Callable[..., list[Any]]


def consume_records(
    bootstrap: str, topics: Sequence[str], count: int, *, timeout_s: float = 60.0
) -> list[Any]:
    """Read ``count`` records from the start of ``topics``, or whatever came by the deadline.

    Returns kafka-python ``ConsumerRecord``s in the order they were polled.
    """
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    records: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(records) < count and time.monotonic() < deadline:
            batches = consumer.poll(timeout_ms=500)
            for batch in batches.values():
                records.extend(batch)
    finally:
        consumer.close()
    return records


@pytest.fixture
def consume(kafka_bootstrap: str) -> Consume:
    """``consume(topics, count, timeout_s=60, bootstrap=...)`` on the session broker."""

    def run(
        topics: Sequence[str], count: int, *, timeout_s: float = 60.0, bootstrap: str | None = None
    ) -> list[Any]:
        return consume_records(bootstrap or kafka_bootstrap, topics, count, timeout_s=timeout_s)

    return run
