"""The benign-spike census on hand-made curves."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import spike_census as sc

from runwatch.schemas.events import AnomalyDetected


def test_trailing_median_is_the_median_of_the_rows_before() -> None:
    x = np.random.default_rng(1).normal(size=130)
    got = sc.trailing_median(x, 50)
    assert np.isnan(got[:50]).all()
    for i in (50, 77, 129):
        assert got[i] == pytest.approx(np.median(x[i - 50 : i]))
    assert np.isnan(sc.trailing_median(x[:40], 50)).all()


def flat_with_episodes() -> np.ndarray:
    loss = np.full(400, 3.0)
    loss[100] = 3.6  # 1.2x for one row, back the next
    loss[200:203] = [3.3, 3.45, 3.3]  # peak 1.15x at row 201 ...
    loss[203:206] = [3.2, 3.1, 3.05]  # ... over 1.05x for 4 rows, below 3.225 (half) at 203
    return loss


def test_an_excursion_is_a_run_of_rows_over_the_floor_with_its_peak_and_recovery() -> None:
    loss = flat_with_episodes()
    healthy = np.ones(len(loss), dtype=bool)
    eps = sc.excursions(loss, healthy, 1.05)
    assert [(e["row"], e["rows"], e["back_below_half"]) for e in eps] == [(100, 1, 1), (200, 4, 2)]
    assert eps[0]["peak_ratio"] == pytest.approx(1.2) and eps[1]["peak_ratio"] == pytest.approx(
        1.15
    )
    assert [e["row"] for e in sc.excursions(loss, healthy, 1.18)] == [100]
    healthy[100] = False
    assert [e["row"] for e in sc.excursions(loss, healthy, 1.18)] == []


def test_rows_to_half_counts_until_below_half_the_rise() -> None:
    loss = np.array([3.0, 4.0, 3.6, 3.4, 3.0])
    assert sc.rows_to_half(loss, 1, 3.0) == 2  # half is 3.5: row 3
    assert sc.rows_to_half(np.array([3.0, 4.0, 3.9]), 1, 3.0) is None


def _page(step: int, value: float, base: float, detail: str = "") -> AnomalyDetected:
    return AnomalyDetected(
        run_id="r",
        ts_ns=1,
        verdict_id=f"v{step}",
        kind="loss_spike",
        step=step,
        value=value,
        baseline=base,
        detail=detail,
    )


def test_the_page_census_sizes_recoveries_and_shared_steps() -> None:
    loss = flat_with_episodes()
    runs, results = [], []
    for owner in ("a", "a", "b"):
        runs.append(
            SimpleNamespace(
                name=owner, meta={"family": "fam", "owner": owner}, curve=SimpleNamespace(loss=loss)
            )
        )
        results.append(SimpleNamespace(pages=[(100, _page(100, 3.6, 3.0))], info=[]))
    results[0].pages.append((201, _page(201, 3.45, 3.0, "sustained rise")))
    grad = AnomalyDetected(
        run_id="r", ts_ns=1, verdict_id="g", kind="grad_norm_spike", step=99, severity="info"
    )
    results[1].info = [(99, grad), (150, grad)]  # one just before a loss page, one alone
    results[2].info = []
    results[0].info = []
    census = sc.page_census(runs, results)
    assert census["loss_spike_pages"] == 4 and census["sustained_rule"] == 1
    assert census["ratio_to_median"]["max"] == pytest.approx(1.2)
    assert (
        census["rows_back_below_half_rise"]["1"] == 3
        and census["rows_back_below_half_rise"]["2-3"] == 1
    )
    fam = census["same_step_across_runs"]["fam"]
    assert fam["pages_at_a_step_paged_in_2plus_runs"] == 3 and fam["top_steps"] == [[100, 3]]
    assert census["same_step_across_runs"]["b"]["steps_paged_in_2plus_runs"] == 0
    assert fam["loss_spike_pages"] == 4
    assert census["grad_norm_spikes"] == 2
    assert census["grad_norm_spikes_with_a_loss_page_within_3_rows_after"] == 1
    assert census["loss_spike_pages_with_a_grad_norm_spike_within_3_rows"] == 1
