"""A round's outputs of its urgent roles go out before its bulk is folded (`_BatchSink.deliver`).

The producer sends only while the event loop runs, and a round's fold never yields to it.
These tests drive `_BatchSink.fold` with stand-in role bodies whose ``send`` returns futures
that the event loop resolves on its next turn (what aiokafka's sender task does with a
batch, minus the network). They claim nothing about Kafka or faust: that outputs reach a
real broker is the integration tests' (tests/integration/processors/). What they hold is
this module's own ordering: when the bulk role's fold asks for its first state, has the
loop had the chance to deliver what the steps handed over?
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from runwatch.processors import app as processors_app
from runwatch.processors.app import URGENT_DELIVERY_S, _BatchSink
from runwatch.processors.core.config import DetectorConfig
from runwatch.schemas.codec import encode, encode_key
from runwatch.schemas.events import Heartbeat, StepCompleted
from runwatch.schemas.records import RawRecord
from runwatch.schemas.topics import TopicRole

STEPS, HEARTBEATS = "t.steps", "t.heartbeats"
NOW_MS = 1_800_000_000_000


class StandInRole:
    """What `_BatchSink.fold` asks of a role's body; ``send`` hands futures back.

    Args:
        role: The topic role.
        events: Records the role has seen so far, in the order the sink showed them.
        deliver: Resolve each output's future on the loop's next turn (False: never).
    """

    def __init__(self, role: TopicRole, events: list[str], *, deliver: bool = True) -> None:
        self.on_first_load: list[Callable[[], None]] = []  # called once, at the first `load`
        self.role = role
        self.cfg = DetectorConfig()
        self.round_index: Any = None
        self.events = events
        self.deliver = deliver
        self.futures: list[asyncio.Future[None]] = []

    async def wait_for_metadata(self) -> None:
        return None

    async def send(self, outputs: list[Any]) -> list[asyncio.Future[None]]:
        loop = asyncio.get_running_loop()
        handed = []
        for _ in outputs:
            future: asyncio.Future[None] = loop.create_future()
            if self.deliver:
                loop.call_soon(future.set_result, None)
            handed.append(future)
        self.futures += handed
        return handed

    def load(self, run_id: str) -> Any:
        while self.on_first_load:
            self.on_first_load.pop()()
        self.events.append(f"{self.role} load {run_id}")
        return None

    def runs_in_partition(self, partition: int) -> list[str]:
        return []

    def finish(self, output: Any) -> Any:
        return output

    def evict(self, run_ids: Any) -> None:
        return None

    def absorb(self, encoded: Any, states: Any) -> None:
        return None


def _record(topic: str, offset: int, value: bytes, run_id: str = "r1") -> RawRecord:
    return RawRecord(topic, 0, offset, encode_key(run_id), value, NOW_MS)


def _round(step_value: bytes) -> dict[str, list[RawRecord]]:
    ts_ns = NOW_MS * 1_000_000
    step = StepCompleted(run_id="r1", ts_ns=ts_ns, step=1, loss=2.0, grad_norm=1.0, step_time_s=0.5)
    beat = Heartbeat(run_id="r2", ts_ns=ts_ns, rank=0, step=1)
    return {
        STEPS: [_record(STEPS, 0, encode(step)), _record(STEPS, 1, step_value)],
        HEARTBEATS: [_record(HEARTBEATS, 0, encode(beat), "r2")],
    }


def _sink(
    events: list[str], *, deliver: bool = True
) -> tuple[_BatchSink, StandInRole, StandInRole]:
    steps = StandInRole(TopicRole.STEPS, events, deliver=deliver)
    heartbeats = StandInRole(TopicRole.HEARTBEATS, events)
    roles: dict[str, Any] = {STEPS: steps, HEARTBEATS: heartbeats}
    return _BatchSink(None, roles, [HEARTBEATS]), steps, heartbeats  # type: ignore[arg-type]


@pytest.mark.parametrize("bulk", [[HEARTBEATS], []], ids=["heartbeats-bulk", "no-bulk"])
def test_a_dead_letter_of_the_steps_is_delivered_before_the_heartbeats_fold(
    bulk: list[str],
) -> None:
    events: list[str] = []
    sink, steps, heartbeats = _sink(events)
    sink.bulk = frozenset(bulk)
    delivered_at_bulk: list[bool] = []
    heartbeats.on_first_load.append(
        lambda: delivered_at_bulk.append(all(f.done() for f in steps.futures))
    )
    asyncio.run(sink.fold(_round(b"not json")))
    assert len(steps.futures) == 1  # the undecodable step: one dead letter, handed over
    assert delivered_at_bulk == [bool(bulk)]  # without a bulk topic, nothing waits
    assert sink.sent == steps.futures


def test_a_round_whose_steps_made_no_output_folds_its_bulk_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []
    sink, steps, _ = _sink(events)
    waited: list[Any] = []

    async def no_wait(futures: list[Any]) -> None:
        waited.append(futures)

    monkeypatch.setattr(sink, "deliver", no_wait)
    ts_ns = NOW_MS * 1_000_000
    second = StepCompleted(
        run_id="r1", ts_ns=ts_ns + 1, step=2, loss=2.0, grad_norm=1.0, step_time_s=0.5
    )
    asyncio.run(sink.fold(_round(encode(second))))
    assert steps.futures == []
    assert waited == []
    assert f"{TopicRole.HEARTBEATS} load r2" in events


def test_an_undelivered_output_holds_the_bulk_no_longer_than_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(processors_app, "URGENT_DELIVERY_S", 0.01)
    events: list[str] = []
    sink, steps, _ = _sink(events, deliver=False)
    asyncio.run(sink.fold(_round(b"not json")))
    assert len(steps.futures) == 1 and not steps.futures[0].done()
    assert f"{TopicRole.HEARTBEATS} load r2" in events  # folded all the same
    assert sink.sent == steps.futures  # the checkpoint still waits for it


def test_the_cap_is_no_longer_than_a_bulk_round() -> None:
    from runwatch.processors.engine import ROUND_BULK_S

    assert 0 < URGENT_DELIVERY_S <= ROUND_BULK_S
