"""Spike episodes judged by what happens next (processors/core/episodes.py through fold_step)."""

from __future__ import annotations

import msgspec
import pytest

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.state_codec import decode_state, encode_state
from runwatch.processors.core.steps import StepHealthState, fold_step
from runwatch.schemas.codec import encode
from runwatch.schemas.events import AnomalyDetected, RunEnded, RunStarted, StepCompleted
from tests.unit.core.factories import ended, fold_steps, healthy_losses, src, started, step

CFG = DetectorConfig()
NO_CUSUM = DetectorConfig(loss_shift_h=0.0)

Event = RunStarted | StepCompleted | RunEnded


def curve(n: int = 120, at: dict[int, float] | None = None, seed: int = 3) -> list[float]:
    """A late, flat pretraining loss (~1.0, noise 0.4 %) with relative changes at some steps."""
    out = [x - 1.0 for x in healthy_losses(n + 2000, seed=seed, noise=0.004)[2000:]]
    for s, factor in (at or {}).items():
        out[s - 1] *= factor
    return out


def events(losses: list[float], grads: list[float] | None = None) -> list[Event]:
    grads = grads or [1.0] * len(losses)
    return [started()] + [
        step(i + 1, x, grad=g) for i, (x, g) in enumerate(zip(losses, grads, strict=True))
    ]


def verdicts(evs: list[Event], cfg: DetectorConfig = CFG) -> list[AnomalyDetected]:
    return fold_steps(evs, cfg)[1]


def test_a_one_step_spike_back_at_once_is_one_info_verdict_about_its_first_step() -> None:
    (v,) = verdicts(events(curve(at={60: 1.2})))
    assert (v.kind, v.severity, v.step, v.recovered) == ("loss_spike", "info", 60, True)
    assert (v.peak_step, v.duration_steps, v.decided_step) == (60, 2, 61)
    assert v.source == src(61), "emitted by the step that decided it"
    assert v.value is not None and v.baseline is not None and v.value > 1.15 * v.baseline


def test_a_two_step_spike_that_comes_back_is_still_info() -> None:
    (v,) = verdicts(events(curve(at={60: 1.25, 61: 1.2})), NO_CUSUM)
    assert (v.severity, v.recovered, v.peak_step, v.decided_step) == ("info", True, 60, 62)


@pytest.mark.parametrize(
    ("at", "cfg", "decided", "severity", "why"),
    [
        pytest.param({60: 3.0}, CFG, 60, "warning", "magnitude floor", id="rule1-magnitude"),
        pytest.param(
            {60: 1.2, 61: 1.25}, NO_CUSUM, 61, "warning", "still rising", id="rule4-rising"
        ),
        pytest.param(
            {60: 1.3, 61: 1.25, 62: 1.22, 63: 1.2},
            NO_CUSUM,
            63,
            "warning",
            "not back within",
            id="rule5-stays-up",
        ),
    ],
)
def test_a_spike_pages_by_what_happens_next(
    at: dict[int, float], cfg: DetectorConfig, decided: int, severity: str, why: str
) -> None:
    (v,) = verdicts(events(curve(at=at)), cfg)
    assert (v.kind, v.step, v.decided_step, v.severity) == ("loss_spike", 60, decided, severity)
    assert v.recovered is False and why in v.detail


def test_a_gradual_rise_opens_a_cusum_episode_judged_by_what_follows() -> None:
    rising = curve(n=200)
    for i in range(100, 200):  # +3 sigma a step: never a one-step spike
        rising[i] += 0.012
    (v,) = verdicts(events(rising))
    assert (v.kind, v.severity, v.recovered) == ("loss_spike", "warning", False)
    assert 101 < v.step <= 110 and "sustained rise" in v.detail
    assert v.decided_step == v.step + CFG.spike_recover_steps
    assert v.threshold == CFG.loss_shift_h and v.z is not None and v.z > CFG.loss_shift_h

    faded = curve(n=200)
    for i in range(100, 200):  # the same rise, back under the median once it crossed
        faded[i] += 0.012 if i < v.step else -0.012
    (w,) = verdicts(events(faded))
    assert (w.step, w.severity, w.recovered, w.decided_step) == (v.step, "info", False, v.step + 1)
    assert "fell back" in w.detail


def test_the_third_spike_within_the_repeat_window_pages_when_it_starts() -> None:
    got = verdicts(events(curve(at={40: 1.2, 60: 1.2, 80: 1.2})))
    assert [(v.step, v.severity, v.decided_step) for v in got] == [
        (40, "info", 41),
        (60, "info", 61),
        (80, "warning", 80),
    ]
    assert "repeats" in got[-1].detail
    spread = verdicts(events(curve(n=200, at={40: 1.2, 100: 1.2, 160: 1.2})))
    assert [v.severity for v in spread] == ["info", "info", "info"]


def test_a_lone_grad_norm_spike_is_info_and_one_the_loss_follows_pages() -> None:
    losses, grads = curve(), [1.0 + 0.01 * (i % 3) for i in range(120)]
    grads[59] = 10.0
    (lone,) = verdicts(events(losses, grads))
    assert (lone.kind, lone.severity, lone.step) == ("grad_norm_spike", "info", 60)
    assert lone.decided_step == 60 + CFG.grad_follow_steps and "did not follow" in lone.detail

    followed = verdicts(events(curve(at={62: 1.2}), grads))
    assert [(v.kind, v.severity, v.step, v.decided_step) for v in followed] == [
        ("grad_norm_spike", "warning", 60, 62),
        ("loss_spike", "info", 62, 63),
    ]
    same_step = verdicts(events(curve(at={60: 1.2}), grads))
    assert [(v.kind, v.severity, v.decided_step) for v in same_step] == [
        ("grad_norm_spike", "warning", 60),
        ("loss_spike", "info", 61),
    ]


def test_an_open_episode_is_decided_as_interrupted_by_the_run_end_and_by_a_resume() -> None:
    evs = events(curve(n=60, at={60: 1.2}))
    state, got = fold_steps([*evs, ended(ts_ns=10**12)], CFG)
    (v,) = got
    assert (v.severity, v.recovered, v.decided_step) == ("info", False, 60)
    assert v.source == src(len(evs)), "emitted by the RunEnded"
    assert state is not None and state.loss_spike.episode is None

    resumed = [*evs, step(58, 1.0, restart_from=57)]
    state, got = fold_steps(resumed, CFG)
    (v,) = got
    assert (v.step, v.severity, v.recovered) == (60, "info", False)
    assert "resumed" in v.detail and state is not None and state.attempt == 1


def test_nonfinite_and_divergence_stay_critical_next_to_an_open_episode() -> None:
    losses = curve(at={60: 1.2})
    losses[60] = float("nan")
    got = verdicts(events(losses))
    assert [(v.kind, v.severity) for v in got] == [
        ("nonfinite_loss", "critical"),
        ("loss_spike", "info"),
    ]


def _fold_with_restarts(evs: list[Event], cut_every: int) -> list[AnomalyDetected]:
    """Fold, but encode and decode the state every ``cut_every`` events (a processor restart)."""
    state: StepHealthState | None = None
    out: list[AnomalyDetected] = []
    for i, event in enumerate(evs):
        if state is not None and i % cut_every == 0:
            decoded = decode_state(StepHealthState, encode_state(state))
            assert isinstance(decoded, StepHealthState)
            state = decoded
        state, got = fold_step(state, event, src(i), CFG)
        out += got
    return out


def test_episode_verdicts_are_byte_identical_across_replays_and_restarts() -> None:
    at = {40: 1.2, 60: 1.3, 61: 1.28, 62: 1.27, 63: 1.26, 90: 3.0, 100: 1.2}
    grads = [1.0 + 0.01 * (i % 3) for i in range(120)]
    grads[69] = 10.0
    evs = events(curve(at=at), grads)
    once = verdicts(evs)
    assert len({v.verdict_id for v in once}) == len(once) >= 5
    assert {v.severity for v in once} == {"info", "warning"}
    for cut in (1, 2, 7, 61):
        again = _fold_with_restarts(evs, cut)
        assert [encode(v) for v in again] == [encode(v) for v in once]


def test_the_config_hash_names_the_episode_settings() -> None:
    (a,) = verdicts(events(curve(at={60: 1.2})))
    (b,) = verdicts(events(curve(at={60: 1.2})), DetectorConfig(spike_recover_steps=4))
    assert a.verdict_id != b.verdict_id and a.config_hash != b.config_hash
    assert msgspec.structs.replace(a, verdict_id="", config_hash="") == msgspec.structs.replace(
        b, verdict_id="", config_hash=""
    )
