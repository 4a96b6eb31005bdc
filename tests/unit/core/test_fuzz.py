"""Arbitrary event sequences: the reducers never crash, and folding resumes from bytes."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.liveness import fold_liveness
from runwatch.processors.core.state_codec import decode_state, encode_state
from runwatch.processors.core.steps import fold_step
from runwatch.schemas.codec import encode
from runwatch.schemas.events import Heartbeat, RunEnded, RunStarted, StepCompleted, Tick
from tests.unit.core.factories import src

CFG = with_overrides(
    DetectorConfig(),
    {
        "loss_window": 8,
        "loss_min_periods": 3,
        "grad_window": 8,
        "grad_min_periods": 3,
        "history_steps": 64,
        "rank_heartbeat_threshold": 3,
        "straggler_steps": 2,
        "dead_rank_timeout_s": 5,
        "hang_timeout_s": 10,
        "startup_timeout_s": 20,
        "restart_check_steps": 3,
        "collapse_steps": 2,
    },
)
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0.0, max_value=20.0),
    st.sampled_from([0.0, math.log(50), 1e308, -1e308]),
)
step_events = st.one_of(
    st.builds(
        StepCompleted,
        run_id=st.just("r"),
        ts_ns=st.integers(0, 10**12),
        step=st.integers(0, 200),
        loss=floats,
        step_time_s=st.one_of(floats, st.just(0.25)),
        grad_norm=st.one_of(st.none(), floats),
        tokens=st.integers(0, 10**6),
        skipped=st.booleans(),
        restart_from_step=st.one_of(st.none(), st.none(), st.integers(0, 200)),
    ),
    st.builds(
        RunStarted,
        run_id=st.just("r"),
        ts_ns=st.integers(0, 10**12),
        world_size=st.integers(0, 4),
        vocab_size=st.one_of(st.none(), st.just(50)),
        incarnation=st.integers(0, 3),
        thresholds=st.sampled_from([{}, {"loss_z_thresh": 3.0}, {"bogus": 1.0}]),
    ),
    st.builds(
        RunEnded,
        run_id=st.just("r"),
        ts_ns=st.integers(0, 10**12),
        status=st.sampled_from(["completed", "failed", "stopped"]),
    ),
)
heartbeat_events = st.one_of(
    st.builds(
        Heartbeat,
        run_id=st.just("r"),
        ts_ns=st.integers(0, 10**11),
        rank=st.integers(0, 5),
        step=st.integers(0, 60),
        step_time_s=st.one_of(st.just(0.0), st.floats(0.01, 5.0)),
    ),
    st.builds(Tick, run_id=st.just("*"), ts_ns=st.integers(0, 10**11), partition=st.just(0)),
    st.builds(
        RunStarted,
        run_id=st.just("r"),
        ts_ns=st.integers(0, 10**11),
        world_size=st.integers(0, 5),
        incarnation=st.integers(0, 3),
    ),
    st.builds(
        RunEnded,
        run_id=st.just("r"),
        ts_ns=st.integers(0, 10**11),
        status=st.sampled_from(["completed", "stopped"]),
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(step_events, max_size=120), st.integers(0, 120))
def test_steps_fold_total_and_resumable_from_bytes(events: list, cut: int) -> None:  # type: ignore[type-arg]
    whole, out_whole = None, []
    for i, e in enumerate(events):
        whole, v = fold_step(whole, e, src(i), CFG)
        out_whole += v
    part, out_part = None, []
    for i, e in enumerate(events):
        if i == cut and part is not None:
            part = decode_state("steps", encode_state(part))  # type: ignore[assignment]
        part, v = fold_step(part, e, src(i), CFG)
        out_part += v
    assert [encode(v) for v in out_part] == [encode(v) for v in out_whole]
    if whole is not None:
        assert part is not None and encode_state(part) == encode_state(whole)
        assert whole.kept_steps >= 0 and whole.steps_observed == sum(
            isinstance(e, StepCompleted) for e in events
        )


@settings(max_examples=300, deadline=None)
@given(st.lists(heartbeat_events, max_size=150), st.integers(0, 150))
def test_liveness_fold_total_and_resumable_from_bytes(events: list, cut: int) -> None:  # type: ignore[type-arg]
    first = next((i for i, e in enumerate(events) if not isinstance(e, Tick)), len(events))
    events = events[first:]  # a Tick applies to known runs only
    whole, out_whole = None, []
    for i, e in enumerate(events):
        whole, v = fold_liveness(whole, e, src(i), CFG)
        out_whole += v
    part, out_part = None, []
    for i, e in enumerate(events):
        if i == cut and part is not None:
            part = decode_state("liveness", encode_state(part))  # type: ignore[assignment]
        part, v = fold_liveness(part, e, src(i), CFG)
        out_part += v
    assert [encode(v) for v in out_part] == [encode(v) for v in out_whole]
    if whole is not None:
        assert part is not None and encode_state(part) == encode_state(whole)
        assert len(set(whole.dead)) == len(whole.dead)
