"""What the benign loss spikes of real pretraining look like (figures for the spike detector).

Two views of the healthy rows of the LLM corpus (`bench/llm_quality.py` loads and replays it):

* **the pages**: every paging verdict the current detectors raise on a healthy row. For a
  ``loss_spike``: its size (the loss over the verdict's baseline median), how many logged
  steps until the loss is back below half its rise (``baseline + (value - baseline) / 2``),
  whether it was the one-step rule or the sustained (CUSUM) one, and how often the same
  step pages in several runs of one family or one owner (a shared data order makes the
  same benign spikes);
* **the excursions**, independent of any detector: per magnitude floor ``f``, an episode is
  a maximal stretch of consecutive rows whose loss is at least ``f`` times the median of
  the ``WINDOW`` rows before it; per episode its peak, its length and the rows from the
  peak until the loss is back below half the peak's rise. This is what an episode-based
  spike detector with a relative magnitude floor would see.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

WINDOW = 50
"""Rows of the trailing median an excursion is measured against (the loss window's size)."""
FLOORS = (1.03, 1.05, 1.10, 1.20)
RECOVERY_HORIZON = 500
"""Rows searched for a recovery; none within them counts as not recovered."""
RECOVERY_BUCKETS = ((1, 1), (2, 3), (4, 10), (11, 100), (101, RECOVERY_HORIZON))
LENGTH_BUCKETS = ((1, 1), (2, 3), (4, 10), (11, 10**9))
RATIO_EDGES = (1.0, 1.02, 1.05, 1.1, 1.2, 1.5, 2.0, float("inf"))
NEAR_ROWS = 3
"""A grad-norm spike and a loss page this many rows apart count as one event."""


def trailing_median(loss: np.ndarray, window: int = WINDOW) -> np.ndarray:
    """Median of the ``window`` rows before each row (NaN for the first ``window`` rows)."""
    out = np.full(len(loss), np.nan)
    if len(loss) > window:
        windows = np.lib.stride_tricks.sliding_window_view(loss, window)[:-1]
        out[window:] = np.median(windows, axis=1)
    return out


def rows_to_half(loss: np.ndarray, row: int, baseline: float) -> int | None:
    """Rows after ``row`` until the loss is below half its rise over ``baseline``."""
    half = baseline + (float(loss[row]) - baseline) / 2.0
    later = loss[row + 1 : row + 1 + RECOVERY_HORIZON]
    below = np.flatnonzero(later < half)
    return int(below[0]) + 1 if len(below) else None


def _bucket(value: int | None, buckets: Sequence[tuple[int, int]]) -> str:
    if value is None:
        return "never"
    for lo, hi in buckets:
        if lo <= value <= hi:
            return f"{lo}" if lo == hi else f"{lo}-{hi}" if hi < 10**9 else f">={lo}"
    return "never"


def _histogram(
    values: Sequence[int | None], buckets: Sequence[tuple[int, int]], *, never: bool = True
) -> dict[str, int]:
    """Counts per bucket; ``never`` adds the bucket of None (not recovered)."""
    counts = Counter(_bucket(v, buckets) for v in values)
    keys = [_bucket(lo, buckets) for lo, _ in buckets] + (["never"] if never else [])
    return {k: counts.get(k, 0) for k in keys}


def _ratio_histogram(ratios: Sequence[float]) -> dict[str, int]:
    edges = RATIO_EDGES
    out = {}
    for lo, hi in itertools.pairwise(edges):
        label = f"{lo:g}-{hi:g}x" if hi != float("inf") else f">={lo:g}x"
        out[label] = sum(1 for r in ratios if lo <= r < hi)
    return out


def _quantiles(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    arr = np.asarray(values, dtype=np.float64)
    return {
        q: round(float(np.quantile(arr, p)), 4)
        for q, p in (("min", 0.0), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))
    }


def page_census(runs: Sequence[Any], results: Sequence[Any]) -> dict[str, Any]:
    """The current detectors' pages on healthy rows, characterised (see the module doc).

    Args:
        runs: `llm_quality.Run` per run.
        results: `llm_quality.RunResult` of the same runs, in the same order.
    """
    ratios: list[float] = []
    recovery: list[int | None] = []
    sustained = 0
    kinds: Counter[str] = Counter()
    by_family: dict[str, Counter[int]] = defaultdict(Counter)
    by_owner: dict[str, Counter[int]] = defaultdict(Counter)
    spike_pages = 0
    grad_spikes = grad_then_loss = loss_with_grad = 0
    for run, res in zip(runs, results, strict=True):
        family, owner = str(run.meta["family"]), str(run.meta.get("owner", run.name))
        loss_rows = [row for row, v in res.pages if v.kind == "loss_spike"]
        grad_rows = [row for row, v in (*res.pages, *res.info) if v.kind == "grad_norm_spike"]
        grad_spikes += len(grad_rows)
        grad_then_loss += sum(any(0 <= lr - g <= NEAR_ROWS for lr in loss_rows) for g in grad_rows)
        loss_with_grad += sum(any(abs(lr - g) <= NEAR_ROWS for g in grad_rows) for lr in loss_rows)
        for row, v in res.pages:
            kinds[v.kind] += 1
            if v.kind != "loss_spike":
                continue
            spike_pages += 1
            by_family[family][int(v.step)] += 1
            by_owner[owner][int(v.step)] += 1
            if "sustained" in v.detail:
                sustained += 1
            if v.value is not None and v.baseline:
                ratios.append(float(v.value) / float(v.baseline))
                recovery.append(rows_to_half(run.curve.loss, row, float(v.baseline)))
    shared = {
        name: {
            "loss_spike_pages": sum(steps.values()),
            "pages_at_a_step_paged_in_2plus_runs": sum(c for c in steps.values() if c >= 2),
            "steps_paged_in_2plus_runs": sum(1 for c in steps.values() if c >= 2),
            "top_steps": [[s, c] for s, c in steps.most_common(5) if c >= 2],
        }
        for groups in (by_family, by_owner)
        for name, steps in sorted(groups.items())
    }
    return {
        "pages_by_kind": dict(kinds),
        "loss_spike_pages": spike_pages,
        "sustained_rule": sustained,
        "ratio_to_median": _quantiles(ratios),
        "ratio_histogram": _ratio_histogram(ratios),
        "rows_back_below_half_rise": _histogram(recovery, RECOVERY_BUCKETS),
        "same_step_across_runs": shared,
        "grad_norm_spikes": grad_spikes,
        "grad_norm_spikes_with_a_loss_page_within_3_rows_after": grad_then_loss,
        "loss_spike_pages_with_a_grad_norm_spike_within_3_rows": loss_with_grad,
    }


def excursions(loss: np.ndarray, healthy: np.ndarray, floor: float) -> list[dict[str, Any]]:
    """Episodes of one run's healthy rows at least ``floor`` times the trailing median."""
    med = trailing_median(loss)
    with np.errstate(invalid="ignore", divide="ignore"):
        over = (loss / med >= floor) & healthy & np.isfinite(med)
    out: list[dict[str, Any]] = []
    idx = np.flatnonzero(over)
    if not len(idx):
        return out
    breaks = np.flatnonzero(np.diff(idx) != 1)
    starts = np.concatenate([[0], breaks + 1])
    ends = np.concatenate([breaks, [len(idx) - 1]])
    for a, b in zip(starts, ends, strict=True):
        rows = idx[a : b + 1]
        first = int(rows[0])
        base = float(med[first])
        peak = int(rows[np.argmax(loss[rows])])
        out.append(
            {
                "row": first,
                "peak_ratio": float(loss[peak]) / base,
                "rows": len(rows),
                "back_below_half": rows_to_half(loss, peak, base),
            }
        )
    return out


def excursion_census(runs: Sequence[Any], floors: Sequence[float] = FLOORS) -> dict[str, Any]:
    """Per floor: episodes per 10k healthy steps, their lengths, peaks and recoveries."""
    healthy_steps = sum(int(r.healthy.sum()) for r in runs)
    out: dict[str, Any] = {"healthy_steps": healthy_steps}
    for floor in floors:
        eps = [e for r in runs for e in excursions(r.curve.loss, r.healthy, floor)]
        out[f"{floor:g}x"] = {
            "episodes": len(eps),
            "per_10k_healthy_steps": round(len(eps) * 10_000 / max(1, healthy_steps), 3),
            "peak_ratio": _quantiles([e["peak_ratio"] for e in eps]),
            "length_rows": _histogram([e["rows"] for e in eps], LENGTH_BUCKETS, never=False),
            "rows_back_below_half_rise": _histogram(
                [e["back_below_half"] for e in eps], RECOVERY_BUCKETS
            ),
        }
    return out


def print_census(census: Mapping[str, Any]) -> None:
    """The census as a few readable lines."""
    pages = census["pages"]
    print(
        f"benign-spike census: {pages['loss_spike_pages']} loss_spike pages on healthy rows "
        f"({pages['sustained_rule']} by the sustained rule); pages by kind {pages['pages_by_kind']}"
    )
    print(f"  size (loss / baseline median): {pages['ratio_to_median']}")
    print(f"  size histogram: {pages['ratio_histogram']}")
    print(f"  rows until back below half the rise: {pages['rows_back_below_half_rise']}")
    print(
        f"  grad_norm_spike verdicts: {pages['grad_norm_spikes']}, followed by a loss page within "
        f"{NEAR_ROWS} rows: {pages['grad_norm_spikes_with_a_loss_page_within_3_rows_after']}; "
        f"loss pages with a grad_norm_spike within {NEAR_ROWS} rows: "
        f"{pages['loss_spike_pages_with_a_grad_norm_spike_within_3_rows']}"
    )
    for name, shared in pages["same_step_across_runs"].items():
        if shared["steps_paged_in_2plus_runs"]:
            print(
                f"  {name}: {shared['pages_at_a_step_paged_in_2plus_runs']} of "
                f"{shared['loss_spike_pages']} loss pages at "
                f"{shared['steps_paged_in_2plus_runs']} steps paged in 2+ runs; "
                f"top [step, runs]: {shared['top_steps']}"
            )
    exc = census["excursions"]
    print(
        f"  excursions over the trailing {WINDOW}-row median ({exc['healthy_steps']} healthy "
        f"steps):"
    )
    for key, e in exc.items():
        if key == "healthy_steps":
            continue
        print(
            f"    >= {key}: {e['episodes']} episodes ({e['per_10k_healthy_steps']}/10k), "
            f"length {e['length_rows']}, back below half {e['rows_back_below_half_rise']}, "
            f"peak {e['peak_ratio']}"
        )


__all__ = [
    "FLOORS",
    "WINDOW",
    "excursion_census",
    "excursions",
    "page_census",
    "print_census",
    "rows_to_half",
    "trailing_median",
]
