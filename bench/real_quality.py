"""Detection quality on the real-curve corpus (`bench/real_curves.py`), tuning vs held-out.

Each recorded curve is replayed as its producer would have emitted it: a RunStarted
(vocabulary 256 for the byte-level LMs, none for the classifiers), one StepCompleted per
recorded row with its loss, pre-clip grad norm, step time, tokens and restart marker, and
around a resume a RunEnded and a RunStarted of the next incarnation, as the controller's
respawn does. Log time advances one second per row, so the figures do not depend on the
measured step times.

Rows are judged by position (a resume redoes step numbers): in a healthy curve and in a
``good_resume`` control every row is healthy; in a fault curve the rows before the fault
are healthy, the fault's window starts at the row where the fault takes effect (the first
resumed row for a resume), and rows after the window are not judged (the run was broken).
A verdict that pages (severity warning or critical) on a healthy row is a false positive;
info verdicts are counted apart. A fault is found when a paging verdict of an expected kind
falls in its window; the delay is in rows (steps) from the fault.

Materiality: a resume without optimizer state does not always change the curve (with a
small learning rate, fresh Adam moments make a few updates of size lr and nothing else).
Whether it did is measured on the recording itself, independent of any detector: the
mean loss of the first 20 redone steps against their first attempt (same weights at S,
same batches). Below +2 % the fault had no material effect; it is reported, but not
counted in recall (and nothing it raises counts as a false positive either).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from curve_events import Curve
from curve_events import curve_records as replay_records

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.replay import Record, replay
from runwatch.schemas.events import AnomalyDetected

CORPUS = Path(__file__).resolve().parent / "data" / "real_curves"
LM_FAMILIES = frozenset({"lm", "lstm"})
FAULT_EXPECTED: Mapping[str, frozenset[str]] = {
    "garbage_batch": frozenset({"loss_spike", "grad_norm_spike"}),
    "lr_blowup": frozenset(
        {
            "loss_spike",
            "grad_norm_spike",
            "loss_divergence",
            "nonfinite_loss",
            "nonfinite_grad_norm",
        }
    ),
    "nan_loss": frozenset({"nonfinite_loss"}),
    "resume_no_optimizer": frozenset({"restart_discontinuity"}),
}
"""Paging verdict kinds that count as finding each fault."""
FAULT_WINDOW_ROWS: Mapping[str, int] = {
    "garbage_batch": 25,
    "lr_blowup": 50,
    "nan_loss": 5,
    "resume_no_optimizer": 40,
}
PAGING = frozenset({"warning", "critical"})
MATERIAL_REL = 0.02
"""A resume fault is material when the redone steps' mean loss rose by this fraction."""
PAIRED_ROWS = 20


def severity_of(a: AnomalyDetected) -> str:
    """The verdict's severity (``warning`` for a verdict made before severities existed)."""
    return str(getattr(a, "severity", "warning"))


@dataclass
class CurveResult:
    """What the detectors said about one curve."""

    name: str
    split: str
    family: str
    fault: str | None
    rows: int
    healthy_rows: int
    fault_row: int | None
    false_positives: list[AnomalyDetected] = field(default_factory=list)
    info_on_healthy: list[AnomalyDetected] = field(default_factory=list)
    detected_delay: int | None = None
    detected_kind: str | None = None
    effect: float | None = None
    material: bool = True


def resume_effect(steps: np.ndarray, loss: np.ndarray, frow: int) -> float:
    """Mean relative loss change of the first redone rows against their first attempts."""
    first = {int(s): float(v) for s, v in zip(steps[:frow], loss[:frow], strict=True)}
    pairs = [
        (float(loss[i]), first[int(steps[i])])
        for i in range(frow, min(len(steps), frow + PAIRED_ROWS))
        if int(steps[i]) in first
    ]
    resumed = sum(a for a, _ in pairs) / len(pairs)
    before = sum(b for _, b in pairs) / len(pairs)
    return resumed / before - 1.0


def load_corpus(root: Path = CORPUS) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """The manifest's curves and the corpus arrays (``<name>/<column>``)."""
    manifest = json.loads((root / "manifest.json").read_text())
    with np.load(root / "curves.npz") as data:
        arrays = {k: data[k] for k in data.files}
    return manifest["curves"], arrays


def fault_row(meta: Mapping[str, Any], restart_from: np.ndarray, steps: np.ndarray) -> int | None:
    """Row index where the curve's fault takes effect (None: healthy or a control)."""
    fault = meta.get("fault")
    if fault is None or fault == "good_resume":
        return None
    if fault == "resume_no_optimizer":
        marked = np.flatnonzero(restart_from >= 0)
        return int(marked[0])
    return int(np.flatnonzero(steps == meta["fault_step"])[0])


def curve_of(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> Curve:
    """One corpus curve (vocabulary 256 for the byte-level LMs, examples for classifiers)."""
    name = meta["name"]
    lm = meta["family"] in LM_FAMILIES
    return Curve(
        run_id=name,
        step=arrays[f"{name}/step"],
        loss=arrays[f"{name}/loss"],
        grad_norm=arrays[f"{name}/grad_norm"],
        step_time_s=arrays[f"{name}/step_time_s"],
        count=arrays[f"{name}/tokens"],
        restart_from=arrays[f"{name}/restart_from"],
        skipped=arrays[f"{name}/skipped"],
        vocab_size=256 if lm else None,
        examples=not lm,
    )


def curve_records(
    meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray], partition: int
) -> tuple[list[Record], dict[int, int]]:
    """A curve as the steps topic would hold it, and the row of each step record's offset."""
    return replay_records(curve_of(meta, arrays), partition)


def evaluate(cfg: DetectorConfig, root: Path = CORPUS) -> list[CurveResult]:
    """Replay every curve of the corpus with ``cfg`` and judge its verdicts."""
    curves, arrays = load_corpus(root)
    results = []
    for partition, meta in enumerate(curves):
        records, row_of = curve_records(meta, arrays, partition)
        verdicts = replay(records, cfg).anomalies
        name = meta["name"]
        n = len(arrays[f"{name}/step"])
        frow = fault_row(meta, arrays[f"{name}/restart_from"], arrays[f"{name}/step"])
        res = CurveResult(
            name=name,
            split=meta["split"],
            family=meta["family"],
            fault=meta.get("fault"),
            rows=n,
            healthy_rows=n if frow is None else frow,
            fault_row=frow,
        )
        if res.fault == "resume_no_optimizer" and frow is not None:
            res.effect = resume_effect(arrays[f"{name}/step"], arrays[f"{name}/loss"], frow)
            res.material = res.effect >= MATERIAL_REL
        window = FAULT_WINDOW_ROWS.get(res.fault or "", 0)
        for v in verdicts:
            assert v.source is not None
            row = row_of[v.source.offset]
            paging = severity_of(v) in PAGING
            if frow is None or row < frow:
                (res.false_positives if paging else res.info_on_healthy).append(v)
            elif (
                row <= frow + window
                and paging
                and v.kind in FAULT_EXPECTED[res.fault or ""]
                and res.detected_delay is None
            ):
                res.detected_delay, res.detected_kind = row - frow, v.kind
        results.append(res)
    return results


def summarize(results: list[CurveResult]) -> dict[str, Any]:
    """Figures per split (``tuning``, ``heldout``, ``all``): FP rates by kind, recall, delays."""
    out: dict[str, Any] = {}
    for split in ("tuning", "heldout", "all"):
        group = [r for r in results if split in ("all", r.split)]
        healthy = sum(r.healthy_rows for r in group)
        fp_kinds: dict[str, int] = {}
        info_kinds: dict[str, int] = {}
        for r in group:
            for v in r.false_positives:
                fp_kinds[v.kind] = fp_kinds.get(v.kind, 0) + 1
            for v in r.info_on_healthy:
                info_kinds[v.kind] = info_kinds.get(v.kind, 0) + 1
        per10k = 10_000 / max(1, healthy)
        faults: dict[str, Any] = {}
        for kind in FAULT_EXPECTED:
            every = [r for r in group if r.fault == kind]
            fg = [r for r in every if r.material]
            found = [r for r in fg if r.detected_delay is not None]
            delays = [float(r.detected_delay or 0) for r in found]
            faults[kind] = {
                "injected": len(fg),
                "found": len(found),
                "recall": len(found) / len(fg) if fg else None,
                "delay_median": float(np.median(delays)) if delays else None,
                "delay_max": max(delays) if delays else None,
                "missed": [r.name for r in fg if r.detected_delay is None],
                "immaterial": {r.name: round(r.effect or 0.0, 4) for r in every if not r.material},
            }
        n_fp = sum(fp_kinds.values())
        out[split] = {
            "curves": len(group),
            "healthy_steps": healthy,
            "false_positives": n_fp,
            "false_positives_per_10k_healthy_steps": round(n_fp * per10k, 3),
            "fp_per_10k_by_kind": {k: round(c * per10k, 2) for k, c in sorted(fp_kinds.items())},
            "info_per_10k_by_kind": {
                k: round(c * per10k, 2) for k, c in sorted(info_kinds.items())
            },
            "faults": faults,
        }
    return out


def real_target_met(summary: Mapping[str, Any]) -> bool:
    """<= 1 paging FP per 10k healthy steps and every real fault found, in both splits."""
    for split in ("tuning", "heldout"):
        s = summary[split]
        if s["false_positives_per_10k_healthy_steps"] > 1.0:
            return False
        if any(f["recall"] not in (None, 1.0) for f in s["faults"].values()):
            return False
    return True


__all__ = ["CORPUS", "CurveResult", "evaluate", "load_corpus", "real_target_met", "summarize"]
