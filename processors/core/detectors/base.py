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

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec

from runwatch.processors.core.baseline import RollingBaseline
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.episodes import Decision
from runwatch.processors.core.runinfo import RunInfo
from runwatch.processors.core.step_checks import Emitter
from runwatch.processors.core.verdicts import EpisodeFields
from runwatch.schemas.events import (
    AnomalyDetected,
    AnomalyKind,
    Provenance,
    Severity,
    StepCompleted,
)

if TYPE_CHECKING:
    from runwatch.processors.core.liveness_facts import HeartbeatFacts
    from runwatch.processors.core.liveness_state import LivenessState
    from runwatch.processors.core.step_state import StepHealthState

S = TypeVar("S")


class StepFacts(msgspec.Struct, gc=False):
    """What every detector may read about the step being folded, and where it emits.

    One per step, built by the reducer positionally (one C call: a Python ``__init__``
    writing its attributes one by one cost more than any detector): the step's values
    classified once for every detector, and the step's verdicts (``facts.emit(...)``,
    ``facts.emit_episode``, ``facts.emit_replica``, as an `Emitter`: it makes one on first
    use; ``facts.out`` collects the verdicts). The baselines are as they stood before this
    step. Two fields are written by one detector for the ones after it, only when they
    change (a write costs about ten reads): ``broke`` (the restart check found a
    discontinuity at this step: the loss spike detector opens no episode) and
    ``loss_start`` (start step of the latest loss spike episode, -1: none; the grad-norm
    detector asks whether the loss followed).

    Attributes:
        state: The run's state before the step.
        event: The step.
        step: Its number.
        source: Its log position.
        cfg: The configuration it is judged under.
        out: The verdicts (the reducer's list: a resume's closing verdicts come first).
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
        emitter_: The `Emitter` once a detector emitted (None before).
    """

    state: StepHealthState
    event: StepCompleted
    step: int
    source: Provenance
    cfg: DetectorConfig
    out: list[AnomalyDetected]
    info: RunInfo
    loss: float
    loss_ok: bool
    grad: float | None
    grad_ok: bool
    usable_grad: float | None
    loss_base: RollingBaseline
    grad_base: RollingBaseline
    broke: bool = False
    loss_start: int = -1
    emitter_: Emitter | None = None

    def emitter(self) -> Emitter:
        """The step's `Emitter`, appending to ``out`` (made on first use)."""
        em = self.emitter_
        if em is None:
            em = self.emitter_ = Emitter(self.state, self.event, self.source, self.cfg, self.out)
        return em

    def emit_episode(self, decision: Decision, label: str) -> None:
        """`Emitter.emit_episode`."""
        self.emitter().emit_episode(decision, label)

    def emit(
        self,
        kind: AnomalyKind,
        *,
        value: float | None,
        detail: str,
        baseline: float | None = None,
        scale: float | None = None,
        z: float | None = None,
        threshold: float | None = None,
        step: int | None = None,
        severity: Severity | None = None,
        episode: EpisodeFields | None = None,
    ) -> None:
        """`Emitter.emit`."""
        self.emitter().emit(
            kind,
            value=value,
            detail=detail,
            baseline=baseline,
            scale=scale,
            z=z,
            threshold=threshold,
            step=step,
            severity=severity,
            episode=episode,
        )

    def emit_replica(self, kind: AnomalyKind, replica_group: int | None, detail: str) -> None:
        """`Emitter.emit_replica`."""
        self.emitter().emit_replica(kind, replica_group, detail)


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
