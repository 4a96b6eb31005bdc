"""Callback tests: the real trainer libraries (optional extras), tiny models, no hub.

Models are built from configs; ``HF_HUB_OFFLINE`` makes any attempt to reach a hub fail
instead of downloading. The events are read back from the session broker.
"""

from __future__ import annotations

import os
import time

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from kafka import KafkaConsumer, TopicPartition

from runwatch.schemas.codec import decode
from runwatch.schemas.events import Event


def read_all(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[Event]:
    """Every event of ``topic`` up to its current end (call once delivery is confirmed)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        events: list[Event] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            for records in consumer.poll(timeout_ms=200).values():
                events.extend(decode(r.value) for r in records)
        return events
    finally:
        consumer.close()
