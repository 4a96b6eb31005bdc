"""States as bytes for table values, and the decoded states a worker keeps beside them."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.ledger import StepLedger
from runwatch.processors.core.replay import replay
from runwatch.processors.core.state_codec import (
    STATE_TYPES,
    DecodedStates,
    decode_state,
    encode_state,
)
from runwatch.processors.core.steps import StepHealthState
from runwatch.schemas.events import RunStarted, StepCompleted
from tests.unit.core.factories import (
    fold_heartbeats,
    fold_steps,
    healthy_losses,
    lockstep,
    started,
    step,
)
from tests.unit.core.test_properties import CFG, records_for


def test_every_state_round_trips_byte_identically() -> None:
    result = replay(records_for(7), CFG)
    tables = {
        "steps": result.steps,
        "liveness": result.liveness,
        "policy": result.policy,
        "checkpoints": result.checkpoints,
    }
    for kind, table in tables.items():
        for state in table.values():
            raw = encode_state(state)
            again = decode_state(kind, raw)  # type: ignore[arg-type]
            assert type(again) is STATE_TYPES[kind]
            assert encode_state(again) == raw


def _with_chunks(run_id: str, chunks: int, chunk_bytes: int = 1024) -> StepHealthState:
    """A step state whose ledger holds ``chunks`` opaque chunks (a state as large as asked)."""
    ledger = StepLedger(
        horizon_chunks=chunks, chunks=tuple(bytes([i % 256]) * chunk_bytes for i in range(chunks))
    )
    return StepHealthState(run_id=run_id, ledger=ledger)


def _plain(state: StepHealthState) -> bytes:
    """The state as a fresh msgspec encode gives it (no buffer kept between calls)."""
    return msgspec.msgpack.encode(state)


@pytest.mark.parametrize(
    "sizes",
    [
        pytest.param([2, 100, 1], id="small-large-small"),
        pytest.param([100, 3, 200, 0], id="large-first-then-larger"),
    ],
)
def test_encoded_bytes_do_not_depend_on_what_was_encoded_before(sizes: list[int]) -> None:
    """The thread's buffer keeps its largest size; each encode is its own state's bytes."""
    states = [_with_chunks(f"r{i}", n) for i, n in enumerate(sizes)]
    encoded = [encode_state(s) for s in states]
    assert [type(b) for b in encoded] == [bytes] * len(states)
    assert encoded == [_plain(s) for s in states]  # and earlier results were not overwritten
    assert max(map(len, encoded)) > 64 * 1024  # the buffer had to grow past its start


def test_threads_encode_into_buffers_of_their_own() -> None:
    """Threads switched as often as CPython allows; one buffer shared would mix their bytes."""
    states = [_with_chunks(f"t{i}", 20 + 30 * i) for i in range(4)]
    expected = [_plain(s) for s in states]
    start = threading.Barrier(len(states))
    wrong: list[int] = []

    def encode_many(i: int) -> None:
        start.wait()
        for _ in range(200):
            if encode_state(states[i]) != expected[i]:
                wrong.append(i)

    threads = [threading.Thread(target=encode_many, args=(i,)) for i in range(len(states))]
    interval_s = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval_s)
    assert wrong == []


def test_decode_by_class_and_unknown_kind() -> None:
    state = StepHealthState(run_id="r")
    assert decode_state(StepHealthState, encode_state(state)) == state
    with pytest.raises(ValueError):
        decode_state("nope", b"")  # type: ignore[arg-type]


def _liveness_rounds(world: int, rounds: int, per_round: int) -> list[list[Any]]:
    """A run's heartbeats cut into rounds, as a worker under a paced load folds them."""
    beats: list[Any] = [
        started(world_size=world),
        *lockstep(world, range(1, rounds * per_round + 1)),
    ]
    size = len(beats) // rounds
    return [beats[i : i + size] for i in range(0, len(beats), size)]


def test_decoded_states_hands_over_the_state_while_the_table_holds_its_bytes() -> None:
    cache = DecodedStates("steps", capacity=8)
    state = StepHealthState(run_id="r")
    data = encode_state(state)
    cache.put(b"r", data, state)
    assert cache.take(b"r", data) is state
    assert len(cache) == 0  # handed over: the taker owns it until it is put back
    assert cache.take(b"r", data) is not state  # decoded anew
    cache.put(b"r", data, state)
    assert cache.take(b"r", bytes(bytearray(data))) is state  # equal bytes, another object
    cache.put(b"r", data, state)
    other = StepHealthState(run_id="r", last_offset=41)  # a write the cache never saw
    again = cache.take(b"r", encode_state(other))
    assert again == other and again is not state


def test_decoded_states_keeps_the_most_recently_put_up_to_its_capacity() -> None:
    cache = DecodedStates("steps", capacity=2)
    states = {key: StepHealthState(run_id=key.decode()) for key in (b"a", b"b", b"c")}
    data = {key: encode_state(s) for key, s in states.items()}
    cache.put(b"a", data[b"a"], states[b"a"])
    cache.put(b"b", data[b"b"], states[b"b"])
    cache.put(b"a", data[b"a"], states[b"a"])  # a is now the most recent
    cache.put(b"c", data[b"c"], states[b"c"])  # b goes
    assert len(cache) == 2
    assert cache.take(b"a", data[b"a"]) is states[b"a"]
    assert cache.take(b"b", data[b"b"]) is not states[b"b"]  # decoded anew


def test_folding_through_decoded_states_writes_what_decoding_every_round_writes() -> None:
    # The worker's loop: take (cache), fold a round, write the bytes and put the state.
    # A round folded and dropped (not applied: a failed write, a rebalance) leaves the
    # version it started from behind a newer one; put back, the next fold from it must
    # reroot and give what a fresh decode gives.
    rounds = _liveness_rounds(world=8, rounds=12, per_round=3)
    table: dict[bytes, bytes] = {}
    cache = DecodedStates("liveness", capacity=4)
    fresh: bytes | None = None
    offset = 0
    for i, events in enumerate(rounds):
        raw = table.get(b"r")
        before = None if raw is None else cache.take(b"r", raw)
        if i % 4 == 3 and raw is not None and before is not None:
            fold_heartbeats(events, CFG, before, offset)  # folded, never written
            cache.put(b"r", raw, before)
            before = cache.take(b"r", raw)
        state, _ = fold_heartbeats(events, CFG, before, offset)
        assert state is not None
        table[b"r"] = encode_state(state)
        cache.put(b"r", table[b"r"], state)
        decoded = None if fresh is None else decode_state("liveness", fresh)
        reference, _ = fold_heartbeats(events, CFG, decoded, offset)  # type: ignore[arg-type]
        fresh = encode_state(reference)  # type: ignore[arg-type]
        assert table[b"r"] == fresh, f"round {i}"
        offset += len(events)


def test_a_layout1_step_state_decodes_with_its_detector_fields_moved() -> None:
    # data/steps_state_layout1.msgpack was encoded by the reducer before the detector split
    # (commit 26165e0) after exactly these events; folding them now gives the same state.
    old = (Path(__file__).parent / "data" / "steps_state_layout1.msgpack").read_bytes()
    assert b"nonfinite_loss_run" in old
    losses = healthy_losses(80, seed=3)
    events: list[RunStarted | StepCompleted] = [started(vocab_size=50257)]
    events += [step(i, 3.0 + losses[i], grad=1.0 + 0.01 * (i % 5)) for i in range(1, 41)]
    events += [step(31, 3.0 + losses[31], grad=1.0, restart_from=30)]
    events += [step(i, 3.0 + losses[i], grad=1.0 + 0.01 * (i % 5)) for i in range(32, 61)]
    events += [step(61, 50.0, grad=1.0), step(62, 3.0 + losses[62], grad=float("nan"))]
    now, _ = fold_steps(events, DetectorConfig())
    decoded = decode_state("steps", old)
    assert isinstance(decoded, StepHealthState) and now is not None
    assert encode_state(decoded) == encode_state(now)
    assert decoded.nonfinite.grad_run == 1 and decoded.restarts[0].checked_steps == 20
    assert decoded.loss_spike.starts == (61,)
