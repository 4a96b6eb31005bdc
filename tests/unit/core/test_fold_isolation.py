"""Per-record isolation in the shared fold: a record that breaks its fold or its state's
encoding is a dead letter, the run's state stays as it was, the rest goes on, and live
batches and a whole-log replay dead-letter the same records."""

from __future__ import annotations

import importlib

import pytest

from runwatch.processors.core import config as config_module
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.replay import Replayer, replay
from runwatch.processors.core.state_codec import decode_state, encode_state
from runwatch.processors.pipeline import fold_batch
from runwatch.schemas.events import Heartbeat, Provenance, RunStarted, StepCompleted, Tick
from runwatch.schemas.records import Decoded

CFG = DetectorConfig()
# the module (``processors.core`` re-exports a function of the same name)
replay_module = importlib.import_module("runwatch.processors.core.replay")


def _steps(run: str, n: int, spike_at: int) -> list[Decoded]:
    events = [RunStarted(run_id=run, ts_ns=1, world_size=2)] + [
        StepCompleted(
            run_id=run,
            ts_ns=10 + s,
            step=s,
            loss=9.0 if s == spike_at else 4.0 - 0.01 * s + 0.001 * (s % 3),
            step_time_s=0.1,
        )
        for s in range(1, n + 1)
    ]
    return [
        Decoded(Provenance(topic="t.steps", partition=0, offset=i), e) for i, e in enumerate(events)
    ]


def test_a_state_that_cannot_be_encoded_dead_letters_its_record_and_keeps_the_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A real one: the run announces a threshold the liveness state turns into an int
    # past int64, so the first heartbeat after it yields a state msgpack cannot store.
    # (`config.RUN_THRESHOLD_BOUNDS` keeps every run from this; lifted here.)
    monkeypatch.setattr(config_module, "RUN_THRESHOLD_BOUNDS", {})
    hostile = RunStarted(
        run_id="r", ts_ns=5, world_size=2, thresholds={"rank_heartbeat_threshold": 1e300}
    )
    events = [
        RunStarted(run_id="r", ts_ns=1, world_size=2),
        Heartbeat(run_id="r", ts_ns=2, rank=0, step=1),
        hostile,
        Heartbeat(run_id="r", ts_ns=3, rank=1, step=1),
    ]
    records = [
        ("heartbeats", Provenance(topic="t.hb", partition=0, offset=i), e)
        for i, e in enumerate(events)
    ]
    before = Replayer(CFG).feed(records[:3])
    after = Replayer(CFG).feed(records)
    assert [(d.stage, d.source.offset) for d in after.dead_letters] == [("encode", 3)]
    assert "OverflowError" in after.dead_letters[0].reason
    assert after.dead_letters[0].payload  # the record, re-encoded
    # the state is the one from before the record, and it is storable
    assert after.liveness["r"] == before.liveness["r"]
    assert after.liveness["r"].last_offset == 2
    assert after.encoded["liveness"]["r"] == encode_state(after.liveness["r"])


def test_a_fold_that_raises_dead_letters_the_record_and_the_batch_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = replay_module.fold_step

    def fragile(state, event, source, cfg):  # type: ignore[no-untyped-def]
        if isinstance(event, StepCompleted) and event.step in (7, 8):
            raise ZeroDivisionError("boom")
        return real(state, event, source, cfg)

    monkeypatch.setattr(replay_module, "fold_step", fragile)
    items = _steps("r", 40, spike_at=35)
    result = fold_batch("steps", items, lambda _: None, lambda _: (), CFG)
    assert [(d.stage, d.source.offset, d.run_id) for d in result.dead] == [
        ("fold", 7, "r"),
        ("fold", 8, "r"),
    ]
    assert all(d.reason == "fold: ZeroDivisionError: boom" for d in result.dead)
    assert result.states["r"].steps_observed == 38  # 40 steps, two dead-lettered
    assert [(a.kind, a.step) for a in result.outputs] == [("loss_spike", 35)]
    # live batches of any size and one replay of the whole log agree, dead letters included
    whole = replay([("steps", s, e) for s, e in items], CFG)
    assert [d.source.offset for d in whole.dead_letters] == [7, 8]
    stored: dict[str, bytes] = {}
    dead, outputs = [], []
    for start in range(0, len(items), 6):
        batch = fold_batch(
            "steps",
            items[start : start + 6],
            lambda run: decode_state("steps", stored[run]) if run in stored else None,
            lambda _: (),
            CFG,
        )
        stored.update(batch.encoded)
        dead += batch.dead
        outputs += batch.outputs
    assert dead == whole.dead_letters
    assert outputs == whole.anomalies
    assert stored["r"] == encode_state(whole.steps["r"])


def test_a_tick_whose_fold_fails_for_one_run_still_ages_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = replay_module.fold_liveness

    def fragile(state, event, source, cfg):  # type: ignore[no-untyped-def]
        if isinstance(event, Tick) and state is not None and state.run_id == "a":
            raise ValueError("cannot age a")
        return real(state, event, source, cfg)

    monkeypatch.setattr(replay_module, "fold_liveness", fragile)
    cfg = DetectorConfig(hang_timeout_s=1.0, dead_rank_timeout_s=1.0)
    records = [
        ("heartbeats", Provenance(topic="t.hb", partition=0, offset=i), e)
        for i, e in enumerate(
            [
                RunStarted(run_id="a", ts_ns=1, world_size=1),
                RunStarted(run_id="b", ts_ns=1, world_size=1),
                Heartbeat(run_id="a", ts_ns=2, rank=0, step=1),
                Heartbeat(run_id="b", ts_ns=2, rank=0, step=1),
                Tick(run_id="*", ts_ns=10_000_000_000, partition=0),
            ]
        )
    ]
    result = replay(records, cfg)
    assert [(d.stage, d.run_id, d.source.offset) for d in result.dead_letters] == [("fold", "a", 4)]
    assert {a.run_id for a in result.anomalies} == {"b"}
