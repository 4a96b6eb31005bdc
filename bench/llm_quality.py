"""Detection quality on the LLM-pretraining corpus (`bench/llm_corpus.py`), tuning vs held-out.

Each run of the local corpus is replayed through the full fold (`Replayer`, the code live
processors and `runwatch audit` run) as its trainer's producer would have written it to the
steps topic (`bench/curve_events.py`: RunStarted with the run's world size and vocabulary,
one StepCompleted per logged step, a RunEnded and a RunStarted around each resume). The
corpus has no heartbeats, so liveness is not judged here.

Judged, per split (the manifest fixes it):

* pages (severity warning or critical) on healthy rows, per 10k healthy steps and by kind,
  info verdicts apart, and what a fleet of 100 such runs at one step a second would page
  per hour;
* restart commands caused by verdicts on healthy rows (should be none);
* labelled incidents (manifest ``incidents``): a non-finite loss or a divergence is found
  when a paging verdict of an expected kind falls in its window (delay in rows), and
  whether a rollback followed; a benign spike or a healthy resume should not page;
* injected faults, each in its own branch of every run with enough healthy history: the
  replay is fed the run up to the injection row once, then each fault continues a copy of
  that replayer (a copy of the same state, so equal to replaying the faulted run whole):
  ``nan`` (loss and grad norm NaN at one step), ``divergence`` (loss x1.02 per step,
  compounding), ``spike_x3`` (loss x3 at one step), ``resume_no_optimizer`` (the run goes
  on 40 steps, crashes, resumes from the row before the injection with the restart marker;
  the redone losses carry a modelled jump, ``+RESUME_JUMP`` decaying with
  ``RESUME_DECAY_ROWS``; see the module constants) and ``good_resume`` (the same resume,
  redone losses equal to their first attempts: a control that should not page).

Then the benign spikes are characterised for the spike-detector redesign (`spike_census`).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from curve_events import Curve, curve_records
from llm_corpus import (
    BUILD_FILE,
    CORPUS_FILE,
    DEFAULT_ROOT,
    MANIFEST,
    logs_grad_norm,
    manifest_sha256,
)
from spike_census import excursion_census, page_census, print_census

from runwatch.cmd.processors import parse_overrides
from runwatch.processors.core.config import DetectorConfig, config_hash, with_overrides
from runwatch.processors.core.replay import Replayer, ReplayResult
from runwatch.schemas.events import AnomalyDetected, RestartRequested

PAGING = frozenset({"warning", "critical"})
INJECT_AT = 0.75
"""Faults are injected at the first healthy row at or after this fraction of a run."""
MIN_HISTORY_ROWS = 500
"""A run gets injected faults only with at least this many healthy rows before the row."""
RESUME_CRASH_AFTER = 40
"""A resume fault's run goes this many rows past the saved step before it "crashes"."""
RESUME_JUMP = 0.10
"""Modelled effect of a resume without optimizer state: the first redone loss is this
fraction higher than its first attempt ..."""
RESUME_DECAY_ROWS = 50.0
"""... and the excess decays as exp(-k / this) over the following rows."""
DIVERGENCE_FACTOR = 1.02
SPIKE_FACTOR = 3.0
FLEET_RUNS = 100
FLEET_STEPS_PER_S = 1.0


@dataclass(frozen=True)
class Expect:
    """What should happen after a fault or an incident.

    Attributes:
        kinds: Paging verdict kinds that count as finding it (empty: nothing should page).
        window_rows: Rows from the fault's row (included) in which a verdict counts.
        rollback: A rollback command is the right response.
    """

    kinds: frozenset[str]
    window_rows: int
    rollback: bool = False


NONFINITE = frozenset({"nonfinite_loss", "nonfinite_grad_norm"})
INCIDENTS: Mapping[str, Expect] = {
    "nonfinite": Expect(NONFINITE, 5, rollback=True),
    "divergence": Expect(NONFINITE | {"loss_divergence", "loss_spike"}, 50, rollback=True),
    "benign_spike": Expect(frozenset(), 5),
    "healthy_resume": Expect(frozenset(), RESUME_CRASH_AFTER),
}
"""Incident kinds a manifest may label, and what the detectors should do about each."""
FAULTS: Mapping[str, Expect] = {
    "nan": Expect(frozenset({"nonfinite_loss"}), 5, rollback=True),
    "divergence": Expect(frozenset({"loss_spike", "loss_divergence"}), 150),
    "spike_x3": Expect(frozenset({"loss_spike"}), 5),
    "resume_no_optimizer": Expect(frozenset({"restart_discontinuity"}), RESUME_CRASH_AFTER),
    "good_resume": Expect(frozenset(), RESUME_CRASH_AFTER),
}
"""Injected faults, in the order they are reported."""


class CorpusUnavailable(Exception):
    """The local LLM corpus is absent, incomplete or built from another manifest."""


@dataclass(frozen=True)
class Run:
    """One corpus run with its labels.

    Attributes:
        meta: Its manifest entry.
        curve: Its rows.
        healthy: Per row: judged healthy (inside a manifest ``healthy`` range).
    """

    meta: Mapping[str, Any]
    curve: Curve
    healthy: np.ndarray

    @property
    def name(self) -> str:
        """The run's name."""
        return str(self.meta["name"])

    @property
    def split(self) -> str:
        """``tuning`` or ``heldout``."""
        return str(self.meta["split"])


def healthy_mask(meta: Mapping[str, Any], step: np.ndarray) -> np.ndarray:
    """Rows inside the manifest's ``healthy`` step ranges (inclusive; absent: every row)."""
    ranges = meta.get("healthy")
    if ranges is None:
        return np.ones(len(step), dtype=bool)
    mask = np.zeros(len(step), dtype=bool)
    for lo, hi in ranges:
        mask |= (step >= lo) & (step <= hi)
    return mask


def run_of(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> Run:
    """A manifest run and its corpus columns as a `Run`."""
    name = meta["name"]
    step = arrays[f"{name}/step"]
    grad = arrays[f"{name}/grad_norm"]
    curve = Curve(
        run_id=name,
        step=step,
        loss=arrays[f"{name}/loss"],
        grad_norm=grad if logs_grad_norm(meta) else None,
        step_time_s=arrays[f"{name}/step_time_s"],
        count=arrays[f"{name}/tokens"],
        restart_from=arrays[f"{name}/restart_from"],
        skipped=arrays[f"{name}/skipped"],
        world_size=int(meta.get("world_size") or 1),
        vocab_size=meta.get("vocab_size"),
    )
    return Run(meta=meta, curve=curve, healthy=healthy_mask(meta, step))


def load_runs(root: Path = DEFAULT_ROOT, manifest: Path = MANIFEST) -> list[Run]:
    """Every manifest run from the local corpus.

    Raises:
        CorpusUnavailable: No corpus at ``root``, one built from another manifest, or a
            run missing; the message says how to build it.
    """
    how = (
        f"build it with `.venv/bin/python bench/llm_corpus.py --out {root}` from git copies of "
        "the repositories `bench/llm_corpus.py --list` names"
    )
    if not (root / CORPUS_FILE).is_file() or not (root / BUILD_FILE).is_file():
        raise CorpusUnavailable(f"no LLM corpus at {root}: {how}")
    info = json.loads((root / BUILD_FILE).read_text())
    if info.get("manifest_sha256") != manifest_sha256(manifest):
        raise CorpusUnavailable(f"the LLM corpus at {root} was built from another manifest: {how}")
    runs_meta = json.loads(manifest.read_text())["runs"]
    with np.load(root / CORPUS_FILE) as data:
        arrays = {k: data[k] for k in data.files}
    absent = [m["name"] for m in runs_meta if f"{m['name']}/step" not in arrays]
    if absent:
        raise CorpusUnavailable(f"the LLM corpus at {root} lacks {', '.join(absent)}: {how}")
    return [run_of(m, arrays) for m in runs_meta]


@dataclass
class Outcome:
    """What the detectors did after one fault or incident.

    Attributes:
        delay_rows: Rows from the fault to the first paging verdict of an expected kind
            (None: not found in the window).
        kind: That verdict's kind.
        rollback: A rollback command was caused by a verdict in the window.
        paged: Every paging verdict in the window, by kind (a control should have none).
    """

    delay_rows: int | None = None
    kind: str | None = None
    rollback: bool = False
    paged: Counter[str] = field(default_factory=Counter)


@dataclass
class RunResult:
    """What the detectors said about one run."""

    name: str
    split: str
    family: str
    rows: int
    healthy_rows: int
    pages: list[tuple[int, AnomalyDetected]] = field(default_factory=list)
    info: list[tuple[int, AnomalyDetected]] = field(default_factory=list)
    commands: list[RestartRequested] = field(default_factory=list)
    incidents: list[tuple[str, int, Outcome]] = field(default_factory=list)
    faults: dict[str, Outcome] = field(default_factory=dict)


def judge(
    result: ReplayResult, row_of: Mapping[int, int], fault_row: int, expect: Expect
) -> Outcome:
    """The outcome of a fault at ``fault_row`` given a replay's verdicts and commands."""
    out = Outcome()
    window = range(fault_row, fault_row + expect.window_rows)
    in_window: dict[str, AnomalyDetected] = {}
    for v in result.anomalies:
        assert v.source is not None
        row = row_of.get(v.source.offset)
        if row is None or row not in window:
            continue
        in_window[v.verdict_id] = v
        if v.severity not in PAGING:
            continue
        out.paged[v.kind] += 1
        if out.delay_rows is None and v.kind in expect.kinds:
            out.delay_rows, out.kind = row - fault_row, v.kind
    out.rollback = any(
        c.action == "rollback" and c.cause_verdict_id in in_window for c in result.commands
    )
    return out


def resumed(curve: Curve, row: int, jump: float) -> tuple[Curve, int]:
    """``curve`` crashed ``RESUME_CRASH_AFTER`` rows after ``row - 1`` and resumed from it.

    The redone rows repeat rows ``row..`` with the restart marker on the first and their
    losses raised by ``jump * exp(-k / RESUME_DECAY_ROWS)`` (relative; 0: an exact resume).

    Returns:
        The new curve and the row of its first redone step.
    """
    crash = min(len(curve), row + RESUME_CRASH_AFTER)
    idx = np.concatenate([np.arange(crash), np.arange(row, len(curve))])
    first = crash
    loss = curve.loss[idx].copy()
    k = np.arange(len(idx) - first, dtype=np.float64)
    loss[first:] *= 1.0 + jump * np.exp(-k / RESUME_DECAY_ROWS)
    marker = curve.restart_from[idx].copy()
    marker[first] = int(curve.step[row - 1])
    return (
        replace(
            curve,
            step=curve.step[idx],
            loss=loss,
            grad_norm=None if curve.grad_norm is None else curve.grad_norm[idx],
            step_time_s=curve.step_time_s[idx],
            count=curve.count[idx],
            restart_from=marker,
            skipped=curve.skipped[idx],
        ),
        first,
    )


def faulted(curve: Curve, row: int, fault: str, resume_jump: float) -> tuple[Curve, int]:
    """The curve with ``fault`` injected at ``row``, and the row where it takes effect."""
    if fault == "resume_no_optimizer":
        return resumed(curve, row, resume_jump)
    if fault == "good_resume":
        return resumed(curve, row, 0.0)
    loss = curve.loss.copy()
    grad = None if curve.grad_norm is None else curve.grad_norm.copy()
    if fault == "nan":
        loss[row] = math.nan
        if grad is not None:
            grad[row] = math.nan
    elif fault == "divergence":
        k = np.arange(1, len(loss) - row + 1, dtype=np.float64)
        loss[row:] *= DIVERGENCE_FACTOR**k
    elif fault == "spike_x3":
        loss[row] *= SPIKE_FACTOR
    else:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    return replace(curve, loss=loss, grad_norm=grad), row


def injection_row(run: Run) -> int | None:
    """Where faults go in ``run``: a healthy row late in it with enough healthy history."""
    n = len(run.curve)
    start = int(INJECT_AT * n)
    for row in range(start, n - FAULTS["divergence"].window_rows):
        if run.healthy[row] and int(run.healthy[:row].sum()) >= MIN_HISTORY_ROWS:
            return row
    return None


def evaluate_run(
    run: Run,
    cfg: DetectorConfig,
    partition: int,
    faults: Sequence[str] = tuple(FAULTS),
    resume_jump: float = RESUME_JUMP,
) -> RunResult:
    """Replay one run (and its fault branches) and judge every verdict."""
    curve = run.curve
    res = RunResult(
        name=run.name,
        split=run.split,
        family=str(run.meta["family"]),
        rows=len(curve),
        healthy_rows=int(run.healthy.sum()),
    )
    inject = injection_row(run) if faults else None
    live = Replayer(cfg)
    row_of: dict[int, int] = {}
    cut = len(curve) if inject is None else inject
    records, rows = curve_records(curve, partition, range(cut))
    live.feed(records)
    row_of.update(rows)
    branch = {f: copy.deepcopy(live) for f in faults} if inject is not None else {}
    if cut < len(curve):
        records, rows = curve_records(curve, partition, range(cut, len(curve)))
        live.feed(records)
        row_of.update(rows)
    result = live.result()
    _judge_healthy(run, result, row_of, res)
    for kind, step, evidence_row in _incident_rows(run):
        res.incidents.append((kind, step, judge(result, row_of, evidence_row, INCIDENTS[kind])))
    for fault, replayer in branch.items():
        assert inject is not None
        bad, first = faulted(curve, inject, fault, resume_jump)
        stop = min(len(bad), first + FAULTS[fault].window_rows)
        records, rows = curve_records(bad, partition, range(inject, stop), end=False)
        replayer.feed(records)
        res.faults[fault] = judge(replayer.result(), rows, first, FAULTS[fault])
    return res


def _judge_healthy(
    run: Run, result: ReplayResult, row_of: Mapping[int, int], res: RunResult
) -> None:
    """Sort a run's verdicts on healthy rows into pages and info; keep their commands."""
    healthy_verdicts: set[str] = set()
    for v in result.anomalies:
        assert v.source is not None
        row = row_of[v.source.offset]
        if not run.healthy[row]:
            continue
        healthy_verdicts.add(v.verdict_id)
        (res.pages if v.severity in PAGING else res.info).append((row, v))
    res.commands = [c for c in result.commands if c.cause_verdict_id in healthy_verdicts]


def _incident_rows(run: Run) -> list[tuple[str, int, int]]:
    """``(kind, step, row)`` of each labelled incident.

    The row is the first one of the incident's step; for a healthy resume, the resumed row
    (the one carrying the restart marker).

    Raises:
        ValueError: An incident of an unknown kind, or at a step the run does not have.
    """
    out = []
    curve = run.curve
    for inc in run.meta.get("incidents", ()):
        kind, step = inc["kind"], int(inc["step"])
        if kind not in INCIDENTS:
            raise ValueError(
                f"{run.name}: unknown incident kind {kind!r}; known: {', '.join(INCIDENTS)}"
            )
        rows = np.flatnonzero(curve.step == step)
        if kind == "healthy_resume":
            rows = rows[curve.restart_from[rows] >= 0]
        if not len(rows):
            raise ValueError(f"{run.name}: no row for the {kind} incident at step {step}")
        out.append((kind, step, int(rows[0])))
    return out


def evaluate_llm(
    cfg: DetectorConfig,
    runs: Sequence[Run],
    faults: Sequence[str] = tuple(FAULTS),
    resume_jump: float = RESUME_JUMP,
    progress: Callable[[str], None] | None = None,
) -> list[RunResult]:
    """Replay and judge every run (one partition each)."""
    out = []
    for partition, run in enumerate(runs):
        if progress is not None:
            progress(run.name)
        out.append(evaluate_run(run, cfg, partition, faults, resume_jump))
    return out


def _outcomes(outcomes: Sequence[Outcome], expect: Expect) -> dict[str, Any]:
    """Recall, delays, rollbacks (or, for a control, false alarms) of a group of outcomes."""
    if not expect.kinds:
        alarms = [o for o in outcomes if o.paged]
        kinds = Counter(k for o in alarms for k in o.paged)
        return {"cases": len(outcomes), "paged": len(alarms), "paged_kinds": dict(kinds)}
    found = [o for o in outcomes if o.delay_rows is not None]
    delays = [float(o.delay_rows or 0) for o in found]
    return {
        "cases": len(outcomes),
        "found": len(found),
        "recall": round(len(found) / len(outcomes), 4) if outcomes else None,
        "delay_median": float(np.median(delays)) if delays else None,
        "delay_max": max(delays) if delays else None,
        "rollback": sum(o.rollback for o in outcomes),
        "kinds": dict(Counter(o.kind for o in found if o.kind)),
    }


def summarize_llm(results: Sequence[RunResult]) -> dict[str, Any]:
    """Figures per split (``tuning``, ``heldout``, ``all``)."""
    out: dict[str, Any] = {}
    for split in ("tuning", "heldout", "all"):
        group = [r for r in results if split in ("all", r.split)]
        healthy = sum(r.healthy_rows for r in group)
        per10k = 10_000 / max(1, healthy)
        pages = Counter(v.kind for r in group for _, v in r.pages)
        info = Counter(v.kind for r in group for _, v in r.info)
        n_pages = sum(pages.values())
        out[split] = {
            "runs": len(group),
            "healthy_steps": healthy,
            "pages": n_pages,
            "pages_per_10k_healthy_steps": round(n_pages * per10k, 3),
            "pages_per_10k_by_kind": {k: round(c * per10k, 3) for k, c in sorted(pages.items())},
            "info_per_10k_by_kind": {k: round(c * per10k, 3) for k, c in sorted(info.items())},
            "fleet_pages_per_hour": round(
                n_pages / max(1, healthy) * FLEET_RUNS * FLEET_STEPS_PER_S * 3600, 1
            ),
            "commands_on_healthy_rows": sum(len(r.commands) for r in group),
            "commands": [
                f"{r.name}: {c.action} ({c.cause_kind})" for r in group for c in r.commands
            ],
            "incidents": {
                kind: _outcomes([o for r in group for k, _, o in r.incidents if k == kind], exp)
                for kind, exp in INCIDENTS.items()
            },
            "faults": {
                fault: _outcomes([r.faults[fault] for r in group if fault in r.faults], exp)
                for fault, exp in FAULTS.items()
            },
        }
    return out


def llm_target_met(summary: Mapping[str, Any]) -> bool:
    """The issue's goal, in both splits: <= 1 page per 10k healthy steps, no command on a
    healthy row, every labelled non-finite/divergence and injected NaN/divergence found."""
    for split in ("tuning", "heldout"):
        s = summary[split]
        if s["pages_per_10k_healthy_steps"] > 1.0 or s["commands_on_healthy_rows"]:
            return False
        checks = [s["incidents"]["nonfinite"], s["incidents"]["divergence"]]
        checks += [s["faults"]["nan"], s["faults"]["divergence"]]
        if any(c["cases"] and c["recall"] != 1.0 for c in checks):
            return False
    return True


def _cell(figures: Mapping[str, Any]) -> str:
    """One fault's or incident's figures in a table cell."""
    if not figures["cases"]:
        return "-"
    if "found" not in figures:
        return f"paged {figures['paged']}/{figures['cases']}"
    med = "-" if figures["delay_median"] is None else f"{figures['delay_median']:g}"
    mx = "-" if figures["delay_max"] is None else f"{figures['delay_max']:.0f}"
    return f"{figures['found']}/{figures['cases']} delay {med} (max {mx}) rb {figures['rollback']}"


def print_llm(summary: Mapping[str, Any]) -> None:
    """The LLM-corpus table: tuning and held-out side by side."""
    tun, held = summary["tuning"], summary["heldout"]
    print(
        f"LLM corpus: tuning {tun['runs']} runs / {tun['healthy_steps']} healthy steps, "
        f"held-out {held['runs']} / {held['healthy_steps']}"
    )
    print(f"{'':<28}{'tuning':>34}{'held-out':>34}")
    rows: list[tuple[str, str, str]] = [
        (
            "pages per 10k healthy",
            f"{tun['pages_per_10k_healthy_steps']:.2f}",
            f"{held['pages_per_10k_healthy_steps']:.2f}",
        )
    ]
    for key, label in (("pages_per_10k_by_kind", "  "), ("info_per_10k_by_kind", "info ")):
        for kind in sorted(set(tun[key]) | set(held[key])):
            a, b = tun[key].get(kind, 0.0), held[key].get(kind, 0.0)
            rows.append((label + kind, f"{a:.2f}", f"{b:.2f}"))
    rows.append(
        (
            "fleet of 100: pages/hour",
            f"{tun['fleet_pages_per_hour']:.0f}",
            f"{held['fleet_pages_per_hour']:.0f}",
        )
    )
    rows.append(
        (
            "commands on healthy rows",
            str(tun["commands_on_healthy_rows"]),
            str(held["commands_on_healthy_rows"]),
        )
    )
    for kind in INCIDENTS:
        rows.append(
            (f"labelled {kind}", _cell(tun["incidents"][kind]), _cell(held["incidents"][kind]))
        )
    for fault in FAULTS:
        rows.append(
            (f"injected {fault}", _cell(tun["faults"][fault]), _cell(held["faults"][fault]))
        )
    for label, a, b in rows:
        print(f"{label:<28}{a:>34}{b:>34}")
    for split in (tun, held):
        for command in split["commands"]:
            print(f"  command on a healthy row: {command}")


def llm_section(
    cfg: DetectorConfig,
    root: Path = DEFAULT_ROOT,
    faults: Sequence[str] = tuple(FAULTS),
    resume_jump: float = RESUME_JUMP,
) -> dict[str, Any]:
    """Evaluate, print the table and the spike census; the figures for the JSON line.

    When the local corpus is absent this prints why and how to build it, and returns
    ``{"absent": reason}`` (the other sections of a bench still run).
    """
    try:
        runs = load_runs(root)
    except CorpusUnavailable as exc:
        print(f"LLM corpus: not measured: {exc}")
        return {"absent": str(exc)}
    results = evaluate_llm(cfg, runs, faults, resume_jump)
    summary = summarize_llm(results)
    print_llm(summary)
    census = {"pages": page_census(runs, results), "excursions": excursion_census(runs)}
    print_census(census)
    met = llm_target_met(summary)
    print(
        "LLM target (<= 1 page per 10k healthy steps, no command on a healthy row, every "
        f"labelled and injected NaN/divergence found, both splits): {'MET' if met else 'MISSED'}"
    )
    return {"summary": summary, "census": census, "target_met": met, "resume_jump": resume_jump}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_ROOT, help="local LLM corpus")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="detector setting, as `runwatch replay --set` takes it (repeatable)",
    )
    parser.add_argument(
        "--faults",
        nargs="*",
        choices=list(FAULTS),
        default=list(FAULTS),
        help="faults to inject (none: only the healthy replay and the incidents)",
    )
    parser.add_argument(
        "--resume-jump",
        type=float,
        default=RESUME_JUMP,
        help="modelled relative loss jump of a resume without optimizer state",
    )
    args = parser.parse_args()
    cfg = with_overrides(DetectorConfig(), parse_overrides(args.overrides))
    print(f"config {config_hash(cfg)}")
    figures = llm_section(cfg, args.corpus, tuple(args.faults), args.resume_jump)
    print(
        json.dumps(
            {"bench": "llm_quality", "config_hash": config_hash(cfg), "llm": figures},
            sort_keys=True,
        )
    )


__all__ = [
    "FAULTS",
    "INCIDENTS",
    "CorpusUnavailable",
    "Expect",
    "Outcome",
    "Run",
    "RunResult",
    "evaluate_llm",
    "evaluate_run",
    "faulted",
    "healthy_mask",
    "judge",
    "llm_section",
    "llm_target_met",
    "load_runs",
    "print_llm",
    "resumed",
    "summarize_llm",
]


if __name__ == "__main__":
    main()
