"""A fleet calibration report: what a fleet's history would page with given settings.

`runwatch replay --all` replays every run of a prefix's history (or of the archive) with
the current or proposed detector settings, and this module folds the per-run outcomes
into fleet figures an operator tunes on before enforcing: pages (verdicts of severity
`PAGING_SEVERITY` or above) per 10k steps judged, by kind; info verdicts by kind; commands
per run by action; and the runs and steps that would page. The same figures are computed
for the verdicts the live processors recorded, so the report reads "today vs proposed".

Pure: it takes decoded verdicts and counts, and reads no log (the command does).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Protocol, get_args

import msgspec

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.replay import Record, ReplayResult, replay
from runwatch.schemas.events import AnomalyDetected, RestartRequested, Severity, Tick

PAGING_SEVERITY: Final[Severity] = "warning"
"""A verdict of this severity or above pages someone (the alert sinks' default)."""
SEVERITY_ORDER: Final[tuple[Severity, ...]] = get_args(Severity)
PER_STEPS: Final = 10_000
"""Rates are given per this many steps judged."""
DEFAULT_TOP_N: Final = 10
RATE_DECIMALS: Final = 3


def pages(severity: Severity) -> bool:
    """True when a verdict of ``severity`` pages (`PAGING_SEVERITY` or above)."""
    return SEVERITY_ORDER.index(severity) >= SEVERITY_ORDER.index(PAGING_SEVERITY)


class RunVerdicts(msgspec.Struct, frozen=True, kw_only=True):
    """One run's verdicts and commands, replayed or recorded.

    Attributes:
        run_id: The run.
        steps_judged: StepCompleted events the step detectors judged (redone steps
            included).
        anomalies: Its verdicts, in log order.
        commands: Its commands, in log order.
    """

    run_id: str
    steps_judged: int
    anomalies: tuple[AnomalyDetected, ...] = ()
    commands: tuple[RestartRequested, ...] = ()


class PageRow(msgspec.Struct, frozen=True, kw_only=True):
    """One verdict that pages.

    Attributes:
        run_id: The run.
        step: The step it concerns.
        kind: Its kind.
        severity: Its severity.
        rank: The rank it concerns; None: run-wide.
        detail: Its one line.
    """

    run_id: str
    step: int
    kind: str
    severity: Severity
    rank: int | None
    detail: str


class RunPages(msgspec.Struct, frozen=True, kw_only=True):
    """A run that pages, with its first pages.

    Attributes:
        run_id: The run.
        steps_judged: Steps judged in the run.
        pages: Verdicts that page.
        pages_by_kind: Those by kind.
        first_pages: Its first pages in log order, at most the report's top N.
    """

    run_id: str
    steps_judged: int
    pages: int
    pages_by_kind: dict[str, int]
    first_pages: list[PageRow]


class FleetFigures(msgspec.Struct, frozen=True, kw_only=True):
    """The figures of one set of verdicts over a fleet.

    Attributes:
        runs: Runs counted.
        steps_judged: Steps judged over every run.
        pages: Verdicts that page.
        pages_per_10k_steps: ``pages`` per 10k steps judged.
        pages_by_kind: Pages by kind.
        pages_per_10k_steps_by_kind: Pages per 10k steps judged, by kind.
        info_by_kind: Verdicts that do not page, by kind.
        commands_by_action: Commands by action; shadow mode's as ``"<action> (shadow)"``.
        commands_per_run_by_action: Commands per run, by action.
        runs_paging: Runs with at least one page.
        top_runs: The runs with the most pages (ties: run id), at most top N.
    """

    runs: int
    steps_judged: int
    pages: int
    pages_per_10k_steps: float
    pages_by_kind: dict[str, int]
    pages_per_10k_steps_by_kind: dict[str, float]
    info_by_kind: dict[str, int]
    commands_by_action: dict[str, int]
    commands_per_run_by_action: dict[str, float]
    runs_paging: int
    top_runs: list[RunPages]


class CalibrationReport(msgspec.Struct, frozen=True, kw_only=True):
    """Replayed ("proposed") vs recorded ("today") figures of a fleet.

    Attributes:
        config_hash: Hash of the configuration replayed with.
        overrides: The settings given (``--set``), as given; empty: the defaults.
        top_n: How many runs (and pages per run) are listed.
        proposed: Figures of the replay.
        recorded: Figures of what the live processors recorded.
        differs: True when the replay's pages or commands differ from the record's.
        notes: What was left out and why (runs without input, an archive without inputs).
    """

    config_hash: str
    overrides: dict[str, str]
    top_n: int
    proposed: FleetFigures
    recorded: FleetFigures
    differs: bool
    notes: list[str] = []


def replayed_verdicts(run_id: str, result: ReplayResult) -> RunVerdicts:
    """One run's verdicts and commands from a replay (of that run's log).

    Args:
        run_id: The run.
        result: The replay of its log (other runs' verdicts in it are left out).

    Returns:
        Its verdicts; steps judged are its step state's ``steps_observed`` (0: none).
    """
    state = result.steps.get(run_id)
    return RunVerdicts(
        run_id=run_id,
        steps_judged=state.steps_observed if state is not None else 0,
        anomalies=tuple(a for a in result.anomalies if a.run_id == run_id),
        commands=tuple(c for c in result.commands if c.run_id == run_id),
    )


def recorded_verdicts(
    run_id: str,
    steps_judged: int,
    anomalies: Iterable[Record],
    commands: Iterable[RestartRequested],
) -> RunVerdicts:
    """One run's verdicts and commands as the live processors recorded them.

    Args:
        run_id: The run.
        steps_judged: Its steps judged (from the replay of its input: the same input).
        anomalies: Records of the anomalies topic.
        commands: Commands of the commands topic.

    Returns:
        Its recorded verdicts (records of other runs, or not verdicts, left out).
    """
    return RunVerdicts(
        run_id=run_id,
        steps_judged=steps_judged,
        anomalies=tuple(
            e for _, _, e in anomalies if isinstance(e, AnomalyDetected) and e.run_id == run_id
        ),
        commands=tuple(c for c in commands if c.run_id == run_id),
    )


def _rate(count: int, steps: int) -> float:
    return round(count * PER_STEPS / steps, RATE_DECIMALS) if steps else 0.0


def _page_row(run_id: str, a: AnomalyDetected) -> PageRow:
    return PageRow(
        run_id=run_id, step=a.step, kind=a.kind, severity=a.severity, rank=a.rank, detail=a.detail
    )


def _run_pages(run: RunVerdicts, top_n: int) -> RunPages:
    paging = [a for a in run.anomalies if pages(a.severity)]
    return RunPages(
        run_id=run.run_id,
        steps_judged=run.steps_judged,
        pages=len(paging),
        pages_by_kind=dict(sorted(Counter(a.kind for a in paging).items())),
        first_pages=[_page_row(run.run_id, a) for a in paging[:top_n]],
    )


def fleet_figures(runs: Sequence[RunVerdicts], top_n: int = DEFAULT_TOP_N) -> FleetFigures:
    """Fold runs' verdicts into fleet figures.

    Args:
        runs: One entry per run.
        top_n: Most runs listed in ``top_runs``, and most pages listed per run.

    Returns:
        The figures; rates are rounded to `RATE_DECIMALS` decimals.

    Raises:
        ValueError: ``top_n`` is negative, or a run is given twice.
    """
    if top_n < 0:
        raise ValueError(f"top_n must be >= 0, got {top_n}")
    ids = Counter(r.run_id for r in runs)
    twice = sorted(run_id for run_id, n in ids.items() if n > 1)
    if twice:
        raise ValueError(f"runs given more than once: {', '.join(twice)}")
    steps = sum(r.steps_judged for r in runs)
    paging = Counter(a.kind for r in runs for a in r.anomalies if pages(a.severity))
    info = Counter(a.kind for r in runs for a in r.anomalies if not pages(a.severity))
    # a shadow command (shadow mode: recorded, never executed) is counted apart
    actions = Counter(
        f"{c.action} (shadow)" if c.shadow else c.action for r in runs for c in r.commands
    )
    per_run = [_run_pages(r, top_n) for r in runs]
    top = sorted((p for p in per_run if p.pages), key=lambda p: (-p.pages, p.run_id))
    return FleetFigures(
        runs=len(runs),
        steps_judged=steps,
        pages=sum(paging.values()),
        pages_per_10k_steps=_rate(sum(paging.values()), steps),
        pages_by_kind=dict(sorted(paging.items())),
        pages_per_10k_steps_by_kind={k: _rate(n, steps) for k, n in sorted(paging.items())},
        info_by_kind=dict(sorted(info.items())),
        commands_by_action=dict(sorted(actions.items())),
        commands_per_run_by_action={
            k: round(n / len(runs), RATE_DECIMALS) for k, n in sorted(actions.items())
        },
        runs_paging=sum(1 for p in per_run if p.pages),
        top_runs=top[:top_n],
    )


def _identity(runs: Iterable[RunVerdicts]) -> list[Counter[tuple[object, ...]]]:
    """What a run's record says, ids and provenance aside (they depend on the config)."""
    anomalies: Counter[tuple[object, ...]] = Counter()
    commands: Counter[tuple[object, ...]] = Counter()
    for r in runs:
        anomalies.update((r.run_id, a.kind, a.step, a.rank, a.severity) for a in r.anomalies)
        commands.update((r.run_id, c.action, c.cause_kind, c.incarnation) for c in r.commands)
    return [anomalies, commands]


def calibration_report(
    proposed: Sequence[RunVerdicts],
    recorded: Sequence[RunVerdicts],
    *,
    config_hash: str,
    overrides: Mapping[str, str],
    top_n: int = DEFAULT_TOP_N,
    notes: Sequence[str] = (),
) -> CalibrationReport:
    """The report of a fleet replayed with one configuration, next to its record.

    Args:
        proposed: Each run's replayed verdicts.
        recorded: Each run's recorded verdicts (the same runs).
        config_hash: Hash of the configuration replayed with.
        overrides: The settings given.
        top_n: Runs (and pages per run) listed.
        notes: What was left out and why.

    Returns:
        The report.

    Raises:
        ValueError: ``proposed`` and ``recorded`` are not the same runs (or see
            `fleet_figures`).
    """
    if sorted(r.run_id for r in proposed) != sorted(r.run_id for r in recorded):
        raise ValueError("proposed and recorded verdicts must cover the same runs")
    return CalibrationReport(
        config_hash=config_hash,
        overrides=dict(overrides),
        top_n=top_n,
        proposed=fleet_figures(proposed, top_n),
        recorded=fleet_figures(recorded, top_n),
        differs=_identity(proposed) != _identity(recorded),
        notes=list(notes),
    )


class RunHistory(Protocol):
    """One run's log as read (`processors.audit.RunLog` is one)."""

    @property
    def run_id(self) -> str:
        """The run."""

    @property
    def inputs(self) -> list[Record]:
        """Its input records, each role in partition order."""

    @property
    def recorded_anomalies(self) -> list[Record]:
        """Its records of the anomalies topic."""

    @property
    def recorded_commands(self) -> list[RestartRequested]:
        """Its commands."""


def first_ts_ns(log: RunHistory) -> int | None:
    """Log time of the run's first input event (ticks aside); None: no input."""
    stamps = [e.ts_ns for _, _, e in log.inputs if type(e) is not Tick]
    return min(stamps) if stamps else None


def select_runs(
    logs: Sequence[RunHistory], *, since_ns: int | None = None, last: int | None = None
) -> list[RunHistory]:
    """The runs to calibrate on: begun at or after ``since_ns``, then the ``last`` latest.

    Args:
        logs: Every run's log.
        since_ns: Keep runs whose first input event is at or after this log time.
        last: Keep at most this many runs, the latest begun (ties: run id).

    Returns:
        The kept logs, in the order given.

    Raises:
        ValueError: ``last`` is below 1.
    """
    if last is not None and last < 1:
        raise ValueError(f"the number of runs must be >= 1, got {last}")
    begun = {id(log): first_ts_ns(log) for log in logs}

    def since(log: RunHistory) -> bool:
        at = begun[id(log)]
        return since_ns is None or (at is not None and at >= since_ns)

    kept = [log for log in logs if since(log)]
    if last is not None and len(kept) > last:
        latest = sorted(kept, key=lambda log: (begun[id(log)] or -1, log.run_id))[-last:]
        chosen = {id(log) for log in latest}
        kept = [log for log in kept if id(log) in chosen]
    return kept


def calibrate(
    logs: Iterable[RunHistory],
    cfg: DetectorConfig,
    config_hash: str,
    *,
    overrides: Mapping[str, str],
    top_n: int = DEFAULT_TOP_N,
    notes: Sequence[str] = (),
) -> CalibrationReport:
    """Replay each run's input with ``cfg`` and report it next to the run's record.

    The policy of a replay reads the recomputed verdicts (as `runwatch replay` does), so
    the commands are those the proposed settings would issue. A run with no input (only
    recorded verdicts) cannot be replayed: it is left out and named in the notes.

    Args:
        logs: The runs' logs.
        cfg: The configuration to replay with.
        config_hash: Its hash (shown in the report).
        overrides: The settings given, as given.
        top_n: Runs (and pages per run) listed.
        notes: Notes to carry (what the reader left out).

    Returns:
        The report.
    """
    proposed: list[RunVerdicts] = []
    recorded: list[RunVerdicts] = []
    said = list(notes)
    for log in logs:
        if not log.inputs:
            said.append(f"run {log.run_id}: no input records to replay (left out)")
            continue
        mine = replayed_verdicts(log.run_id, replay(log.inputs, cfg))
        proposed.append(mine)
        recorded.append(
            recorded_verdicts(
                log.run_id, mine.steps_judged, log.recorded_anomalies, log.recorded_commands
            )
        )
    return calibration_report(
        proposed,
        recorded,
        config_hash=config_hash,
        overrides=overrides,
        top_n=top_n,
        notes=said,
    )


def _counts(values: Mapping[str, int] | Mapping[str, float], fmt: str = "{}") -> str:
    return ", ".join(f"{k} {fmt.format(v)}" for k, v in values.items()) or "none"


def _figure_lines(title: str, f: FleetFigures) -> list[str]:
    return [
        f"{title}:",
        f"  pages (severity >= {PAGING_SEVERITY}): {f.pages} "
        f"({f.pages_per_10k_steps:.2f} per 10k steps) in {f.runs_paging} of {f.runs} runs",
        "  pages per 10k steps by kind: " + _counts(f.pages_per_10k_steps_by_kind, "{:.2f}"),
        "  info verdicts by kind: " + _counts(f.info_by_kind),
        "  commands by action: "
        + _counts(f.commands_by_action)
        + " (per run: "
        + _counts(f.commands_per_run_by_action, "{:.3f}")
        + ")",
    ]


def render_report(report: CalibrationReport) -> str:
    """The report as text: figures, then (when they differ) the record's, then who pages."""
    given = " ".join(f"{k}={v}" for k, v in report.overrides.items()) or "defaults"
    p = report.proposed
    lines = [
        f"fleet calibration: {p.runs} runs, {p.steps_judged} steps judged, "
        f"settings {given} (config {report.config_hash})",
        *_figure_lines("replayed with these settings", p),
    ]
    if report.differs:
        lines += _figure_lines("recorded live (today)", report.recorded)
    else:
        lines.append("recorded live (today): the same pages and commands")
    if p.top_runs:
        lines.append(f"runs that would page (top {report.top_n}):")
    for run in p.top_runs:
        lines.append(
            f"  {run.run_id}: {run.pages} pages in {run.steps_judged} steps "
            f"({_counts(run.pages_by_kind)})"
        )
        for row in run.first_pages:
            where = "" if row.rank is None else f" rank {row.rank}"
            lines.append(f"    step {row.step:>7} {row.kind:<22}{where}  {row.detail}")
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)


__all__ = [
    "DEFAULT_TOP_N",
    "PAGING_SEVERITY",
    "CalibrationReport",
    "FleetFigures",
    "PageRow",
    "RunHistory",
    "RunPages",
    "RunVerdicts",
    "calibrate",
    "calibration_report",
    "first_ts_ns",
    "fleet_figures",
    "pages",
    "recorded_verdicts",
    "render_report",
    "replayed_verdicts",
    "select_runs",
]
