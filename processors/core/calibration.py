"""The fleet calibration report: what a configuration would page and command, run by run.

An operator tunes on their own fleet before enforcing: every run of a prefix's history is
replayed with the current or proposed settings (`runwatch replay --report`), and this module
sums the replays up. Pure: it reads replay results, nothing else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import msgspec

from runwatch.processors.core.replay import ReplayResult
from runwatch.schemas.events import AnomalyKind, Severity

PAGING: tuple[Severity, ...] = ("warning", "critical")
"""Severities that page (the alerts sink's default ``--min-severity warning``)."""


class Page(msgspec.Struct, frozen=True, kw_only=True):
    """One verdict that would page.

    Attributes:
        run_id: The run.
        kind: The verdict's kind.
        step: Its step (a spike episode's first step).
        severity: ``warning`` or ``critical``.
        shadow: Recorded in shadow mode.
        detail: Its one line.
    """

    run_id: str
    kind: AnomalyKind
    step: int
    severity: Severity
    shadow: bool
    detail: str


class RunFigures(msgspec.Struct, frozen=True, kw_only=True):
    """One run's figures.

    Attributes:
        run_id: The run.
        steps: StepCompleted events replayed (redone steps included).
        pages: Verdicts that would page.
        info: Verdicts that would not page.
        commands: Commands the policy would issue (executed ones).
        shadow_commands: Commands recorded in shadow mode.
    """

    run_id: str
    steps: int
    pages: int
    info: int
    commands: int
    shadow_commands: int


class FleetReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a configuration would have done over a fleet.

    Attributes:
        config_hash: The configuration replayed with.
        runs: Per run, sorted by run id.
        steps: Steps over every run.
        pages_by_kind: Paging verdicts by kind.
        info_by_kind: Non-paging verdicts by kind.
        pages: Every verdict that would page, by run and step.
    """

    config_hash: str
    runs: tuple[RunFigures, ...]
    steps: int
    pages_by_kind: dict[str, int]
    info_by_kind: dict[str, int]
    pages: tuple[Page, ...]

    def per_10k_steps(self, counts: dict[str, int]) -> dict[str, float]:
        """``counts`` per 10,000 replayed steps (empty for a fleet without steps)."""
        if self.steps <= 0:
            return {}
        return {k: round(n * 10_000 / self.steps, 3) for k, n in sorted(counts.items())}

    def commands_per_run(self) -> float:
        """Executed commands per run (0 for an empty fleet)."""
        return sum(r.commands for r in self.runs) / len(self.runs) if self.runs else 0.0


def _run_figures(run_id: str, result: ReplayResult) -> tuple[RunFigures, list[Page], Counter[str]]:
    """One run's figures, its pages and its info verdicts by kind."""
    pages: list[Page] = []
    info: Counter[str] = Counter()
    for a in result.anomalies:
        if a.run_id != run_id:
            continue
        if a.severity in PAGING:
            pages.append(
                Page(
                    run_id=run_id,
                    kind=a.kind,
                    step=a.step,
                    severity=a.severity,
                    shadow=a.shadow,
                    detail=a.detail,
                )
            )
        else:
            info[a.kind] += 1
    commands = [c for c in result.commands if c.run_id == run_id]
    state = result.steps.get(run_id)
    figures = RunFigures(
        run_id=run_id,
        steps=0 if state is None else state.steps_observed,
        pages=len(pages),
        info=sum(info.values()),
        commands=sum(1 for c in commands if not c.shadow),
        shadow_commands=sum(1 for c in commands if c.shadow),
    )
    return figures, pages, info


def fleet_report(config_hash: str, replays: Iterable[tuple[str, ReplayResult]]) -> FleetReport:
    """Sum up the replays of a fleet's runs.

    Args:
        config_hash: The configuration every run was replayed with.
        replays: ``(run_id, replay of that run's input)`` per run.

    Returns:
        The report; runs and pages sorted by run id (pages then by step).
    """
    runs: list[RunFigures] = []
    pages: list[Page] = []
    page_kinds: Counter[str] = Counter()
    info_kinds: Counter[str] = Counter()
    for run_id, result in sorted(replays, key=lambda item: item[0]):
        figures, run_pages, info = _run_figures(run_id, result)
        runs.append(figures)
        pages.extend(sorted(run_pages, key=lambda p: (p.step, p.kind)))
        page_kinds.update(p.kind for p in run_pages)
        info_kinds.update(info)
    return FleetReport(
        config_hash=config_hash,
        runs=tuple(runs),
        steps=sum(r.steps for r in runs),
        pages_by_kind=dict(sorted(page_kinds.items())),
        info_by_kind=dict(sorted(info_kinds.items())),
        pages=tuple(pages),
    )


__all__ = ["PAGING", "FleetReport", "Page", "RunFigures", "fleet_report"]
