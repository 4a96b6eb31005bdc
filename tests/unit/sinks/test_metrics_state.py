from __future__ import annotations

import math

import pytest

from sinks.metrics_state import FleetFigures, MetricsPolicy

from .events import anomaly, completed, ended, heartbeat, rejected, restart, started, step, tick


def fold(events, policy=None):
    f = FleetFigures(policy)
    for e in events:
        f.apply(e, 0)
    return f


def test_step_figures_and_mfu():
    f = fold([started(), step(n=7, loss=2.5)])
    r = f.runs["r1"]
    assert (r.last_step, r.loss, r.grad_norm) == (7, 2.5, 1.25)
    assert r.tokens_per_s == pytest.approx(4096 / 0.5)
    per_token = 6 * 1_000_000 + 12 * 2 * 64 * 64  # 6N + attention
    assert r.mfu_ratio == pytest.approx(per_token * 4096 / 0.5 / 1e12)


def test_no_mfu_without_a_run_started():
    assert fold([step()]).runs["r1"].mfu_ratio is None


def test_nan_loss_is_kept():
    assert math.isnan(fold([step(loss=float("nan"))]).runs["r1"].loss)


@pytest.mark.parametrize(
    ("events", "live"),
    [
        ([started(), heartbeat(rank=0, ts_s=10), heartbeat(rank=1, ts_s=10)], 2),
        ([started(), heartbeat(rank=0, ts_s=10), heartbeat(rank=1, ts_s=100)], 1),
        # the clock's ticks advance log time when the whole gang is silent
        ([started(), heartbeat(rank=0, ts_s=10), tick(0, ts_s=40)], 1),
        ([started(), heartbeat(rank=0, ts_s=10), tick(0, ts_s=80)], 0),
        ([started(), heartbeat(rank=0, ts_s=10), ended(ts_s=11)], 0),
        # a new incarnation forgets the old gang's ranks
        (
            [
                heartbeat(rank=0, ts_s=10),
                heartbeat(rank=1, ts_s=10),
                started(incarnation=1, ts_s=11),
                heartbeat(rank=0, ts_s=12),
            ],
            1,
        ),
    ],
)
def test_live_ranks(events, live):
    f = fold(events, MetricsPolicy(live_window_s=60))
    assert f.live_ranks(f.runs["r1"]) == live


def test_counters_count_each_id_once():
    f = fold(
        [
            anomaly(kind="loss_spike"),
            anomaly(kind="loss_spike"),
            anomaly(kind="hang", step=5),
            restart(cid="c1"),
            restart(cid="c1"),
            restart(cid="c2"),
            completed(cid="c1"),
            rejected(cid="c2"),
            rejected(cid="c2"),
        ]
    )
    r = f.runs["r1"]
    assert r.anomalies == {"loss_spike": 1, "hang": 1}
    assert r.restarts == 2 and r.outcomes == {"completed": 1, "rejected": 1}


def test_an_old_end_does_not_end_a_new_incarnation():
    f = fold([started(ts_s=1), started(incarnation=1, ts_s=10), ended(ts_s=5)])
    assert f.runs["r1"].ended_ns is None


@pytest.mark.parametrize(
    ("events", "kept"),
    [
        ([started("a"), ended("a", ts_s=5), step("b", ts_s=5 + 3600)], {"a", "b"}),
        ([started("a"), ended("a", ts_s=5), step("b", ts_s=5 + 3601)], {"b"}),
        ([step("a", ts_s=1), step("b", ts_s=1 + 86401)], {"b"}),
        ([step("a", ts_s=1), tick(ts_s=1 + 86400)], {"a"}),
    ],
)
def test_cardinality_rule(events, kept):
    f = fold(events)
    f.prune()
    assert set(f.runs) == kept
