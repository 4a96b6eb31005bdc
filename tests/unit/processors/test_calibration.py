"""The fleet calibration fold: runs' verdicts -> fleet figures, today vs proposed."""

from __future__ import annotations

import msgspec
import pytest

from runwatch.cmd.replay import parse_since
from runwatch.common.errors import UsageError
from runwatch.processors.calibration import (
    PageRow,
    RunPages,
    RunVerdicts,
    calibrate,
    calibration_report,
    fleet_figures,
    pages,
    recorded_verdicts,
    render_report,
    replayed_verdicts,
    select_runs,
)
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.replay import Record, replay
from runwatch.schemas.events import RestartRequested
from runwatch.schemas.topics import TopicRole
from tests.unit.core.factories import (
    healthy_losses,
    restart,
    src,
    started,
    step,
    verdict,
)


def _fleet() -> list[RunVerdicts]:
    return [
        RunVerdicts(
            run_id="a",
            steps_judged=6_000,
            anomalies=(
                verdict("loss_spike", 10, run="a", detail="x2"),
                verdict("grad_norm_spike", 11, run="a", severity="info"),
                verdict("loss_spike", 40, run="a", detail="x3"),
            ),
        ),
        RunVerdicts(
            run_id="b",
            steps_judged=3_000,
            anomalies=(verdict("nonfinite_loss", 7, run="b", severity="critical", rank=1),),
            commands=(restart("rollback", "nonfinite_loss", run="b"),),
        ),
        RunVerdicts(run_id="c", steps_judged=1_000),
    ]


def test_severity_warning_and_above_pages() -> None:
    assert [pages(s) for s in ("info", "warning", "critical")] == [False, True, True]


def test_fleet_figures_count_pages_info_and_commands_exactly() -> None:
    f = fleet_figures(_fleet(), top_n=1)
    assert (f.runs, f.steps_judged, f.pages, f.runs_paging) == (3, 10_000, 3, 2)
    assert f.pages_per_10k_steps == 3.0
    assert f.pages_by_kind == {"loss_spike": 2, "nonfinite_loss": 1}
    assert f.pages_per_10k_steps_by_kind == {"loss_spike": 2.0, "nonfinite_loss": 1.0}
    assert f.info_by_kind == {"grad_norm_spike": 1}
    assert f.commands_by_action == {"rollback": 1}
    assert f.commands_per_run_by_action == {"rollback": 0.333}
    # top 1: the run with most pages, and its first page only
    assert f.top_runs == [
        RunPages(
            run_id="a",
            steps_judged=6_000,
            pages=2,
            pages_by_kind={"loss_spike": 2},
            first_pages=[
                PageRow(
                    run_id="a",
                    step=10,
                    kind="loss_spike",
                    severity="warning",
                    rank=None,
                    detail="x2",
                )
            ],
        )
    ]


def test_ties_list_runs_by_id_and_no_steps_gives_zero_rates() -> None:
    runs = [
        RunVerdicts(run_id="z", steps_judged=0, anomalies=(verdict("hang", 0, run="z"),)),
        RunVerdicts(run_id="y", steps_judged=0, anomalies=(verdict("hang", 0, run="y"),)),
    ]
    f = fleet_figures(runs)
    assert [r.run_id for r in f.top_runs] == ["y", "z"]
    assert f.pages_per_10k_steps == 0.0 and f.pages == 2


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="more than once: a"):
        fleet_figures([RunVerdicts(run_id="a", steps_judged=1)] * 2)
    with pytest.raises(ValueError, match="top_n"):
        fleet_figures([], top_n=-1)
    with pytest.raises(ValueError, match="same runs"):
        calibration_report(_fleet(), _fleet()[:1], config_hash="h", overrides={})


def test_report_says_whether_proposed_differs_from_the_record() -> None:
    today = _fleet()
    same = calibration_report(today, today, config_hash="h", overrides={})
    assert not same.differs
    assert "recorded live (today): the same pages and commands" in render_report(same)
    quiet = [msgspec.structs.replace(r, anomalies=()) for r in today]
    proposed = calibration_report(
        quiet, today, config_hash="h2", overrides={"loss_z_thresh": "9"}, notes=["n1"]
    )
    assert proposed.differs
    assert (proposed.proposed.pages, proposed.recorded.pages) == (0, 3)
    text = render_report(proposed)
    assert "settings loss_z_thresh=9 (config h2)" in text
    assert "recorded live (today):\n  pages (severity >= warning): 3 (3.00 per 10k steps)" in text
    assert text.endswith("note: n1")


def test_replayed_and_recorded_verdicts_of_a_real_replay() -> None:
    losses = healthy_losses(60, seed=3)
    losses[45] = losses[44] * 4  # a spike the default threshold pages on
    records = [(TopicRole.STEPS, src(0), started("s"))]
    records += [(TopicRole.STEPS, src(i + 1), step(i, x, run="s")) for i, x in enumerate(losses)]
    result = replay(records, DetectorConfig())
    mine = replayed_verdicts("s", result)
    assert mine.steps_judged == 60
    assert [(a.kind, a.step) for a in mine.anomalies] == [("loss_spike", 45)]
    assert replayed_verdicts("other", result) == RunVerdicts(run_id="other", steps_judged=0)
    log = [(TopicRole.ANOMALIES, src(0), a) for a in result.anomalies]
    assert recorded_verdicts("s", 60, log, result.commands) == mine
    report = calibration_report([mine], [mine], config_hash=result.config_hash, overrides={})
    assert report.proposed.pages_by_kind == {"loss_spike": 1}
    assert report.proposed.pages_per_10k_steps == round(10_000 / 60, 3)


class _Log(msgspec.Struct, frozen=True):
    run_id: str
    inputs: list[Record]
    recorded_anomalies: list[Record] = []
    recorded_commands: list[RestartRequested] = []


def _begun(run: str, ts_ns: int) -> _Log:
    return _Log(run, [(TopicRole.STEPS, src(0), started(run, ts_ns=ts_ns))])


def test_select_runs_keeps_those_begun_since_then_the_latest() -> None:
    logs = [_begun("a", 30), _begun("b", 10), _begun("c", 20), _Log("d", [])]
    assert [x.run_id for x in select_runs(logs)] == ["a", "b", "c", "d"]
    assert [x.run_id for x in select_runs(logs, since_ns=20)] == ["a", "c"]
    assert [x.run_id for x in select_runs(logs, last=2)] == ["a", "c"]
    assert [x.run_id for x in select_runs(logs, since_ns=0, last=1)] == ["a"]
    with pytest.raises(ValueError, match=">= 1"):
        select_runs(logs, last=0)


def test_calibrate_leaves_out_runs_without_input_and_says_so() -> None:
    report = calibrate(
        [_begun("a", 0), _Log("d", [])], DetectorConfig(), "h", overrides={}, notes=["n0"]
    )
    assert report.proposed.runs == 1
    assert report.notes == ["n0", "run d: no input records to replay (left out)"]


def test_since_takes_an_iso_time_or_an_age() -> None:
    assert parse_since("36h", now_s=200_000.0) == (200_000 - 36 * 3600) * 10**9
    assert parse_since("2026-12-01T00:00Z", now_s=0.0) == 1_796_083_200 * 10**9
    assert parse_since("2026-12-01T01:00", now_s=0.0) == (1_796_083_200 + 3600) * 10**9
    with pytest.raises(UsageError, match="--since"):
        parse_since("yesterday", now_s=0.0)
