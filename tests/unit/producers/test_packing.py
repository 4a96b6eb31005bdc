"""Packing in the emitter: the pure `Packer`, and `RunEmitter` against a fake producer.

The fake stands in for the producer only; the real-broker path (packed heartbeats
reaching a real worker) is tests/integration/processors/test_packed.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from runwatch.producers import RunEmitter
from runwatch.producers.packing import Packer, PackPolicy
from runwatch.schemas.codec import decode, encode
from runwatch.schemas.events import EventPack, Heartbeat, RunEnded, StepCompleted
from tests.unit.producers.fakes import FakeBroker

HB, ST, RUNS = "p.heartbeats", "p.steps", "p.runs"
KEY = b"r"


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()


def hb(rank: int, step: int = 1) -> Heartbeat:
    return Heartbeat(run_id="r", ts_ns=1000 * step + rank, rank=rank, step=step, host="n", pid=1)


def st(step: int) -> StepCompleted:
    return StepCompleted(run_id="r", ts_ns=1000 * step, step=step, loss=2.0, step_time_s=0.1)


def drain(packer: Packer) -> list[tuple[str, object, int]]:
    out = []
    while (o := packer.next()) is not None:
        topics, key, value = o.item
        topic = topics[0]
        assert key == KEY
        out.append((topic, decode(value) if isinstance(value, bytes) else value, o.count))
    return out


def unpacked(records: list[tuple[str, object, int]]) -> list[tuple[str, object]]:
    events = []
    for topic, event, _ in records:
        inner = event.events if isinstance(event, EventPack) else (event,)
        events += [(topic, e) for e in inner]
    return events


# ----------------------------------------------------------------- Packer


def test_a_pack_closes_at_max_events_and_settles_them_all() -> None:
    packer = Packer(PackPolicy(heartbeats=True, max_events=4), HB, ST)
    for r in range(10):
        packer.offer(((HB,), KEY, hb(r)), now=0.0)
    out = drain(packer)
    assert [(t, c) for t, _, c in out] == [(HB, 4), (HB, 4)]  # two left open
    assert all(isinstance(e, EventPack) for _, e, _ in out)
    packer.close_all()
    out += drain(packer)
    assert unpacked(out) == [(HB, hb(r)) for r in range(10)]
    assert packer.packs == 3 and packer.holding == 0


def test_a_pack_closes_when_its_linger_passes() -> None:
    packer = Packer(PackPolicy(heartbeats=True, linger_s=0.5), HB, ST)
    packer.offer(((HB,), KEY, hb(0)), now=10.0)
    packer.offer(((HB,), KEY, hb(1)), now=10.4)
    assert packer.next_due() == 10.5
    packer.close_due(now=10.49)
    assert packer.next() is None and packer.holding == 2
    packer.close_due(now=10.5)
    ((topic, pack, count),) = drain(packer)
    assert (topic, count) == (HB, 2) and pack == EventPack(
        run_id="r", ts_ns=1001, events=(hb(0), hb(1))
    )


def test_a_pack_never_passes_max_bytes() -> None:
    size = len(encode(hb(0)))
    packer = Packer(PackPolicy(heartbeats=True, max_bytes=4096, max_events=4096), HB, ST)
    for r in range(200):
        packer.offer(((HB,), KEY, hb(r)), now=0.0)
    packer.close_all()
    out = drain(packer)
    assert len(out) > 1 and sum(c for _, _, c in out) == 200
    assert unpacked(out) == [(HB, hb(r)) for r in range(200)]
    for _, pack, count in out:
        assert len(encode(pack)) <= 4096  # type: ignore[arg-type]
        assert count * (size + 1) > 4096 - 100 - size or pack is out[-1][1]  # nearly full


def test_another_event_sends_the_open_packs_first() -> None:
    # A RunEnded goes to the heartbeats topic too: it must follow the heartbeats before it.
    packer = Packer(PackPolicy(heartbeats=True, steps=True), HB, ST)
    end = RunEnded(run_id="r", ts_ns=9, status="completed")
    items = [((HB,), KEY, hb(0)), ((ST,), KEY, st(1)), ((HB,), KEY, hb(1)), ((ST,), KEY, st(2))]
    for item in items:
        packer.offer(item, now=0.0)  # type: ignore[arg-type]
    packer.offer(((RUNS, ST, HB), KEY, end), now=0.0)
    packer.offer(((HB,), KEY, hb(2)), now=0.0)
    packer.close_all()
    out = drain(packer)
    # per topic, in queue order (topics are independent logs)
    assert sorted((t, c) for t, _, c in out[:2]) == [(HB, 2), (ST, 2)]
    assert [(t, c) for t, _, c in out[2:]] == [(RUNS, 1), (HB, 1)]
    assert out[2][1] == end
    assert out[3][1] == hb(2)  # a pack of one goes out as the event itself
    assert packer.packs == 2


def test_only_the_kinds_asked_for_are_packed() -> None:
    packer = Packer(PackPolicy(heartbeats=True), HB, ST)
    packer.offer(((ST,), KEY, st(1)), now=0.0)
    packer.offer(((HB,), KEY, b"already encoded"), now=0.0)
    packer.close_all()
    items = []
    while (o := packer.next()) is not None:
        items.append(o.item)
    assert items == [((ST,), KEY, st(1)), ((HB,), KEY, b"already encoded")]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pack_max_events": 1}, "pack_max_events"),
        ({"pack_max_events": 5000}, "pack_max_events"),
        ({"pack_linger_ms": 0}, "pack_linger_ms"),
        ({"pack_linger_ms": -5}, "pack_linger_ms"),
    ],
)
def test_packing_bounds_are_checked(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunEmitter("r", bootstrap="b:1", producer_factory=FakeBroker(), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pack_heartbeats"):
        RunEmitter("r", bootstrap="b:1", producer_factory=FakeBroker(), pack_heartbeats="yes")  # type: ignore[arg-type]


# ----------------------------------------------------------------- RunEmitter


def records_on(broker: FakeBroker, topic: str) -> list[object]:
    return [decode(v) for t, _, v in broker.records if t == topic and v]


def test_packing_is_off_by_default() -> None:
    broker = FakeBroker()
    with RunEmitter("r", bootstrap="b:1", producer_factory=broker, topic_prefix="p") as em:
        for step in range(20):
            em.heartbeat(step)
        assert em.flush(5.0)
    records = records_on(broker, HB)
    assert len(records) == 20 and all(isinstance(r, Heartbeat) for r in records)
    assert em.stats.packs == 0


def test_packed_heartbeats_arrive_whole_in_order_and_settle_per_event() -> None:
    broker = FakeBroker()
    em = RunEmitter(
        "r",
        bootstrap="b:1",
        producer_factory=broker,
        topic_prefix="p",
        pack_heartbeats=True,
        pack_max_events=64,
        pack_linger_ms=60_000,  # only the cap and flush close packs here
    )
    with em:
        em.run_started()
        for step in range(300):
            em.heartbeat(step)
            em.step(step, loss=1.0, step_time_s=0.1)
        assert em.flush(5.0)
        stats = em.stats
    records = records_on(broker, HB)
    beats = [e for r in records if isinstance(r, EventPack) for e in r.events]
    assert [b.step for b in beats] == list(range(300))
    assert all(isinstance(r, EventPack) for r in records[1:])  # records[0]: the RunStarted
    assert 5 <= len(records) - 1 <= 1 + 300 // 64 * 2
    steps = records_on(broker, ST)
    assert len(steps) == 301 and not any(isinstance(r, EventPack) for r in steps)
    assert (stats.enqueued, stats.delivered, stats.failed, stats.buffered) == (601, 601, 0, 0)
    assert stats.packs == len(records) - 1


def test_a_lingering_pack_goes_out_without_a_flush() -> None:
    broker = FakeBroker()
    with RunEmitter(
        "r",
        bootstrap="b:1",
        producer_factory=broker,
        topic_prefix="p",
        pack_heartbeats=True,
        pack_steps=True,
        pack_linger_ms=20,
    ) as em:
        for step in range(5):
            em.heartbeat(step)
            em.step(step, loss=float("nan"), step_time_s=0.1)
        assert wait_until(lambda: em.stats.delivered == 10)
    (pack,) = records_on(broker, HB)
    (steps,) = records_on(broker, ST)
    assert isinstance(pack, EventPack) and len(pack.events) == 5
    assert isinstance(steps, EventPack) and [s.step for s in steps.events] == list(range(5))


def test_close_delivers_the_open_packs() -> None:
    broker = FakeBroker()
    em = RunEmitter(
        "r",
        bootstrap="b:1",
        producer_factory=broker,
        topic_prefix="p",
        pack_heartbeats=True,
        pack_linger_ms=60_000,
    )
    for step in range(7):
        em.heartbeat(step)
    assert em.close(5.0) is True
    (pack,) = records_on(broker, HB)
    assert isinstance(pack, EventPack) and len(pack.events) == 7
    assert em.stats.delivered == 7


def test_a_failed_pack_fails_every_event_in_it() -> None:
    from kafka.errors import TopicAuthorizationFailedError

    broker = FakeBroker()
    broker.fail_topics[HB] = TopicAuthorizationFailedError()
    with RunEmitter(
        "r", bootstrap="b:1", producer_factory=broker, topic_prefix="p", pack_heartbeats=True
    ) as em:
        for step in range(9):
            em.heartbeat(step)
        em.step(0, loss=1.0, step_time_s=0.1)
        assert not em.flush(5.0)
        stats = em.stats
    assert (stats.enqueued, stats.delivered, stats.failed, stats.buffered) == (10, 1, 9, 0)


def test_a_pack_waits_out_a_metadata_timeout_and_loses_nothing() -> None:
    broker = FakeBroker()
    broker.metadata_timeouts = 2
    with RunEmitter(
        "r", bootstrap="b:1", producer_factory=broker, topic_prefix="p", pack_heartbeats=True
    ) as em:
        for step in range(12):
            em.heartbeat(step)
        assert em.flush(10.0)
    beats = [e for r in records_on(broker, HB) for e in r.events]  # type: ignore[attr-defined]
    assert [b.step for b in beats] == list(range(12))


def test_a_finished_flush_does_not_cut_the_next_burst_short() -> None:
    # A flush returns once its events are acknowledged, which can be before the delivery
    # thread has cleared its request: events queued after the flush must stay packed.
    from runwatch.producers.buffer import EventBuffer
    from runwatch.producers.delivery import DeliveryThread

    buffer: EventBuffer[object] = EventBuffer(100)
    packer = Packer(PackPolicy(heartbeats=True, linger_s=60.0), HB, ST)
    thread = DeliveryThread(
        buffer,  # type: ignore[arg-type]
        producer_factory=FakeBroker(),
        producer_config={},
        packer=packer,
    )  # never started: the test drives its hand-off step by step

    def queue(step: int) -> None:
        assert buffer.reserve() == 0
        buffer.push(((HB,), KEY, hb(0, step)))

    for step in range(4):
        queue(step)
    thread.request_flush(time.monotonic() + 60, target=buffer.enqueued)
    first = thread._next()
    assert first is not None and first.count == 4
    for step in range(4, 6):
        queue(step)  # the next burst, while the finished flush is still flagged
    assert thread._next() is None and packer.open_events == 2
    thread.request_flush(time.monotonic() + 60, target=buffer.enqueued)
    second = thread._next()
    assert second is not None and second.count == 2
