"""An event's time is bounded by its record's broker timestamp (`schemas.records`)."""

from __future__ import annotations

from runwatch.schemas.codec import encode
from runwatch.schemas.events import (
    DeadLetter,
    Event,
    EventPack,
    Heartbeat,
    RunStarted,
    StepCompleted,
    Tick,
)
from runwatch.schemas.records import FUTURE_TS, MAX_FUTURE_SKEW_NS, RawRecord, check
from runwatch.schemas.topics import TopicRole

BROKER_MS = 1_800_000_000_000
BROKER_NS = BROKER_MS * 1_000_000
DAY_NS = 86_400 * 10**9


def _record(event: Event, topic: str = "rw.heartbeats", stamp_ms: int = BROKER_MS) -> RawRecord:
    key = b"*" if isinstance(event, Tick) else event.run_id.encode()
    return RawRecord(topic, 0, 7, key, encode(event), stamp_ms)


def test_a_tick_later_than_the_broker_says_only_now() -> None:
    ahead = Tick(run_id="*", ts_ns=BROKER_NS + DAY_NS, partition=0)
    out = check(_record(ahead), TopicRole.HEARTBEATS)
    assert not isinstance(out, DeadLetter)
    assert out.event == Tick(run_id="*", ts_ns=BROKER_NS, partition=0)
    behind = Tick(run_id="*", ts_ns=BROKER_NS - 5, partition=0)
    kept = check(_record(behind), TopicRole.HEARTBEATS)
    assert not isinstance(kept, DeadLetter) and kept.event is not None
    assert kept.event.ts_ns == BROKER_NS - 5


def test_an_event_past_the_skew_is_a_dead_letter_and_within_it_is_kept() -> None:
    limit = BROKER_NS + MAX_FUTURE_SKEW_NS
    inside = Heartbeat(run_id="r", ts_ns=limit, rank=0, step=1)
    out = check(_record(inside), TopicRole.HEARTBEATS)
    assert not isinstance(out, DeadLetter) and out.event == inside
    past = Heartbeat(run_id="r", ts_ns=limit + 1, rank=0, step=1)
    dead = check(_record(past), TopicRole.HEARTBEATS)
    assert isinstance(dead, DeadLetter)
    assert dead.reason.startswith(FUTURE_TS + ":")
    assert dead.stage == "decode" and dead.payload == encode(past)  # nothing lost


def test_a_future_run_started_on_the_runs_topic_is_a_dead_letter() -> None:
    started = RunStarted(run_id="r", ts_ns=BROKER_NS + DAY_NS, world_size=2, incarnation=3)
    dead = check(_record(started, "rw.runs"), TopicRole.RUNS)
    assert isinstance(dead, DeadLetter) and FUTURE_TS in dead.reason


def test_one_future_event_in_a_pack_dead_letters_the_pack() -> None:
    ok = StepCompleted(run_id="r", ts_ns=BROKER_NS, step=1, loss=1.0, step_time_s=0.1)
    bad = StepCompleted(run_id="r", ts_ns=BROKER_NS + DAY_NS, step=2, loss=1.0, step_time_s=0.1)
    pack = EventPack(run_id="r", ts_ns=BROKER_NS, events=(ok, bad))
    dead = check(_record(pack, "rw.steps"), TopicRole.STEPS)
    assert isinstance(dead, DeadLetter) and FUTURE_TS in dead.reason


def test_topics_without_broker_time_and_records_without_a_stamp_are_not_bounded() -> None:
    future = Heartbeat(run_id="r", ts_ns=BROKER_NS + DAY_NS, rank=0, step=1)
    unstamped = check(_record(future, stamp_ms=0), TopicRole.HEARTBEATS)
    assert not isinstance(unstamped, DeadLetter)
    tick = Tick(run_id="*", ts_ns=BROKER_NS + DAY_NS, partition=0)
    assert check(_record(tick, stamp_ms=-1), TopicRole.HEARTBEATS).event == tick  # type: ignore[union-attr]
