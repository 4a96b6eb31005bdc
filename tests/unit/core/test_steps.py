"""Step health: tables of scenarios over fold_step."""

from __future__ import annotations

import math

import msgspec
import pytest

from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.detectors.registry import STEP_DETECTORS
from runwatch.processors.core.steps import StepHealthState, fold_step
from tests.unit.core.factories import (
    S,
    ended,
    fold_steps,
    healthy_losses,
    kinds,
    src,
    started,
    step,
)

CFG = DetectorConfig()
NAN, INF = math.nan, math.inf


def run(losses: list[float], grads: list[float | None] | None = None, **started_kw: object):  # type: ignore[no-untyped-def]
    grads = grads or [1.0] * len(losses)
    events = [started(**started_kw)] + [
        step(i + 1, loss, grad=g) for i, (loss, g) in enumerate(zip(losses, grads, strict=True))
    ]
    return fold_steps(events, CFG)


def base(n: int = 60) -> list[float]:
    return healthy_losses(n, seed=1)


def with_at(values: list[float], at: dict[int, float]) -> list[float]:
    out = list(values)
    for step_no, v in at.items():
        out[step_no - 1] = v
    return out


@pytest.mark.parametrize(
    ("losses", "expected"),
    [
        pytest.param(base(), [], id="healthy"),
        pytest.param(with_at(base(), {2: NAN}), [("nonfinite_loss", 2)], id="nan-in-warmup"),
        pytest.param(with_at(base(), {30: INF}), [("nonfinite_loss", 30)], id="inf"),
        pytest.param(
            with_at(base(), {30: NAN, 31: NAN, 32: NAN, 40: NAN}),
            [("nonfinite_loss", 30), ("nonfinite_loss", 40)],
            id="once-per-streak",
        ),
        pytest.param(with_at(base(), {30: 10.0}), [("loss_spike", 30)], id="spike"),
        pytest.param(with_at(base(), {5: 10.0}), [], id="spike-in-warmup-ignored"),
        pytest.param(with_at(base(), {30: -5.0}), [], id="drop-is-not-a-spike"),
        pytest.param(
            with_at(base(), {30: 10.0, 31: 10.0, 32: 10.0}),
            [("loss_spike", 30)],
            id="consecutive-spikes-once-per-streak",
        ),
        pytest.param(
            with_at(base(), {30: 10.0, 32: 10.0}),
            [("loss_spike", 30), ("loss_spike", 32)],
            id="separate-spikes",
        ),
    ],
)
def test_loss_table(losses: list[float], expected: list[tuple[str, int]]) -> None:
    _, verdicts = run(losses)
    assert [(v.kind, v.step) for v in verdicts] == expected


@pytest.mark.parametrize(
    ("grads", "skipped", "expected"),
    [
        pytest.param({30: NAN}, set(), [("nonfinite_grad_norm", 30)], id="nan-grad"),
        pytest.param({3: INF}, set(), [("nonfinite_grad_norm", 3)], id="inf-grad-warmup"),
        pytest.param({30: INF}, {30}, [], id="amp-overflow-skip-is-benign"),
        pytest.param({30: INF, 31: INF}, {30}, [("nonfinite_grad_norm", 31)], id="skip-then-real"),
        pytest.param({30: 50.0}, set(), [("grad_norm_spike", 30)], id="grad-spike"),
        pytest.param({30: None}, set(), [], id="grad-absent"),
    ],
)
def test_grad_table(
    grads: dict[int, float | None], skipped: set[int], expected: list[tuple[str, int]]
) -> None:
    losses = base()
    events = [started()] + [
        step(i, losses[i - 1], grad=grads.get(i, 1.0 + 0.01 * (i % 7)), skipped=i in skipped)
        for i in range(1, 61)
    ]
    state, verdicts = fold_steps(events, CFG)
    assert [(v.kind, v.step) for v in verdicts] == expected
    assert state is not None and state.skipped_steps == len(skipped)


@pytest.mark.parametrize(
    ("overrides", "started_kw", "at", "expected"),
    [
        pytest.param(
            {"max_loss": 20.0},
            {},
            {30: 25.0},
            ["loss_divergence", "loss_spike"],
            id="seed-002-ceiling",
        ),
        pytest.param(
            {"max_loss": 20.0}, {}, {3: 25.0}, ["loss_divergence"], id="ceiling-fires-in-warmup"
        ),
        pytest.param(
            {},
            {"vocab_size": 50257},
            {30: 22.0},
            ["loss_divergence", "loss_spike"],
            id="ceiling-from-vocab",
        ),
        pytest.param({}, {}, {30: 25.0}, ["loss_spike"], id="no-ceiling-without-vocab"),
    ],
)
def test_divergence_table(
    overrides: dict[str, float],
    started_kw: dict[str, object],
    at: dict[int, float],
    expected: list[str],
) -> None:
    cfg = with_overrides(CFG, overrides)
    events = [started(**started_kw)] + [
        step(i, v, grad=1.0) for i, v in enumerate(with_at(base(), at), start=1)
    ]
    _, verdicts = fold_steps(events, cfg)
    assert kinds(verdicts) == expected


def test_divergence_once_per_streak() -> None:
    cfg = with_overrides(CFG, {"max_loss": 20.0})
    losses = with_at(base(), {30: 25.0, 31: 26.0, 32: 27.0})
    _, verdicts = fold_steps([started()] + [step(i, v) for i, v in enumerate(losses, 1)], cfg)
    assert [(v.kind, v.step) for v in verdicts if v.kind == "loss_divergence"] == [
        ("loss_divergence", 30)
    ]


@pytest.mark.parametrize(
    ("losses", "expected_step"),
    [
        pytest.param(
            [2.0 + 0.01 * (i % 3) for i in range(40)] + [math.log(100)] * 25,
            60,
            id="collapse-after-learning",
        ),
        pytest.param(
            [math.log(100) + 0.01 * (i % 3) for i in range(65)],
            None,
            id="fresh-model-at-uniform-is-not-collapse",
        ),
        pytest.param(
            [2.0] * 40 + [math.log(100)] * 19 + [2.0] * 6, None, id="short-visit-is-not-collapse"
        ),
    ],
)
def test_collapse_table(losses: list[float], expected_step: int | None) -> None:
    _, verdicts = run(losses, vocab_size=100)
    got = [v.step for v in verdicts if v.kind == "loss_collapse"]
    assert got == ([] if expected_step is None else [expected_step])


def _resume_run(
    after: list[float], *, from_step: int = 100, crash_at: int = 120, pre: list[float] | None = None
) -> tuple[StepHealthState, list]:  # type: ignore[type-arg]
    pre = pre or healthy_losses(crash_at, seed=3, noise=0.02)
    events = [started()] + [step(i, pre[i - 1]) for i in range(1, crash_at + 1)]
    events.append(started(ts_ns=(crash_at + 5) * S, incarnation=1))
    for k, loss in enumerate(after):
        n = from_step + 1 + k
        events.append(
            step(n, loss, restart_from=from_step if k == 0 else None, ts_ns=(crash_at + 10 + k) * S)
        )
    state, verdicts = fold_steps(events, CFG)
    assert state is not None
    return state, verdicts


def test_good_resume_is_not_flagged() -> None:
    truth = healthy_losses(140, seed=3, noise=0.02)
    state, verdicts = _resume_run(truth[100:140])
    assert kinds(verdicts) == []
    assert state.continuity_ok
    assert state.restarts[-1].verdict == "ok" and state.restarts[-1].checked_steps == 20


def test_resume_with_a_jump_is_caught_on_its_first_step_as_discontinuity() -> None:
    truth = healthy_losses(140, seed=3, noise=0.02)
    after = [truth[100] + 1.0, *truth[101:140]]
    state, verdicts = _resume_run(after)
    assert [(v.kind, v.step, v.incarnation) for v in verdicts] == [
        ("restart_discontinuity", 101, 1)
    ]
    assert not state.continuity_ok and state.restarts[-1].verdict == "broken"


@pytest.mark.parametrize(
    ("drift_per_step", "caught_by"),
    [(0.02, 116), (0.05, 110), (0.1, 107), (0.3, 104)],
)
def test_dropped_optimizer_state_drift_is_caught(drift_per_step: float, caught_by: int) -> None:
    truth = healthy_losses(140, seed=3, noise=0.02)
    # Seed 001: same weights, so step 101 matches; later steps drift as Adam restarts.
    after = [truth[100 + k] + drift_per_step * k for k in range(40)]
    state, verdicts = _resume_run(after)
    found = [v for v in verdicts if v.kind == "restart_discontinuity"]
    assert len(found) == 1 and 102 <= found[0].step <= caught_by
    assert verdicts[0].kind == "restart_discontinuity"
    assert "first attempt" in found[0].detail
    assert not state.continuity_ok


@pytest.mark.parametrize(("resumed_level", "broken"), [(5.0, False), (6.0, True)])
def test_resume_is_judged_against_the_baseline_at_the_resumed_step_not_at_the_crash(
    resumed_level: float, broken: bool
) -> None:
    # After the checkpoint (60) the first attempt diverged (5 -> 9) until the crash (100).
    # Against the crash-time state a resume at 6.0 would look like an improvement; against
    # the baseline at step 60 it is a jump.
    pre = [5.0 + 0.01 * (i % 5) for i in range(60)] + [5.0 + 0.1 * i for i in range(40)]
    after = [resumed_level + 0.01 * (i % 5) for i in range(30)]
    state, verdicts = _resume_run(after, from_step=60, crash_at=100, pre=pre)
    assert ("restart_discontinuity" in kinds(verdicts)) is broken
    assert state.continuity_ok is not broken


def test_redone_steps_are_paired_with_their_first_attempt() -> None:
    truth = healthy_losses(140, seed=3, noise=0.02)
    state, _ = _resume_run(truth[100:140], crash_at=110)
    record = state.restarts[-1]
    assert (record.verdict, record.checked_steps, record.paired_steps) == ("ok", 20, 10)
    assert record.max_z is not None and record.max_z <= 1.0


def test_resume_after_a_divergence_is_not_judged_against_the_poisoned_attempt() -> None:
    truth = healthy_losses(140, seed=3, noise=0.02)
    pre = truth[:105] + [truth[k] + 0.5 * (k - 104) for k in range(105, 120)]
    state, verdicts = _resume_run(truth[100:140], pre=pre)
    assert "restart_discontinuity" not in kinds(verdicts)
    assert state.restarts[-1].verdict == "ok"


def test_resume_without_a_baseline_at_the_step_is_unchecked() -> None:
    state, verdicts = _resume_run([2.0] * 10, from_step=5, crash_at=8)
    assert state.restarts[-1].verdict == "unchecked"
    assert "restart_discontinuity" not in kinds(verdicts)


def test_steps_redone_after_a_rollback_are_not_double_counted() -> None:
    truth = healthy_losses(140, seed=3, noise=0.02)
    state, _ = _resume_run(truth[100:140])
    assert state.steps_observed == 120 + 40
    assert state.kept_steps == 140
    assert state.totals.time_s == pytest.approx(140 * 0.25)
    assert state.attempt == 1


def test_effective_training_time_ratio_counts_kept_steps_over_wall_time() -> None:
    state, _ = _resume_run([2.0] * 40)
    # wall: from step 1's start (0 s) to the last event (169 s); kept: 140 steps of 0.25 s.
    assert state.wall_time_s == pytest.approx(169.0)
    assert state.effective_training_time_ratio == pytest.approx(140 * 0.25 / 169.0)


def test_steps_seen_again_without_a_marker_roll_back_without_a_continuity_check() -> None:
    losses = healthy_losses(80, seed=2)
    events = [started()] + [step(i, losses[i - 1]) for i in range(1, 61)]
    events += [step(i, losses[i - 1], ts_ns=(100 + i) * S) for i in range(51, 81)]
    state, verdicts = fold_steps(events, CFG)
    assert state is not None and kinds(verdicts) == []
    assert state.kept_steps == 80 and state.steps_observed == 90
    assert not state.restarts[-1].marked and state.restarts[-1].verdict == "unchecked"


def test_redone_step_verdicts_get_new_ids() -> None:
    losses = with_at(healthy_losses(60, seed=2), {40: NAN})
    events = [started()] + [step(i, losses[i - 1]) for i in range(1, 46)]
    events += [step(i, losses[i - 1], ts_ns=(100 + i) * S) for i in range(36, 46)]
    _, verdicts = fold_steps(events, CFG)
    assert [(v.kind, v.step) for v in verdicts] == [("nonfinite_loss", 40)] * 2
    assert verdicts[0].verdict_id != verdicts[1].verdict_id


def test_offset_at_or_below_last_applied_is_skipped() -> None:
    state, _ = fold_steps([started()] + [step(i, 2.0 + 0.01 * i) for i in range(1, 30)], CFG)
    assert state is not None
    again, verdicts = fold_step(state, step(29, NAN), src(state.last_offset), CFG)
    assert again is state and verdicts == []


def test_run_thresholds_apply() -> None:
    _, verdicts = run(with_at(base(), {30: 10.0}), thresholds={"loss_z_thresh": 1e9})
    assert verdicts == []


def test_run_ended_records_status_and_keeps_state() -> None:
    state, _ = fold_steps([started(), step(1, 2.0), ended(ts_ns=5 * S, status="completed")], CFG)
    assert state is not None and state.info.status == "completed" and state.last_step == 1


def test_verdict_carries_provenance_log_time_and_identity() -> None:
    state, _ = fold_steps([started()] + [step(i, 2.0 + 0.01 * (i % 4)) for i in range(1, 30)], CFG)
    event = step(30, 50.0)
    _, (verdict,) = fold_step(state, event, src(77, "runwatch.steps", 3), CFG)
    assert verdict.source == src(77, "runwatch.steps", 3)
    assert verdict.ts_ns == event.ts_ns and verdict.seq == 77
    assert verdict.config_hash and verdict.verdict_id and verdict.incarnation == 0
    assert verdict.rank is None, "loss and grad norm are run-wide"


def test_every_registered_detector_owns_one_state_field() -> None:
    fields = [d.field for d in STEP_DETECTORS]
    assert len(set(fields)) == len(fields), "two detectors share a state field"
    assert set(fields) <= set(StepHealthState.__struct_fields__)
    assert len(StepHealthState.__struct_fields__) < 30, "detector state belongs in its field"


def test_fold_never_mutates_its_input() -> None:
    state, _ = fold_steps([started()] + [step(i, 2.0 + 0.01 * (i % 4)) for i in range(1, 30)], CFG)
    assert state is not None
    snapshot = msgspec.msgpack.encode(state)
    fold_step(state, step(30, 50.0, restart_from=20), src(1000), CFG)
    assert msgspec.msgpack.encode(state) == snapshot
