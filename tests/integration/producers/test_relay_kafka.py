"""The node relay on the real broker: ranks' heartbeats arrive packed, flush means acked."""

from __future__ import annotations

from pathlib import Path

import pytest

from runwatch.controller.relay import RelayServer
from runwatch.producers.emitter import RunEmitter
from runwatch.schemas.codec import decode
from runwatch.schemas.events import EventPack, Heartbeat, RunEnded, StepCompleted
from runwatch.schemas.topics import names

from .conftest import Consume

pytestmark = pytest.mark.integration


def test_two_ranks_through_one_relay(
    kafka_bootstrap: str, topic_prefix: str, make_topics, consume: Consume, tmp_path: Path
) -> None:
    make_topics(topic_prefix, partitions=1)
    topics = names(topic_prefix)
    relay = RelayServer(tmp_path / "relay.sock", kafka_bootstrap, topic_prefix, run_ids=["relayed"])
    try:
        emitters = [
            RunEmitter(
                "relayed",
                bootstrap="unused:1",  # never dialled: the relay owns the producer
                rank=r,
                world_size=2,
                topic_prefix=topic_prefix,
                relay_socket=str(tmp_path / "relay.sock"),
            )
            for r in (0, 1)
        ]
        for step in range(1, 21):
            for e in emitters:
                e.heartbeat(step, step_time_s=0.01)
            emitters[0].step(step, loss=1.0 / step, step_time_s=0.01)
        # The agent's own flush of the run: what the ranks wrote so far is acked (packs open
        # and records in flight at the request included), well before any timeout.
        assert relay.flush_run("relayed", timeout_s=60)
        # Ranks are separate connections: only a flush orders one rank's records before
        # another's. After it, rank 1's heartbeats are in Kafka before rank 0's marker.
        assert all(e.flush(timeout_s=60) for e in emitters)  # acked by Kafka
        emitters[0].run_ended("completed", final_step=20)
        assert emitters[0].flush(timeout_s=60)
        for e in emitters:
            assert e.close(timeout_s=30)
            assert e.stats.delivered == e.stats.enqueued and e.stats.dropped == 0
        assert relay.frames == 40 + 20 + 3
        hb_records = consume([topics.heartbeats], 1, timeout_s=30)
        packed = [decode(r.value) for r in hb_records]
    finally:
        relay.close()
    # every heartbeat arrived, in each rank's order, most of them in packs
    beats: list[Heartbeat] = []
    for event in packed:
        if isinstance(event, EventPack):
            beats += [b for b in event.events if isinstance(b, Heartbeat)]
        elif isinstance(event, Heartbeat):
            beats.append(event)
    assert any(isinstance(e, EventPack) for e in packed)
    for rank in (0, 1):
        assert [b.step for b in beats if b.rank == rank] == list(range(1, 21))
    # the marker comes after every heartbeat queued before it on its topic
    assert isinstance(packed[-1], RunEnded)
    steps = [decode(r.value) for r in consume([topics.steps], 21, timeout_s=30)]
    assert [s.step for s in steps if isinstance(s, StepCompleted)] == list(range(1, 21))


def test_no_relay_counts_drops_and_never_blocks(tmp_path: Path, topic_prefix: str) -> None:
    emitter = RunEmitter(
        "orphan",
        bootstrap="unused:1",
        topic_prefix=topic_prefix,
        max_buffered=5,
        relay_socket=str(tmp_path / "absent.sock"),
    )
    for step in range(20):
        emitter.heartbeat(step)
    assert not emitter.flush(timeout_s=0.5)
    assert not emitter.close(timeout_s=0.5)
    stats = emitter.stats
    assert stats.delivered == 0 and stats.dropped == 15 and stats.enqueued == 5
