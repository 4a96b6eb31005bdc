"""`fold_chunks`: the batch path's chunked fold is the one fold, cut where verdicts go out.

The batch path folds a round in chunks and sends each chunk's outputs before folding the
next (a verdict then waits for its chunk, not the whole round). These tests hold the
chunked fold to the whole one on the same records: the same verdicts in the same order,
the same dead letters, the same encoded states, whatever the chunk size, with packs,
Ticks fanning out to runs only an earlier chunk named, a run already in the table and
one that dies half-way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from runwatch.processors.core import config as config_module
from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.state_codec import decode_state, encode_state
from runwatch.processors.pipeline import BatchResult, fold_batch, fold_chunks
from runwatch.schemas.events import Event, EventPack, Provenance, RunStarted
from runwatch.schemas.records import Admitted, Decoded
from tests.unit.core.factories import S, ended, hb, healthy_losses, started, step, tick

CFG = with_overrides(DetectorConfig(), {"rank_heartbeat_threshold": 3, "dead_rank_timeout_s": 2})


def items_of(events: list[Event], topic: str, first: int = 0) -> list[Decoded]:
    return [
        Decoded(Provenance(topic=topic, partition=0, offset=first + i), e)
        for i, e in enumerate(events)
    ]


def heartbeat_round() -> tuple[list[Decoded], list[Decoded]]:
    """(stored earlier, this round): run ``a`` in the table; ``b`` starts in this round and
    its rank 2 falls silent; Ticks come after both, packs of several sizes."""
    earlier: list[Event] = [started("a", world_size=4)]
    earlier += [hb(r, 1, S + r, run="a") for r in range(4)]
    now: list[Event] = [started("b", ts_ns=S, world_size=4)]
    for n in range(2, 14):
        ts = n * S
        now.append(
            EventPack(run_id="a", ts_ns=ts, events=tuple(hb(r, n, ts, run="a") for r in range(4)))
        )
        beats = [hb(r, n, ts + r, run="b") for r in range(4) if not (r == 2 and n >= 5)]
        now.extend(beats[:2])
        now.append(EventPack(run_id="b", ts_ns=ts + 3, events=tuple(beats[2:])))
        now.append(tick(ts + S // 2))
    first = items_of(earlier, "runwatch.heartbeats")
    rest = items_of(now, "runwatch.heartbeats", first=100)
    return first, rest


def step_round() -> list[Decoded]:
    losses = healthy_losses(80)
    losses[60] = 9.0  # a loss spike, late in the round
    events: list[Event] = [started("s")]
    events += [step(i + 1, x, run="s") for i, x in enumerate(losses)]
    return items_of(events, "runwatch.steps")


def whole_and_chunked(
    role: str,
    items: list[Decoded],
    load: Callable[[str], object],
    runs: Callable[[int], Iterable[str]],
    chunk_events: int,
) -> tuple[BatchResult, list[BatchResult]]:
    whole = fold_batch(role, items, load, runs, CFG)
    chunks = list(fold_chunks(role, items, load, runs, CFG, chunk_events))
    return whole, chunks


@pytest.mark.parametrize("chunk_events", [1, 2, 3, 7, 50, 10_000])
def test_heartbeats_folded_in_chunks_are_the_whole_fold(chunk_events: int) -> None:
    earlier, now = heartbeat_round()
    stored = fold_batch("heartbeats", earlier, lambda _: None, lambda _: (), CFG)
    table = dict(stored.states)
    whole, chunks = whole_and_chunked(
        "heartbeats", now, table.get, lambda p: sorted(table), chunk_events
    )
    assert any(o.kind == "dead_rank" for o in whole.outputs)  # type: ignore[attr-defined]
    assert [o for c in chunks for o in c.outputs] == whole.outputs
    assert [d for c in chunks for d in c.dead] == whole.dead
    assert chunks[-1].encoded == whole.encoded
    if chunk_events < 10_000:
        assert len(chunks) > 1


@pytest.mark.parametrize("chunk_events", [1, 5, 64, 10_000])
def test_steps_folded_in_chunks_are_the_whole_fold(chunk_events: int) -> None:
    items = step_round()
    whole, chunks = whole_and_chunked("steps", items, lambda _: None, lambda _: (), chunk_events)
    assert [o.kind for o in whole.outputs] == ["loss_spike"]  # type: ignore[attr-defined]
    assert [o for c in chunks for o in c.outputs] == whole.outputs
    assert chunks[-1].encoded == whole.encoded


def test_a_chunk_ends_after_the_pack_that_fills_it() -> None:
    _, now = heartbeat_round()
    sizes = [
        sum(len(e.events) if isinstance(e, EventPack) else 1 for _, e in chunk)
        for chunk in _slices(now, 4)
    ]
    assert all(size >= 4 for size in sizes[:-1]) and all(size < 4 + 4 for size in sizes)
    assert sum(sizes) == sum(len(e.events) if isinstance(e, EventPack) else 1 for _, e in now)


def _slices(items: list[Decoded], budget: int) -> list[list[Decoded]]:
    from runwatch.processors.pipeline import _chunks

    return [list(c) for c in _chunks(Admitted.of(items), budget)]


def test_a_run_left_out_of_encoded_holds_the_very_state_load_gave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (`config.RUN_THRESHOLD_BOUNDS` keeps every run from an unstorable state; lifted here.)
    monkeypatch.setattr(config_module, "RUN_THRESHOLD_BOUNDS", {})
    # The worker relies on it (`_Agent.absorb`): a run the fold touched but did not change
    # (an ended run a Tick reached; a run whose only record was dead-lettered) keeps the
    # state object it was loaded with, so that object still stands for the stored bytes.
    hostile = RunStarted(
        run_id="r", ts_ns=5, world_size=2, thresholds={"rank_heartbeat_threshold": 1e300}
    )
    earlier: list[Event] = [
        started("r", ts_ns=1, world_size=2),
        hb(0, 1, 2, run="r"),
        hostile,
        started("e", ts_ns=1, world_size=2),
        ended("e", ts_ns=3),
    ]
    stored = fold_batch(
        "heartbeats", items_of(earlier, "runwatch.heartbeats"), lambda _: None, lambda _: (), CFG
    )
    table = {run: encode_state(state) for run, state in stored.states.items()}
    loaded: dict[str, object] = {}

    def load(run_id: str) -> object:
        state = loaded[run_id] = decode_state("liveness", table[run_id])
        return state

    now = [
        *items_of([hb(1, 1, 6, run="r")], "runwatch.heartbeats", first=100),
        Decoded(Provenance(topic="runwatch.heartbeats", partition=1, offset=7), tick(4 * S, 1)),
    ]
    result = fold_batch("heartbeats", now, load, lambda p: ["e"] if p == 1 else ["r"], CFG)
    assert [d.stage for d in result.dead] and {d.run_id for d in result.dead} == {"r"}
    unchanged = set(result.states) - set(result.encoded)
    assert unchanged == {"r", "e"}
    for run_id in unchanged:
        assert result.states[run_id] is loaded[run_id]
