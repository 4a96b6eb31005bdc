"""Every anomaly kind and what follows from it, in one table.

A verdict's kind (`schemas.events.AnomalyKind`, the wire vocabulary) decides how much it
matters, what the restart policy does about it, whether the controller records where the
ranks stood before it stops them, and on which chart the web view marks it. Those facts
live here, in `KINDS`, and every reader looks them up (`kind_spec`); nothing else spells
a list of kinds.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final, get_args

import msgspec

from runwatch.schemas.events import AnomalyKind, RestartAction, Severity


class Chart(enum.StrEnum):
    """The web view's chart a verdict of the kind is marked on."""

    LOSS = "loss"
    GRAD_NORM = "grad_norm"


class KindSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What one anomaly kind means and what runwatch does about it.

    Attributes:
        kind: The kind.
        severity: Its verdicts' severity unless a detector says otherwise (docs/core.md,
            "Severity"): a run that is not making progress or is wrong is critical; a
            loss that jumps or collapses, or a slow rank, warns; a grad-norm spike on its
            own is information.
        action: The restart the policy asks for (`RestartAction`); None: alert only.
        breaks_continuity: A verdict of the kind marks the run's continuity broken, and
            the policy issues no command for it (restarting again would loop).
        captures_stacks: Before the controller stops a gang for this kind, it records
            where each rank's Python stood (a hang or a dead rank: what were they doing?).
        chart: The chart the web view marks it on; None: no chart.
        summary: What it means, in one line (help texts, legends).
    """

    kind: AnomalyKind
    severity: Severity
    action: RestartAction | None = None
    breaks_continuity: bool = False
    captures_stacks: bool = False
    chart: Chart | None = None
    summary: str


KINDS: Final[Mapping[AnomalyKind, KindSpec]] = {
    spec.kind: spec
    for spec in (
        KindSpec(
            kind="nonfinite_loss",
            severity="critical",
            action="rollback",
            chart=Chart.LOSS,
            summary="the loss is NaN or infinite",
        ),
        KindSpec(
            kind="nonfinite_grad_norm",
            severity="critical",
            action="rollback",
            chart=Chart.GRAD_NORM,
            summary="the gradient norm is NaN or infinite on a step that was not skipped",
        ),
        KindSpec(
            kind="loss_divergence",
            severity="critical",
            action="rollback",
            chart=Chart.LOSS,
            summary="the loss rose above the run's ceiling",
        ),
        KindSpec(
            kind="loss_collapse",
            severity="warning",
            action="rollback",
            chart=Chart.LOSS,
            summary="the loss fell back to ln(vocab) after the run had learned",
        ),
        KindSpec(
            kind="restart_discontinuity",
            severity="critical",
            breaks_continuity=True,
            chart=Chart.LOSS,
            summary="a resumed run's loss is not where it stood at the checkpoint",
        ),
        KindSpec(
            kind="dead_rank",
            severity="critical",
            action="respawn",
            captures_stacks=True,
            summary="a rank stopped reporting or exited",
        ),
        KindSpec(
            kind="hang",
            severity="critical",
            action="respawn",
            captures_stacks=True,
            summary="no rank of the run reported for the hang timeout",
        ),
        KindSpec(
            kind="loss_spike",
            severity="warning",
            chart=Chart.LOSS,
            summary="the loss jumped far above its recent median",
        ),
        KindSpec(
            kind="grad_norm_spike",
            severity="info",
            chart=Chart.GRAD_NORM,
            summary="the gradient norm jumped far above its recent median",
        ),
        KindSpec(
            kind="straggler",
            severity="warning",
            summary="a rank's steps are much slower than its peers'",
        ),
        KindSpec(
            kind="replica_lost",
            severity="warning",
            action="respawn_group",
            captures_stacks=True,
            summary="a replica group dropped out of the steps' quorum; the others go on",
        ),
        KindSpec(
            kind="replica_rejoined",
            severity="info",
            summary="a lost replica group is back in the steps' quorum, healed from a peer",
        ),
        KindSpec(
            kind="replicas_below_min",
            severity="critical",
            action="respawn",
            summary="the steps' quorums stayed below --min-replicas for longer than the bound",
        ),
    )
}
"""Kind -> its facts, for every `AnomalyKind` (a test holds the two to each other)."""

ALL_KINDS: Final[tuple[AnomalyKind, ...]] = get_args(AnomalyKind)
"""Every kind, in the wire vocabulary's order."""


def kind_spec(kind: AnomalyKind | str) -> KindSpec:
    """The facts of ``kind``.

    Raises:
        ValueError: Not an anomaly kind.
    """
    spec = KINDS.get(kind)  # type: ignore[arg-type]
    if spec is None:
        raise ValueError(f"unknown anomaly kind {kind!r}; kinds: {', '.join(ALL_KINDS)}")
    return spec


def kinds_where(**facts: object) -> frozenset[AnomalyKind]:
    """The kinds whose spec has every given fact: ``kinds_where(chart=Chart.LOSS)``."""
    return frozenset(
        kind
        for kind, spec in KINDS.items()
        if all(getattr(spec, name) == value for name, value in facts.items())
    )


__all__ = ["ALL_KINDS", "KINDS", "Chart", "KindSpec", "kind_spec", "kinds_where"]
