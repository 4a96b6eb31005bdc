from __future__ import annotations

import pytest

from runwatch.sinks.alert_format import alert_of
from runwatch.sinks.alert_policy import Grouper, TokenBucket

from .events import anomaly, completed, restart


@pytest.mark.parametrize(
    ("capacity", "rate", "takes_at", "expected"),
    [
        (2, 1.0, [0, 0, 0], [True, True, False]),
        (2, 1.0, [0, 0, 0, 1.0], [True, True, False, True]),
        (1, 0.5, [0, 1.0, 2.0], [True, False, True]),
        (3, 0.0, [0, 0, 0, 100], [True, True, True, False]),
    ],
)
def test_token_bucket(capacity, rate, takes_at, expected):
    bucket = TokenBucket(capacity, rate, now_s=0.0)
    assert [bucket.take(t) for t in takes_at] == expected


def _alert(run="r1", step=1):
    return alert_of(anomaly(run=run, step=step))


def test_alerts_of_a_run_within_the_window_share_a_group():
    g = Grouper(group_wait_s=2.0, max_per_min=100)
    assert g.add(_alert(step=1), ("a", 0, 10), 0.0)
    assert g.add(_alert(step=2), ("a", 0, 11), 1.0)
    assert g.add(_alert(run="r2"), ("a", 1, 5), 1.5)
    assert g.due(1.9) == []
    assert g.pending_offsets() == {("a", 0): 10, ("a", 1): 5}
    (release,) = g.due(2.0)
    assert release.run_id == "r1" and [a.step for a in release.group.alerts] == [1, 2]
    assert g.pending_offsets() == {("a", 1): 5}
    assert [r.run_id for r in g.due(3.5)] == ["r2"]


def test_same_id_waiting_is_a_duplicate():
    g = Grouper(group_wait_s=1.0, max_per_min=100)
    assert g.add(_alert(), ("a", 0, 1), 0.0)
    assert not g.add(_alert(), ("a", 0, 2), 0.1)
    assert g.pending_ids() == {_alert().alert_id}


def test_force_releases_everything():
    g = Grouper(group_wait_s=100.0, max_per_min=100)
    g.add(_alert(), ("a", 0, 1), 0.0)
    assert len(g.due(0.0, force=True)) == 1


def test_rate_limit_suppresses_and_reports_the_count_on_the_next_group():
    g = Grouper(group_wait_s=0.0, max_per_min=2)  # 2 tokens, one more every 30 s
    for s in range(5):
        g.add(_alert(step=s), ("a", 0, s), 0.0)
    (first,) = g.due(0.0)
    assert [a.step for a in first.group.alerts] == [0, 1]
    assert len(first.suppressed_ids) == 3 and first.group.suppressed == 0
    g.add(_alert(step=9), ("a", 0, 9), 30.0)
    (second,) = g.due(30.0)
    assert [a.step for a in second.group.alerts] == [9] and second.group.suppressed == 3


def test_a_count_without_a_carrier_goes_out_as_a_notice_when_a_token_frees():
    g = Grouper(group_wait_s=0.0, max_per_min=1)
    g.add(_alert(step=1), ("a", 0, 1), 0.0)
    g.add(_alert(step=2), ("a", 0, 2), 0.0)
    (first,) = g.due(0.0)
    assert len(first.group.alerts) == 1 and first.suppressed_ids == (_alert(step=2).alert_id,)
    assert g.due(30.0) == []  # no token yet
    (notice,) = g.due(60.0)
    assert notice.group.alerts == () and notice.group.suppressed == 1
    assert g.due(200.0) == []


def test_carried_counts_survive_a_restart():
    g = Grouper(group_wait_s=0.0, max_per_min=5, carried={"r1": 4, "r2": 0})
    (notice,) = g.due(0.0)
    assert (notice.run_id, notice.group.suppressed) == ("r1", 4)


@pytest.mark.parametrize(("wait", "rate"), [(-1.0, 1.0), (1.0, 0.0)])
def test_bad_settings(wait, rate):
    with pytest.raises(ValueError):
        Grouper(wait, rate)


def _ids(releases):
    return [[a.alert_id for a in r.group.alerts] for r in releases if r.group]


def test_a_command_waits_for_its_cause_and_follows_it():
    g = Grouper(group_wait_s=1.0, max_per_min=100, cause_wait_s=5.0)
    cause = _alert(step=7)
    assert g.add(alert_of(completed(cid="c1")), ("ctl", 0, 3), 0.0)
    assert g.add(alert_of(restart(cid="c1", cause=cause.alert_id)), ("cmd", 0, 4), 0.5)
    assert g.due(1.5) == []  # both wait: the verdict behind them has not been seen
    assert g.pending_offsets() == {("ctl", 0): 3, ("cmd", 0): 4}
    assert g.add(cause, ("anom", 0, 9), 2.0)
    assert _ids(g.due(2.1)) == [[cause.alert_id, "restart_requested:c1", "restart_completed:c1"]]


def test_a_cause_already_delivered_releases_the_command_at_once():
    g = Grouper(group_wait_s=1.0, max_per_min=100, known={"v-x"}.__contains__)
    assert g.add(alert_of(restart(cid="c1", cause="v-x")), ("cmd", 0, 4), 0.0)
    assert _ids(g.due(1.0)) == [["restart_requested:c1"]]


def test_a_cause_that_never_comes_holds_the_command_only_cause_wait_s():
    g = Grouper(group_wait_s=1.0, max_per_min=100, cause_wait_s=5.0)
    assert g.add(alert_of(restart(cid="c1", cause="v-gone")), ("cmd", 0, 4), 0.0)
    assert g.due(4.9) == []
    assert _ids(g.due(5.0)) == [["restart_requested:c1"]]


def test_forced_release_still_puts_causes_first():
    g = Grouper(group_wait_s=10.0, max_per_min=100)
    cause = _alert(step=7)
    g.add(alert_of(restart(cid="c1", cause=cause.alert_id)), ("cmd", 0, 4), 0.0)
    g.add(cause, ("anom", 0, 9), 0.1)
    assert _ids(g.due(0.2, force=True)) == [[cause.alert_id, "restart_requested:c1"]]
