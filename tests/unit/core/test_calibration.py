"""The fleet calibration report over replays (processors/core/calibration.py)."""

from __future__ import annotations

import math

from runwatch.processors.core.calibration import fleet_report
from runwatch.processors.core.config import DetectorConfig, config_hash, with_overrides
from runwatch.processors.core.replay import Record, replay
from runwatch.schemas.topics import TopicRole
from tests.unit.core.factories import healthy_losses, src, started, step

CFG = DetectorConfig()


def steps_log(run: str, losses: list[float]) -> list[Record]:
    events = [started(run=run)] + [step(i + 1, x, run=run) for i, x in enumerate(losses)]
    return [(TopicRole.STEPS, src(i, "steps"), e) for i, e in enumerate(events)]


def fleet(cfg: DetectorConfig = CFG):  # type: ignore[no-untyped-def]
    healthy = healthy_losses(200, seed=4)
    broken = list(healthy)
    broken[99] = math.nan  # critical, a rollback
    broken[149] *= 3.0  # past the magnitude floor: a loss_spike page
    blip = list(healthy)
    blip[79] += 1.0  # ~1.4x, back at once: an info episode
    logs = {"a-healthy": healthy, "b-broken": broken, "c-blip": blip}
    return fleet_report(
        config_hash(cfg), [(run, replay(steps_log(run, xs), cfg)) for run, xs in logs.items()]
    )


def test_the_report_counts_pages_info_and_commands_per_run() -> None:
    report = fleet()
    assert report.config_hash == config_hash(CFG) and report.steps == 600
    assert [(r.run_id, r.steps, r.pages, r.info, r.commands) for r in report.runs] == [
        ("a-healthy", 200, 0, 0, 0),
        ("b-broken", 200, 2, 0, 1),
        ("c-blip", 200, 0, 1, 0),
    ]
    assert report.pages_by_kind == {"loss_spike": 1, "nonfinite_loss": 1}
    assert report.info_by_kind == {"loss_spike": 1}
    assert report.per_10k_steps(report.pages_by_kind) == {
        "loss_spike": 16.667,
        "nonfinite_loss": 16.667,
    }
    assert report.commands_per_run() == 1 / 3
    assert [(p.run_id, p.step, p.kind, p.severity) for p in report.pages] == [
        ("b-broken", 100, "nonfinite_loss", "critical"),
        ("b-broken", 150, "loss_spike", "warning"),
    ]


def test_shadow_settings_show_what_would_be_commanded_without_commanding() -> None:
    report = fleet(with_overrides(CFG, {"shadow_kinds": "nonfinite_loss"}))
    (broken,) = [r for r in report.runs if r.run_id == "b-broken"]
    assert (broken.commands, broken.shadow_commands) == (0, 1)
    assert [p.shadow for p in report.pages] == [True, False]
