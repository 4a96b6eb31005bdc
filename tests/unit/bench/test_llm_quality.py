"""The LLM-corpus harness on small synthetic curves, replayed through the real fold."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import llm_corpus
import llm_quality as q
import msgspec
import numpy as np
import pytest
from curve_events import Curve, curve_records

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.replay import Replayer, replay
from runwatch.schemas.events import AnomalyDetected, RestartRequested

CFG = DetectorConfig()


def synthetic(n: int = 900, seed: int = 0, run_id: str = "r") -> Curve:
    """A healthy falling loss with 1 % noise and log-normal grad norms."""
    rng = np.random.default_rng(seed)
    i = np.arange(n)
    return Curve(
        run_id=run_id,
        step=i.astype(np.int64),
        loss=3.0 + np.exp(-i / 200) + rng.normal(0.0, 0.01, n),
        grad_norm=0.3 * np.exp(rng.normal(0.0, 0.1, n)),
        step_time_s=np.full(n, 0.5),
        count=np.full(n, 1024, dtype=np.int64),
        restart_from=np.full(n, -1, dtype=np.int64),
        skipped=np.zeros(n, dtype=np.int8),
        world_size=8,
        vocab_size=50257,
    )


def as_run(curve: Curve, **meta: object) -> q.Run:
    full = {"name": curve.run_id, "split": "tuning", "family": "f", "owner": "o", **meta}
    return q.Run(meta=full, curve=curve, healthy=q.healthy_mask(full, curve.step))


def wire(result: object) -> bytes:
    """A replay result's verdicts and commands as bytes (NaN-safe equality)."""
    return msgspec.json.encode([result.anomalies, result.commands])  # type: ignore[attr-defined]


def test_a_replay_fed_in_parts_equals_one_fed_whole() -> None:
    base = synthetic(400)
    loss = base.loss.copy()
    loss[150] = float("nan")
    marker = base.restart_from.copy()
    marker[300] = 250
    curve = replace(base, loss=loss, restart_from=marker)
    whole, rows = curve_records(curve, 3)
    parts = Replayer(CFG)
    got_rows: dict[int, int] = {}
    for rng in (range(0, 120), range(120, 300), range(300, 400)):
        records, more = curve_records(curve, 3, rng)
        parts.feed(records)
        got_rows |= more
    assert got_rows == rows
    assert wire(parts.result()) == wire(replay(whole, CFG))
    assert {v.kind for v in replay(whole, CFG).anomalies} >= {"nonfinite_loss"}


@pytest.mark.parametrize("fault", list(q.FAULTS))
def test_a_fault_branch_is_the_faulted_run_replayed_whole(fault: str) -> None:
    run = as_run(synthetic())
    res = q.evaluate_run(run, CFG, partition=0, faults=[fault])
    row = q.injection_row(run)
    assert row == int(q.INJECT_AT * len(run.curve))
    bad, first = q.faulted(run.curve, row, fault, q.RESUME_JUMP)
    records, rows = curve_records(
        bad, 0, range(min(len(bad), first + q.FAULTS[fault].window_rows)), end=False
    )
    whole = q.judge(replay(records, CFG), rows, first, q.FAULTS[fault])
    assert res.faults[fault] == whole


def test_every_injected_fault_is_found_on_a_healthy_curve_and_the_control_is_quiet() -> None:
    res = q.evaluate_run(as_run(synthetic()), CFG, partition=0)
    assert res.pages == [] and res.commands == []
    f = res.faults
    assert (f["nan"].delay_rows, f["nan"].kind, f["nan"].rollback) == (0, "nonfinite_loss", True)
    assert (f["spike_x3"].delay_rows, f["spike_x3"].kind) == (0, "loss_spike")
    assert f["divergence"].delay_rows is not None and f["divergence"].rollback
    assert f["resume_no_optimizer"].kind == "restart_discontinuity"
    assert not f["good_resume"].paged


def test_faults_change_only_what_they_say() -> None:
    curve = synthetic(300)
    nan, row = q.faulted(curve, 200, "nan", 0.1)
    assert row == 200 and np.isnan(nan.loss[200]) and np.isnan(nan.grad_norm[200])  # type: ignore[index]
    assert np.array_equal(nan.loss[:200], curve.loss[:200])
    div, _ = q.faulted(curve, 200, "divergence", 0.1)
    assert div.loss[201] == pytest.approx(curve.loss[201] * 1.02**2)
    spike, _ = q.faulted(curve, 200, "spike_x3", 0.1)
    assert (
        spike.loss[200] == pytest.approx(3 * curve.loss[200]) and spike.loss[201] == curve.loss[201]
    )
    res, first = q.faulted(curve, 200, "resume_no_optimizer", 0.1)
    assert first == 200 + q.RESUME_CRASH_AFTER and len(res) == len(curve) + q.RESUME_CRASH_AFTER
    assert res.restart_from[first] == 199 and (res.restart_from >= 0).sum() == 1
    assert res.step[first] == 200 and res.loss[first] == pytest.approx(curve.loss[200] * 1.1)
    good, _ = q.faulted(curve, 200, "good_resume", 0.1)
    assert np.array_equal(good.loss[first:], curve.loss[200:])
    with pytest.raises(ValueError, match="unknown fault"):
        q.faulted(curve, 200, "bitflip", 0.1)


def test_a_run_nan_from_its_first_step_is_a_found_incident_not_a_false_page() -> None:
    curve = synthetic(60)
    curve = replace(curve, loss=np.full(60, np.nan), grad_norm=np.full(60, np.nan))
    run = as_run(curve, healthy=[], incidents=[{"kind": "nonfinite", "step": 0}])
    res = q.evaluate_run(run, CFG, partition=0)
    assert res.healthy_rows == 0 and res.pages == [] and res.faults == {}  # nothing to inject in
    ((kind, step, outcome),) = res.incidents
    assert (kind, step, outcome.delay_rows, outcome.rollback) == ("nonfinite", 0, 0, True)


def test_a_healthy_resume_is_judged_from_its_resumed_row() -> None:
    curve, first = q.resumed(synthetic(600), 500, 0.0)
    run = as_run(curve, incidents=[{"kind": "healthy_resume", "step": 500}])
    assert q._incident_rows(run) == [("healthy_resume", 500, first)]
    res = q.evaluate_run(run, CFG, partition=0, faults=())
    ((_, _, outcome),) = res.incidents
    assert not outcome.paged and res.pages == []
    with pytest.raises(ValueError, match="unknown incident kind 'meltdown'"):
        q._incident_rows(as_run(curve, incidents=[{"kind": "meltdown", "step": 3}]))


def _verdict(kind: str, severity: str, step: int, vid: str) -> AnomalyDetected:
    return AnomalyDetected(
        run_id="r", ts_ns=1, verdict_id=vid, kind=kind, step=step, severity=severity
    )  # type: ignore[arg-type]


def test_the_summary_counts_pages_per_10k_healthy_steps_and_commands() -> None:
    page = _verdict("loss_spike", "warning", 5, "v1")
    cmd = RestartRequested(
        run_id="r",
        ts_ns=1,
        command_id="c",
        action="rollback",
        cause_verdict_id="v1",
        cause_kind="loss_spike",
    )
    a = q.RunResult(
        "a", "tuning", "f", rows=20_000, healthy_rows=20_000, pages=[(5, page)], commands=[cmd]
    )
    b = q.RunResult(
        "b",
        "heldout",
        "f",
        rows=5_000,
        healthy_rows=5_000,
        info=[(3, _verdict("grad_norm_spike", "info", 3, "v2"))],
    )
    for res in (a, b):
        for fault in q.FAULTS:
            res.faults[fault] = q.Outcome(delay_rows=0 if q.FAULTS[fault].kinds else None)
    s = q.summarize_llm([a, b])
    assert s["tuning"]["pages_per_10k_healthy_steps"] == 0.5
    assert s["tuning"]["pages_per_10k_by_kind"] == {"loss_spike": 0.5}
    assert s["tuning"]["fleet_pages_per_hour"] == pytest.approx(1 / 20_000 * 100 * 3600, abs=0.1)
    assert s["tuning"]["commands_on_healthy_rows"] == 1 and s["heldout"]["pages"] == 0
    assert s["heldout"]["info_per_10k_by_kind"] == {"grad_norm_spike": 2.0}
    assert s["all"]["faults"]["nan"] == {
        "cases": 2,
        "found": 2,
        "recall": 1.0,
        "delay_median": 0.0,
        "delay_max": 0.0,
        "rollback": 0,
        "kinds": {},
    }
    assert not q.llm_target_met(s)  # a command on a healthy row
    a.commands = []
    assert q.llm_target_met(q.summarize_llm([a, b]))
    a.faults["nan"] = q.Outcome()
    assert not q.llm_target_met(q.summarize_llm([a, b]))


def test_without_a_corpus_the_bench_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(q.CorpusUnavailable, match=r"no LLM corpus at .*llm_corpus\.py"):
        q.load_runs(tmp_path)
    (tmp_path / llm_corpus.CORPUS_FILE).write_bytes(b"")
    (tmp_path / llm_corpus.BUILD_FILE).write_text(json.dumps({"manifest_sha256": "0" * 64}))
    with pytest.raises(q.CorpusUnavailable, match="built from another manifest"):
        q.load_runs(tmp_path)
    assert q.llm_section(CFG, tmp_path)["absent"].startswith("the LLM corpus at")
