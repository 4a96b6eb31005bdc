"""TrainingHealthMonitor: seed 000's in-process API, on the same reducers."""

from __future__ import annotations

import json
import math

import pytest

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.monitor import TrainingHealthMonitor
from tests.unit.core.factories import GPT2_SMALL, healthy_losses, kinds


def test_seed_defaults_and_explicit_keywords() -> None:
    m = TrainingHealthMonitor()
    assert (m.config.loss_window, m.config.loss_min_periods, m.config.loss_z_thresh) == (20, 5, 6.0)
    assert m.config.rank_heartbeat_threshold == 50
    m = TrainingHealthMonitor(loss_z_thresh=8.0)
    assert (m.config.loss_window, m.config.loss_z_thresh) == (20, 8.0)
    m = TrainingHealthMonitor.from_config(DetectorConfig())
    assert m.config == DetectorConfig()


def test_nonfinite_fires_during_warmup() -> None:
    m = TrainingHealthMonitor()
    assert kinds(m.observe_step(1, math.nan, grad_norm=math.inf)) == [
        "nonfinite_loss",
        "nonfinite_grad_norm",
    ]


def test_spike_only_after_warmup_and_returned_and_recorded() -> None:
    m = TrainingHealthMonitor()
    assert m.observe_step(1, 2.0) == [] and m.observe_step(2, 50.0) == []
    for n in range(3, 12):
        m.observe_step(n, 2.0 + 0.01 * (n % 3))
    got = m.observe_step(12, 50.0)
    assert kinds(got) == ["loss_spike"] and m.anomalies[-1] == got[0]


def test_check_rank_liveness_once_per_outage_and_recovery() -> None:
    m = TrainingHealthMonitor(rank_heartbeat_threshold=5)

    def steps(first: int, last: int, ranks: tuple[int, ...]) -> None:
        for n in range(first, last + 1):
            for r in ranks:
                m.observe_rank_step(r, n)

    steps(1, 3, (0, 1, 2))
    steps(4, 19, (0, 1))
    assert [(v.rank, v.kind) for v in m.check_rank_liveness(19)] == [(2, "dead_rank")]
    steps(20, 25, (0, 1))
    assert m.check_rank_liveness(25) == [], "once per outage"
    steps(26, 26, (0, 1, 2))
    assert m.liveness_state is not None and 2 not in m.liveness_state.dead_ranks
    steps(27, 32, (0, 1))
    assert [v.rank for v in m.check_rank_liveness(32)] == [2]


def test_restart_continuity_receipts() -> None:
    truth = healthy_losses(200, seed=5, noise=0.02)
    m = TrainingHealthMonitor(loss_window=50, loss_min_periods=10)
    for n in range(1, 121):
        m.observe_step(n, truth[n - 1], step_time_s=0.5)
    for n in range(101, 141):  # good resume from 100
        m.observe_step(n, truth[n - 1], step_time_s=0.5, restart=n == 101)
    assert m.continuity_ok()
    for n in range(131, 160):  # bad resume from 130: the loss jumps
        m.observe_step(n, truth[n - 1] + 1.0, step_time_s=0.5, restart=n == 131)
    assert not m.continuity_ok()
    report = m.report()
    assert [r["continuity"] for r in report["restarts"]] == ["ok", "broken"]
    assert [r["from_step"] for r in report["restarts"]] == [100, 130]


def test_report_is_json_and_has_the_receipts() -> None:
    m = TrainingHealthMonitor(
        flop_config=GPT2_SMALL, peak_flops_per_sec=312e12, world_size=2, vocab_size=50257
    )
    for n in range(1, 41):
        m.observe_step(
            n,
            4.0 - 0.05 * n if n != 30 else math.nan,
            grad_norm=1.0,
            step_time_s=0.25,
            batch_size=32,
        )
        m.observe_rank_step(0, n, step_time_s=0.25)
        m.observe_rank_step(1, n, step_time_s=0.25)
    for n in range(30, 41):
        m.observe_step(
            n,
            4.0 - 0.05 * n,
            grad_norm=1.0,
            step_time_s=0.25,
            batch_size=32,
            restart=n == 30,
            restart_from_step=29 if n == 30 else None,
        )
    report = m.report()
    text = json.dumps(report, allow_nan=False)
    assert json.loads(text) == report
    assert report["steps"]["kept"] == 40 and report["steps"]["observed"] == 51
    assert report["mfu"]["convention"] == "6N+attn"
    assert report["mfu"]["run"] == pytest.approx(0.3610308, abs=1e-6)
    assert report["anomalies"]["by_kind"] == {"nonfinite_loss": 1}
    assert [c["action"] for c in report["commands"]] == ["rollback"]
    assert report["commands"][0]["max_checkpoint_step"] == 29
    assert report["time"]["effective_training_time_ratio"] == pytest.approx(40 / 51)
    assert report["liveness"]["dead_ranks"] == []
