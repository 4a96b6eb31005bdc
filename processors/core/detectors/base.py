"""What a step detector is: a fold over one StepCompleted with its own small frozen state.

Each detector of the step-health reducer (`processors.core.steps`) owns one field of
`StepHealthState` and two pure functions over that field's value:

* ``fold(facts, state) -> state``: judge the step described by ``facts`` and return the
  detector's new state (the same object when nothing changed); verdicts go to
  ``facts.emit``, in the order the registry lists the detectors.
* ``reset(state, from_step) -> state``: the run was rolled back to ``from_step`` (a resume)
  or restarted by a new gang (RunStarted, ``from_step`` the last step): streaks end.

`processors.core.detectors.registry.STEP_DETECTORS` lists them; ``fold_step`` runs them in
that order, so verdict order is the list's order.

A liveness detector (`LivenessDetector`) is the same idea for the heartbeats topic: its
state is a few named fields of `processors.core.liveness_state.LivenessState`, its
``heartbeat`` fold runs on every heartbeat of a live run after the reducer's own last-seen
bookkeeping (in the order of `processors.core.detectors.registry.LIVENESS_DETECTORS`,
writing its fields' new values into the `processors.core.liveness_facts.HeartbeatFacts`,
only when they changed: a write costs far more than a read), and ``events`` names the other
event types it alone folds (a Tick, a RankExited, a RunStarted or RunEnded).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from runwatch.processors.core.step_checks import Emitter

if TYPE_CHECKING:
    from runwatch.processors.core.config import DetectorConfig
    from runwatch.processors.core.liveness_facts import HeartbeatFacts
    from runwatch.processors.core.liveness_state import LivenessState
    from runwatch.processors.core.step_state import StepHealthState
    from runwatch.schemas.events import AnomalyDetected, Provenance, StepCompleted

S = TypeVar("S")


class StepFacts(Emitter):
    """What every detector may read about the step being folded, and where it emits.

    One per step. It is the step's `Emitter` (``facts.emit(...)``, ``facts.emit_episode``,
    ``facts.emit_replica``; ``facts.out`` collects the verdicts) with the step's values
    classified once for every detector. The baselines are as they stood before this step.
    Two fields are written by one detector for the ones after it: ``broke`` (the restart
    check found a discontinuity at this step: the loss spike detector opens no episode) and
    ``loss_start`` (start step of the latest loss spike episode, -1: none; the grad-norm
    detector asks whether the loss followed).

    Attributes:
        info: What the run announced.
        loss: The step's loss.
        loss_ok: The loss is finite.
        grad: The step's grad norm, if reported.
        grad_ok: The grad norm is reported and finite.
        usable_grad: The grad norm when finite and positive (judged in log space), else None.
        loss_base: The loss baseline before this step.
        grad_base: The ln(grad norm) baseline before this step.
        broke: The restart check broke at this step.
        loss_start: Start step of the latest loss spike episode (-1: none).
    """

    event: StepCompleted

    __slots__ = (
        "broke",
        "grad",
        "grad_base",
        "grad_ok",
        "info",
        "loss",
        "loss_base",
        "loss_ok",
        "loss_start",
        "usable_grad",
    )

    def __init__(
        self,
        state: StepHealthState,
        event: StepCompleted,
        source: Provenance,
        cfg: DetectorConfig,
        out: list[AnomalyDetected],
    ) -> None:
        """Facts of ``event`` folded into ``state``; verdicts are appended to ``out``."""
        self.state = state
        self.event = event
        self.step = event.step
        self.source = source
        self.cfg = cfg
        self.out = out
        self.info = state.info
        loss = event.loss
        self.loss = loss
        self.loss_ok = math.isfinite(loss)
        grad = event.grad_norm
        self.grad = grad
        self.grad_ok = grad is not None and math.isfinite(grad)
        self.usable_grad = grad if self.grad_ok and grad > 0.0 else None  # type: ignore[operator]
        self.loss_base = state.loss
        self.grad_base = state.grad
        self.broke = False
        self.loss_start = -1


@dataclass(frozen=True, slots=True)
class StepDetector(Generic[S]):
    """One detector of the step-health reducer.

    Attributes:
        name: Its name (docs and errors).
        field: The `StepHealthState` field holding its state.
        fold: ``(facts, state) -> state`` for one StepCompleted.
        reset: ``(state, from_step) -> state`` at a resume or a new gang.
    """

    name: str
    field: str
    fold: Callable[[StepFacts, S], S]
    reset: Callable[[S, int], S]


AnyStepDetector = StepDetector[Any]
"""A detector of any state type (the registry's element)."""

LivenessHandler = Callable[
    ["LivenessState", Any, "Provenance", "DetectorConfig"],
    "tuple[LivenessState, list[AnomalyDetected]]",
]
"""``(state, event, source, cfg) -> (state, verdicts)`` for one event type other than Heartbeat."""


@dataclass(frozen=True, slots=True)
class LivenessDetector:
    """One detector of the liveness reducer.

    Attributes:
        name: Its name (docs and errors).
        fields: The `LivenessState` fields that hold its state (no other detector's fold
            writes them; later ones may read their new values from the facts).
        heartbeat: ``(facts) -> None`` for each heartbeat of a live run, or None.
        events: Event type -> its handler, for the event types this detector alone folds
            (each type belongs to one detector).
    """

    name: str
    fields: tuple[str, ...]
    heartbeat: Callable[[HeartbeatFacts], None] | None = None
    events: tuple[tuple[type, LivenessHandler], ...] = ()


__all__ = [
    "AnyStepDetector",
    "LivenessDetector",
    "LivenessHandler",
    "StepDetector",
    "StepFacts",
]
