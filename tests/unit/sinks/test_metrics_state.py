from __future__ import annotations

import math

import msgspec
import pytest

from runwatch.sinks.metrics_state import FleetFigures, MetricsPolicy

from .events import (
    anomaly,
    completed,
    ended,
    failed,
    heartbeat,
    rejected,
    restart,
    started,
    step,
    tick,
)


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


def test_a_covered_refusal_is_not_counted_as_a_failed_restart():
    """The Prometheus rule RunwatchRestartFailures pages on outcome failed|rejected."""
    f = fold([restart(cid="c1"), msgspec.structs.replace(failed(cid="c1"), covered=True)])
    assert f.runs["r1"].outcomes == {"covered": 1}


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


def _impossible_start(mfu_wanted=1.8):
    ok = fold([started(), step()]).runs["r1"].mfu_ratio
    return msgspec.structs.replace(started(), peak_flops_per_s=1e12 * ok / mfu_wanted)


def test_an_impossible_mfu_is_kept_and_flagged_not_clamped():
    f = fold([_impossible_start(), step(n=1)])
    r = f.runs["r1"]
    assert r.mfu_ratio == pytest.approx(1.8) and r.mfu_implausible
    f.apply(msgspec.structs.replace(step(n=2), step_time_s=5.0), 0)  # 0.18: plausible again
    assert r.mfu_ratio == pytest.approx(0.18) and not r.mfu_implausible


def test_the_exporter_warns_once_per_run_and_exports_the_flag(caplog):
    from runwatch.schemas.codec import encode, encode_key
    from runwatch.schemas.records import RawRecord
    from runwatch.schemas.topics import names
    from runwatch.sinks.metrics import MetricsSink

    t = names("p")
    sink = MetricsSink(t)
    events = [_impossible_start(), step(n=1), step(n=2), step(n=3)]
    records = [
        RawRecord(t.steps, 0, i, encode_key(e.run_id), encode(e), 0) for i, e in enumerate(events)
    ]
    with caplog.at_level("WARNING", logger="runwatch.sinks.metrics"):
        sink.handle(records[:2], 0.0)
        sink.handle(records[2:], 0.0)
    sink.on_assigned([(t.steps, 0)])
    sink.on_lag({(t.steps, 0): 0})  # caught up: the figures are served
    warnings = [r.getMessage() for r in caplog.records if "MFU" in r.getMessage()]
    assert len(warnings) == 1 and "run r1: MFU 1.80" in warnings[0]
    samples = {
        (s.name, s.labels.get("run")): s.value
        for family in sink.registry.collect()
        for s in family.samples
    }
    assert samples[("runwatch_run_mfu_implausible", "r1")] == 1.0
    assert samples[("runwatch_run_mfu_ratio", "r1")] == pytest.approx(1.8)


def test_packed_events_count_as_the_events_they_carry():
    from runwatch.schemas.events import EventPack

    beats = (heartbeat(rank=0, ts_s=10), heartbeat(rank=1, ts_s=10))
    packed = fold([started(), EventPack(run_id="r1", ts_ns=10 * 10**9, events=beats)])
    plain = fold([started(), *beats])
    assert packed.live_ranks(packed.runs["r1"]) == plain.live_ranks(plain.runs["r1"]) == 2
    steps = fold([started(), EventPack(run_id="r1", ts_ns=1, events=(step(n=6), step(n=7)))])
    assert steps.runs["r1"].last_step == 7


def _dead_letter(topic="p.steps", stage="decode", offset=0):
    from runwatch.schemas.events import DeadLetter, Provenance

    return DeadLetter(
        run_id="?",
        ts_ns=1,
        source=Provenance(topic=topic, partition=0, offset=offset),
        reason="not msgpack",
        stage=stage,
    )


def test_dead_letters_are_counted_by_topic_and_stage_not_run():
    f = fold(
        [
            _dead_letter(offset=1),
            _dead_letter(offset=2),
            _dead_letter(topic="p.heartbeats", stage="fold"),
        ]
    )
    assert f.dead_letters == {("p.steps", "decode"): 2, ("p.heartbeats", "fold"): 1}
    assert f.runs == {}


def _scrape(sink):
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in sink.registry.collect()
        for s in family.samples
    }


def test_the_exporter_serves_its_figures_only_once_it_caught_up():
    from runwatch.schemas.codec import encode, encode_key
    from runwatch.schemas.records import RawRecord
    from runwatch.schemas.topics import names
    from runwatch.sinks.metrics import MetricsSink

    t = names("p")
    sink = MetricsSink(t)
    items = [
        (t.steps, started(ts_s=1)),
        (t.steps, step(n=5, ts_s=42)),
        (t.deadletter, _dead_letter(topic=t.steps)),
        (t.deadletter, _dead_letter(topic=t.steps)),
    ]
    sink.handle(
        [
            RawRecord(tp, 0, i, encode_key(e.run_id), encode(e), 0)
            for i, (tp, e) in enumerate(items)
        ],
        0.0,
    )
    sink.on_assigned([(t.steps, 0), (t.deadletter, 0)])
    sink.on_lag({(t.steps, 0): 0})  # one partition still unsampled: not caught up
    early = _scrape(sink)
    assert early[("runwatch_metrics_caught_up", ())] == 0
    assert not any(name.startswith(("runwatch_run_", "runwatch_dead")) for name, _ in early)
    sink.on_lag({(t.steps, 0): 0, (t.deadletter, 0): 0})
    served = _scrape(sink)
    assert served[("runwatch_metrics_caught_up", ())] == 1
    assert served[("runwatch_run_last_event_timestamp_seconds", (("run", "r1"),))] == 42.0
    assert served[("runwatch_run_ended", (("run", "r1"),))] == 0
    assert served[("runwatch_dead_letters_total", (("stage", "decode"), ("topic", "p.steps")))] == 2
    sink.handle([RawRecord(t.steps, 0, 9, encode_key("r1"), encode(ended(ts_s=50)), 0)], 1.0)
    assert _scrape(sink)[("runwatch_run_ended", (("run", "r1"),))] == 1
    # a later rebalance does not hide the figures again
    sink.on_assigned([(t.steps, 0), (t.deadletter, 0), (t.steps, 1)])
    assert _scrape(sink)[("runwatch_metrics_caught_up", ())] == 1


def test_group_lag_is_the_end_minus_the_commit():
    from runwatch.sinks.group_probe import group_lag

    committed = {("s", 0): 90, ("s", 1): 5, ("h", 0): 7}
    ends = {("s", 0): 100, ("s", 1): 5, ("h", 0): 6}  # an end read before a later commit
    assert group_lag(committed, ends) == {("s", 0): 10, ("s", 1): 0, ("h", 0): 0}
    assert group_lag({("x", 0): 1}, {}) == {}


def test_the_probe_serves_its_health_before_any_sample_and_the_figures_after():
    from runwatch.sinks.group_probe import GroupProbe

    probe = GroupProbe("127.0.0.1:9", "p-processors")  # never started: nothing sampled
    names = {s.name for family in probe.collect() for s in family.samples}
    assert names == {"runwatch_processor_probe_ok", "runwatch_processor_probe_failures_total"}


S_NS = 1_000_000_000


def test_a_far_future_heartbeat_cannot_retire_other_runs():
    """Finding 5: a heartbeat at ts_ns=7e18 moves 'now' only up to its bound."""
    f = FleetFigures(MetricsPolicy(stale_s=3600))
    now_ns = 1_000_000 * S_NS
    f.apply(step(run="victim", ts_s=now_ns / S_NS), 0, now_ns + 300 * S_NS)
    poison = msgspec.structs.replace(heartbeat(run="attacker"), ts_ns=7 * 10**18)
    f.apply(poison, 0, now_ns + 300 * S_NS)
    assert f.newest_ns == now_ns + 300 * S_NS
    assert f.prune() == []
    assert set(f.runs) == {"victim", "attacker"}


def test_unbounded_fold_is_poisoned_which_is_why_the_sink_bounds_it():
    f = FleetFigures(MetricsPolicy(stale_s=3600))
    f.apply(step(run="victim", ts_s=1000.0), 0)
    f.apply(msgspec.structs.replace(heartbeat(run="attacker"), ts_ns=7 * 10**18), 0)
    assert "victim" in f.prune()


def test_runs_tracked_are_capped_ended_first_then_longest_silent():
    f = FleetFigures(MetricsPolicy(max_runs=3, stale_s=1e9, ended_retention_s=1e9))
    f.apply(step(run="old", ts_s=1.0), 0)
    f.apply(step(run="done", ts_s=5.0), 0)
    f.apply(ended(run="done", ts_s=6.0), 0)
    for i, run in enumerate(("a", "b", "c")):
        f.apply(step(run=run, ts_s=10.0 + i), 0)
    gone = f.prune()
    assert gone == ["done", "old"]
    assert set(f.runs) == {"a", "b", "c"} and f.evicted == 2


def test_seen_ids_are_bounded_per_run():
    from runwatch.sinks.metrics_state import MAX_SEEN_IDS

    f = FleetFigures()
    for i in range(MAX_SEEN_IDS + 10):
        f.apply(anomaly(vid=f"v{i}", step=i), 0)
    fig = f.runs["r1"]
    assert len(fig.seen_ids) == MAX_SEEN_IDS
    assert sum(fig.anomalies.values()) == MAX_SEEN_IDS + 10
