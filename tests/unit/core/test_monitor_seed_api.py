"""Seed 000's ``training_health`` API, checked line by line against the seed's text.

Each test names the sentence of the seed it checks. The last part checks that the
monitor's verdicts are the stream processors' verdicts: the same story, sent as the Kafka
events a RunEmitter would publish and folded by ``replay``, gives the same verdict ids,
values and commands.
"""

from __future__ import annotations

import inspect
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from runwatch.processors.core.baseline import RollingBaseline as BaselineValue
from runwatch.processors.core.config import DetectorConfig, with_overrides
from runwatch.processors.core.monitor import (
    Anomaly,
    MFUSample,
    ModelFlopConfig,
    RollingBaseline,
    StepRecord,
    TrainingHealthMonitor,
    flop_config_from_causal_lm,
    theoretical_flops_per_iter,
)
from runwatch.processors.core.replay import Record, replay
from runwatch.schemas.events import Heartbeat, Provenance, RunStarted, StepCompleted
from tests.unit.core.factories import GPT2_SMALL, healthy_losses

ROOT = Path(__file__).resolve().parents[3]


def defaults(obj: object) -> dict[str, object]:
    return {
        name: p.default
        for name, p in inspect.signature(obj).parameters.items()  # type: ignore[arg-type]
        if p.default is not inspect.Parameter.empty
    }


def params(obj: object) -> list[str]:
    return list(inspect.signature(obj).parameters)  # type: ignore[arg-type]


# --- names and signatures ---------------------------------------------------------------


def test_signatures_are_the_seeds() -> None:
    assert params(Anomaly)[:6] == [
        "step",
        "kind",
        "value",
        "baseline",
        "z_score",
        "detected_at_step",
    ]
    assert params(ModelFlopConfig) == ["n_params", "n_layer", "n_head", "d_model", "seq_len"]
    assert params(MFUSample) == ["step", "step_flops", "step_time_s", "peak_flops_per_sec"]
    assert params(StepRecord) == ["step", "loss", "grad_norm", "step_time_s", "restart"]
    assert defaults(StepRecord) == {"grad_norm": None, "step_time_s": None, "restart": False}
    assert defaults(RollingBaseline) == {"window": 20, "min_periods": 5, "min_scale_rel": 1e-3}
    assert defaults(TrainingHealthMonitor) == {
        "flop_config": None,
        "peak_flops_per_sec": None,
        "loss_window": 20,
        "loss_min_periods": 5,
        "loss_z_thresh": 6.0,
        "grad_window": 20,
        "grad_min_periods": 5,
        "grad_z_thresh": 6.0,
        "rank_heartbeat_threshold": 50,
        # additions, keyword-only with defaults:
        "run_id": "inproc",
        "vocab_size": None,
        "world_size": 0,
        "dtype": "",
        "max_records": 100_000,
    }
    init = inspect.signature(TrainingHealthMonitor).parameters.values()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in init)
    assert params(TrainingHealthMonitor.observe_step)[:8] == [
        "self",
        "step",
        "loss",
        "grad_norm",
        "step_time_s",
        "batch_size",
        "restart",
        "restart_from_step",
    ]
    assert defaults(TrainingHealthMonitor.observe_step) == {
        "grad_norm": None,
        "step_time_s": None,
        "batch_size": None,
        "restart": False,
        "restart_from_step": None,
        "tokens": None,
        "ts_ns": None,
    }
    assert params(TrainingHealthMonitor.observe_rank_step)[:3] == ["self", "rank", "step"]
    assert params(TrainingHealthMonitor.check_rank_liveness) == ["self", "current_step"]
    assert params(flop_config_from_causal_lm) == ["model", "seq_len"]
    flops = inspect.signature(theoretical_flops_per_iter).parameters
    assert list(flops)[:6] == ["n_params", "n_layer", "n_head", "d_model", "seq_len", "batch_size"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in flops.values())


def test_the_module_imports_no_torch() -> None:
    code = (
        "import sys, runwatch.processors.core.monitor as th; "
        "assert 'torch' not in sys.modules, 'torch imported'; print(len(th.__all__))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "10"


def test_model_flop_config_is_positional_as_in_the_seed() -> None:
    assert ModelFlopConfig(124_356_864, 12, 12, 768, 1024) == GPT2_SMALL


# --- RollingBaseline --------------------------------------------------------------------


def test_baseline_is_none_during_warmup_then_median_and_scaled_mad() -> None:
    """Seed: "(median, scaled_mad) of the current window, or None during warmup"."""
    b = RollingBaseline(window=20, min_periods=5)
    for v in [1.0, 2.0, 3.0, 4.0]:
        assert b.baseline() is None and b.z_score(v) is None
        b.update(v)
    assert b.baseline() is None
    b.update(5.0)
    assert b.baseline() == pytest.approx((3.0, 1.4826 * 1.0))
    assert len(b) == 5 and b.ready


def test_update_mutates_so_the_seed_loop_scores() -> None:
    """The trap of issue 9: ``b.update(v); b.z_score(x)`` must not stay None."""
    b = RollingBaseline()
    for v in [2.0, 2.1, 1.9, 2.0, 2.05]:
        assert b.update(v) is None  # type: ignore[func-returns-value]
    assert b.z_score(2.0) is not None


def test_z_score_is_causal_scored_before_update() -> None:
    """Seed: "evaluated against the window as it stood before value was seen"."""
    b = RollingBaseline(window=20, min_periods=5)
    for v in [1.0, 2.0, 3.0, 4.0, 5.0]:
        b.update(v)
    z = b.z_score(100.0)
    assert z == pytest.approx((100.0 - 3.0) / 1.4826)
    assert b.baseline() == pytest.approx((3.0, 1.4826)), "scoring does not add the value"
    b.update(100.0)
    assert b.baseline() == pytest.approx((3.5, 1.4826 * 1.5))
    later = b.z_score(100.0)
    assert later is not None and later < z, "once added, the value is part of the baseline"


def test_median_mad_is_not_blown_up_by_an_earlier_spike() -> None:
    """Seed: "so a previous spike does not itself blow up the spread used to judge the next one"."""
    calm, spiked = RollingBaseline(), RollingBaseline()
    values = [2.0 + 0.01 * (i % 5) for i in range(20)]
    for i, v in enumerate(values):
        calm.update(v)
        spiked.update(1000.0 if i == 10 else v)
    calm_stats, spiked_stats = calm.baseline(), spiked.baseline()
    assert calm_stats is not None and spiked_stats is not None
    assert spiked_stats[1] < 1.5 * calm_stats[1]
    z = spiked.z_score(50.0)
    assert z is not None and z > 6.0, "the next spike is still caught"


def test_window_keeps_the_newest_values() -> None:
    b = RollingBaseline(window=5, min_periods=5)
    for v in range(10):
        b.update(float(v))
    assert b.baseline() == pytest.approx((7.0, 1.4826))
    assert b.state()["values"] == [5.0, 6.0, 7.0, 8.0, 9.0]


def test_state_is_a_json_snapshot_that_carries_across_a_restart() -> None:
    """Seed: "Serializable snapshot - carry this across a checkpoint/restart"."""
    b = RollingBaseline(window=10, min_periods=3)
    for v in healthy_losses(25, seed=3):
        b.update(v)
    text = json.dumps(b.state(), allow_nan=False)
    resumed = RollingBaseline.from_state(json.loads(text))
    assert resumed.baseline() == b.baseline() and resumed.z_score(3.0) == b.z_score(3.0)
    resumed.update(2.5)
    assert resumed.baseline() != b.baseline(), "the copy is independent"


def test_non_finite_update_is_refused_and_changes_nothing() -> None:
    b = RollingBaseline(window=5, min_periods=1)
    b.update(1.0)
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match="finite"):
            b.update(bad)
        assert b.z_score(bad) is None
    assert b.state()["values"] == [1.0]


def test_mutable_baseline_is_the_core_arithmetic() -> None:
    values = healthy_losses(60, seed=9)
    b, core = RollingBaseline(window=20, min_periods=5), BaselineValue(20, 5)
    for v in values:
        assert b.z_score(v) == core.z_score(v)
        b.update(v)
        core = core.with_value(v)
    assert b.value == core
    assert RollingBaseline.from_value(core).baseline() == core.baseline()


# --- TrainingHealthMonitor --------------------------------------------------------------


def warm(m: TrainingHealthMonitor, n: int, *, first: int = 1) -> list[float]:
    losses = [2.0 + 0.01 * (i % 3) for i in range(n)]
    for i, loss in enumerate(losses):
        assert m.observe_step(first + i, loss, grad_norm=1.0 + 0.01 * (i % 2)) == []
    return losses


def test_nan_and_inf_always_fire_even_during_warmup() -> None:
    """Seed: "NaN/Inf checks on both streams (these always fire, independent of ... warmup)"."""
    m = TrainingHealthMonitor()
    got = m.observe_step(1, math.nan, grad_norm=math.inf)
    assert [(a.kind, a.step, a.detected_at_step) for a in got] == [
        ("nonfinite_loss", 1, 1),
        ("nonfinite_grad_norm", 1, 1),
    ]
    assert math.isnan(got[0].value or 0.0) and got[1].value == math.inf
    warm(m, 10, first=2)
    assert [a.kind for a in m.observe_step(12, math.inf)] == ["nonfinite_loss"]
    assert m.anomalies[-1].kind == "nonfinite_loss"


def test_no_spike_during_warmup_then_a_causal_robust_z() -> None:
    """A spike before ``loss_min_periods`` values is not judged; after it, z is the seed's."""
    m = TrainingHealthMonitor()
    assert m.observe_step(1, 2.0) == []
    assert m.observe_step(2, 80.0) == [], "warmup: no baseline yet"
    m2 = TrainingHealthMonitor()
    losses = warm(m2, 12)
    got = m2.observe_step(13, 9.0)
    seed = RollingBaseline(window=20, min_periods=5)
    for v in losses:
        seed.update(v)
    stats = seed.baseline()
    assert stats is not None
    assert len(got) == 1
    spike = got[0]
    assert (spike.kind, spike.step, spike.value) == ("loss_spike", 13, 9.0)
    assert spike.baseline == stats[0]
    assert spike.z_score == seed.z_score(9.0) and spike.z_score is not None and spike.z_score > 6
    assert spike.latency(13) == 0 and m2.anomalies == got


def test_grad_norm_spike_uses_the_grad_window() -> None:
    m = TrainingHealthMonitor(grad_z_thresh=6.0)
    warm(m, 10)
    assert m.observe_step(11, 2.0, grad_norm=40.0) == []  # an episode: decided later
    got = [
        a
        for s in range(12, 12 + DetectorConfig().grad_follow_steps)
        for a in m.observe_step(s, 2.0, grad_norm=1.0)
    ]
    assert [(a.kind, a.step) for a in got] == [("grad_norm_spike", 11)] and got[0].value == 40.0


def test_thresholds_are_applied() -> None:
    lax = TrainingHealthMonitor(loss_z_thresh=1e6)
    warm(lax, 10)
    assert lax.observe_step(11, 9.0) == []
    m = TrainingHealthMonitor(loss_window=8, loss_min_periods=8)
    warm(m, 7)
    assert m.observe_step(8, 50.0) == [], "7 values < loss_min_periods"
    with pytest.raises(ValueError, match="min_periods"):
        TrainingHealthMonitor(loss_window=5, loss_min_periods=6)


def run_with_resume(jump: float) -> tuple[TrainingHealthMonitor, list[Anomaly]]:
    """120 steps, a crash, a resume from the checkpoint at step 100 (loss + ``jump``)."""
    truth = healthy_losses(200, seed=5, noise=0.02)
    m = TrainingHealthMonitor()
    for n in range(1, 121):
        m.observe_step(n, truth[n - 1], grad_norm=1.0, step_time_s=0.5)
    found: list[Anomaly] = []
    for n in range(101, 141):
        found += m.observe_step(
            n, truth[n - 1] + jump, grad_norm=1.0, step_time_s=0.5, restart=n == 101
        )
    return m, found


def test_a_good_resume_is_not_flagged() -> None:
    """Seed: "a well-behaved resume is not" (caught as restart_discontinuity)."""
    m, found = run_with_resume(0.0)
    assert found == [] and m.continuity_ok()
    assert [r["continuity"] for r in m.report()["restarts"]] == ["ok"]


def test_a_resume_that_drops_optimizer_state_and_jumps_is_caught() -> None:
    """Seed: "a resume that silently drops optimizer/RNG state and produces a real loss jump"."""
    m, found = run_with_resume(0.5)
    assert [(a.kind, a.step) for a in found] == [("restart_discontinuity", 101)]
    assert found[0].latency(101) == 0
    assert not m.continuity_ok()
    report = m.report()
    assert report["continuity_ok"] is False
    assert [r["continuity"] for r in report["restarts"]] == ["broken"]


def test_restart_judges_against_the_pre_restart_baseline() -> None:
    """The first step after a resume is scored against the window as it stood at the resume.

    Steps 101-120 ran at a much higher loss before the crash; a resume from 100 that
    lands where the run was at step 100 is fine, although it is far below the latest window.
    """
    m = TrainingHealthMonitor()
    warm(m, 100)
    for n in range(101, 121):
        m.observe_step(n, 2.0 + 0.01 * (n % 3) + (3.0 if n > 110 else 0.0))
    assert m.observe_step(101, 2.01, restart=True) == []
    assert m.steps_state is not None and m.steps_state.loss.last_step == 101


def test_dead_rank_once_per_outage_after_the_threshold() -> None:
    """Seed: "silent for more than rank_heartbeat_threshold steps as dead_rank, once per outage"."""
    m = TrainingHealthMonitor(rank_heartbeat_threshold=5)
    raised: list[tuple[int, int | None, int]] = []

    def run(first: int, last: int, ranks: tuple[int, ...]) -> None:
        for n in range(first, last + 1):
            for r in ranks:
                assert m.observe_rank_step(r, n) is None  # type: ignore[func-returns-value]
            for a in m.check_rank_liveness(n):
                assert a.kind == "dead_rank"
                raised.append((n, a.rank, a.latency(killed_at)))

    killed_at = 11
    run(1, 10, (0, 1, 2))
    run(11, 30, (0, 1))  # rank 2 silent from step 11
    assert raised == [(16, 2, 5)], "first step more than 5 behind its last report (10)"
    run(31, 31, (0, 1, 2))  # back
    killed_at = 32
    run(32, 40, (0, 1))
    assert raised == [(16, 2, 5), (37, 2, 5)], "a recovered rank can be caught again"
    assert m.report()["liveness"]["dead_ranks"] == [2]


def test_mfu_sample_arithmetic() -> None:
    """Theoretical FLOPs/step (6N + attention), achieved FLOP/s, MFU against the peak."""
    step_flops = theoretical_flops_per_iter(
        n_params=124_356_864, n_layer=12, n_head=12, d_model=768, seq_len=1024, batch_size=32
    )
    per_token = 6 * 124_356_864 + 12 * 12 * 12 * 64 * 1024
    assert step_flops == per_token * 1024 * 32
    sample = MFUSample(step=1, step_flops=step_flops, step_time_s=0.25, peak_flops_per_sec=312e12)
    assert sample.achieved_flops_per_sec == pytest.approx(step_flops / 0.25)
    assert sample.mfu == pytest.approx(0.3610308, abs=1e-6)
    assert MFUSample(1, step_flops, 0.0, 312e12).mfu is None

    m = TrainingHealthMonitor(flop_config=GPT2_SMALL, peak_flops_per_sec=312e12)
    for n in range(1, 4):
        m.observe_step(n, 3.0, step_time_s=0.25, batch_size=32)
    m.observe_step(4, 3.0, batch_size=32)  # no time: no sample
    assert [s.step for s in m.mfu_samples] == [1, 2, 3]
    last = m.mfu_samples[-1]
    assert last.step_flops == pytest.approx(step_flops) and last.mfu == pytest.approx(sample.mfu)
    m.observe_step(5, 3.0, step_time_s=0.25, batch_size=32)
    last = m.mfu_samples[-1]
    assert m.steps_state is not None and last.mfu == m.steps_state.last_mfu, "the core's figure"
    assert m.report()["mfu"]["last"] == last.mfu
    assert m.report()["mfu"]["run"] == pytest.approx(last.mfu)


def test_anomaly_latency() -> None:
    """Seed: "Steps between the true anomaly step and detection - 0 means caught on the same step"."""
    a = Anomaly(12, "loss_spike", 9.0, 2.0, 7.5, 12)
    assert a.latency(12) == 0 and a.latency(10) == 2
    late = Anomaly(step=40, kind="dead_rank", value=6.0, baseline=None, z_score=None,
                   detected_at_step=40)  # fmt: skip
    assert late.latency(35) == 5
    assert json.loads(json.dumps(a.to_dict()))["z_score"] == 7.5


def test_step_records_and_returns() -> None:
    m = TrainingHealthMonitor()
    m.observe_step(1, 2.0, grad_norm=1.0, step_time_s=0.1)
    m.observe_step(2, 2.0, restart=True)
    assert list(m.records) == [StepRecord(1, 2.0, 1.0, 0.1), StepRecord(2, 2.0, restart=True)]
    small = TrainingHealthMonitor(max_records=2)
    for n in range(1, 6):
        small.observe_step(n, 2.0)
    assert [r.step for r in small.records] == [4, 5]
    assert small.report()["steps"]["observed"] == 5


def test_report_is_json_with_the_documented_receipts() -> None:
    """Seed: "step count, MFU, anomalies by kind, continuity verdict", JSON-serializable."""
    m = TrainingHealthMonitor(flop_config=GPT2_SMALL, peak_flops_per_sec=312e12, world_size=2)
    for n in range(1, 31):
        loss = math.nan if n == 20 else 3.0 - 0.01 * n
        m.observe_step(n, loss, grad_norm=1.0, step_time_s=0.25, batch_size=32)
        m.observe_rank_step(0, n)
        m.observe_rank_step(1, n)
    m.check_rank_liveness(30)
    report = m.report()
    assert json.loads(json.dumps(report, allow_nan=False)) == report
    assert report["steps"]["observed"] == 30 and report["steps"]["kept"] == 30
    assert report["mfu"]["run"] == pytest.approx(0.3610308, abs=1e-6)
    assert report["mfu"]["convention"] == "6N+attn"
    assert report["anomalies"]["by_kind"] == {"nonfinite_loss": 1}
    assert report["continuity_ok"] is True
    assert [c["action"] for c in report["commands"]] == ["rollback"]


def test_from_config_takes_the_whole_configuration() -> None:
    cfg = with_overrides(DetectorConfig(), {"loss_z_thresh": 4.0})
    m = TrainingHealthMonitor.from_config(cfg, world_size=2)
    assert m.config == cfg and m.config.loss_window == DetectorConfig().loss_window


# --- the monitor's verdicts are the processors' -----------------------------------------

STEP_S = 0.5
NS = int(STEP_S * 1e9)


def story_losses() -> list[float]:
    truth = healthy_losses(160, seed=11, noise=0.02)
    truth[39] = 9.0  # a spike at step 40
    truth[59] = math.nan  # a NaN at step 60: rollback command
    return truth


def test_monitor_verdicts_equal_the_processors_verdicts() -> None:
    """The same run through the monitor and as Kafka records through ``replay``."""
    world, threshold = 3, 8
    truth = story_losses()
    m = TrainingHealthMonitor(world_size=world, rank_heartbeat_threshold=threshold, run_id="r")
    records: list[Record] = []
    offsets = {"steps": 0, "heartbeats": 0}

    def send(role: str, event: RunStarted | StepCompleted | Heartbeat) -> None:
        records.append((role, Provenance(topic=role, partition=0, offset=offsets[role]), event))
        offsets[role] += 1

    def started(incarnation: int, ts_ns: int) -> None:
        event = RunStarted(
            run_id="r", ts_ns=ts_ns, world_size=world, dtype="fp32", incarnation=incarnation
        )
        send("steps", event)
        send("heartbeats", event)

    started(0, 0)
    clock = 0
    schedule = [(n, 0) for n in range(1, 71)] + [(n, 1) for n in range(51, 121)]
    incarnation = 0
    for n, inc in schedule:
        resumed = inc != incarnation
        if resumed:
            incarnation = inc
            started(inc, clock)
        clock += NS
        loss = truth[n - 1] + (0.6 if inc == 1 and n <= 70 else 0.0)  # a bad resume
        if inc == 1 and n == 60:
            loss = truth[58]  # the resumed run skips the bad batch
        grad = 1.0 + 0.01 * (n % 4)
        m.observe_step(n, loss, grad_norm=grad, step_time_s=STEP_S, restart=resumed)
        send(
            "steps",
            StepCompleted(
                run_id="r",
                ts_ns=clock,
                step=n,
                loss=loss,
                grad_norm=grad,
                step_time_s=STEP_S,
                restart_from_step=n - 1 if resumed else None,
            ),
        )
        for rank in range(world):
            if inc == 1 and rank == 2 and n > 90:
                continue  # rank 2 dies at step 91 of the second incarnation
            m.observe_rank_step(rank, n)
            send("heartbeats", Heartbeat(run_id="r", ts_ns=clock, rank=rank, step=n))

    kafka = replay(records, m.config)

    def key(v: object) -> tuple[object, ...]:
        fields = ("verdict_id", "kind", "step", "rank", "value", "baseline", "z", "detail")
        return tuple(repr(getattr(v, f)) for f in fields)  # repr: NaN equals NaN

    mine = sorted(key(a.verdict) for a in m.anomalies)
    theirs = sorted(key(v) for v in kafka.anomalies)
    assert mine == theirs
    kinds = sorted(a.kind for a in m.anomalies)
    assert kinds == [
        "dead_rank",
        "loss_spike",
        "nonfinite_loss",
        "restart_discontinuity",
    ], "the story exercises every path"
    assert [c.command_id for c in m.commands] == [c.command_id for c in kafka.commands]
    assert [c.action for c in m.commands] == ["rollback", "respawn"]
    assert m.continuity_ok() is kafka.steps["r"].continuity_ok is False
    assert m.report()["anomalies"]["by_kind"] == {
        "dead_rank": 1,
        "loss_spike": 1,
        "nonfinite_loss": 1,
        "restart_discontinuity": 1,
    }
