"""The step detectors as units: the registry's order, unchanged states, resets."""

from __future__ import annotations

import math

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.detectors.nonfinite import NonfiniteState
from runwatch.processors.core.detectors.registry import STEP_DETECTORS
from runwatch.processors.core.detectors.restart import CONTINUITY
from runwatch.processors.core.detectors.spikes import GRAD_SPIKE, LOSS_SPIKE
from runwatch.processors.core.step_state import StepHealthState
from runwatch.processors.core.steps import fold_step
from tests.unit.core.factories import fold_steps, healthy_losses, kinds, src, started, step

CFG = DetectorConfig()


def _healthy_run(n: int) -> StepHealthState:
    losses = healthy_losses(n + 1, seed=5)
    events = [started()] + [
        step(i, 3.0 + losses[i], grad=1.0 + 0.01 * (i % 3)) for i in range(1, n + 1)
    ]
    state, verdicts = fold_steps(events, CFG)
    assert state is not None and verdicts == []
    return state


def test_detectors_that_read_anothers_facts_come_after_it() -> None:
    order = list(STEP_DETECTORS)
    assert order.index(CONTINUITY) < order.index(LOSS_SPIKE) < order.index(GRAD_SPIKE)


def test_a_healthy_step_hands_back_the_untouched_detector_states() -> None:
    state = _healthy_run(60)
    new, verdicts = fold_step(state, step(61, state.last_loss or 3.0, grad=1.0), src(61), CFG)
    assert verdicts == [] and new.last_step == 61
    for name in ("nonfinite", "continuity", "grad_spike", "replicas"):
        assert getattr(new, name) is getattr(state, name), name


def test_resetting_an_empty_state_changes_nothing() -> None:
    empty = StepHealthState(run_id="r")
    for d in STEP_DETECTORS:
        assert d.reset(getattr(empty, d.field), 10) == getattr(empty, d.field), d.name


def test_a_resume_ends_every_streak_and_keeps_the_best_loss() -> None:
    state = _healthy_run(40)
    best = state.best_loss
    state, verdicts = fold_steps([step(41, math.nan), step(42, math.nan)], CFG, state, 41)
    assert kinds(verdicts) == ["nonfinite_loss"] and state is not None
    assert state.nonfinite.loss_run == 2
    state, verdicts = fold_steps([step(31, math.nan, restart_from=30)], CFG, state, 43)
    assert state is not None and state.best_loss == best
    assert kinds(verdicts) == ["nonfinite_loss"], "the resume ended the streak: a new one opens"
    assert state.nonfinite == NonfiniteState(loss_run=1)
