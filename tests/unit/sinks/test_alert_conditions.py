"""The alert conditions of a run: a pure fold of its verdicts, commands, outcomes and markers."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Sequence

import pytest

from runwatch.schemas.events import Event
from runwatch.sinks.alert_conditions import (
    AlertState,
    RunAlerts,
    alerts_of,
    apply,
    fold,
    label_name,
    prune,
)
from runwatch.sinks.alert_format import alert_of
from runwatch.sinks.alert_rules import ALERT_KINDS, ALERT_RULES, STALE_S, rule_of

from .events import S, anomaly, completed, ended, failed, rejected, restart, started

DAY_NS = int(STALE_S * S)


def fold_all(events: Iterable[Event], state: RunAlerts | None = None) -> RunAlerts:
    for event in events:
        state, _ = fold(state, event)
    assert state is not None
    return state


def by_kind(state: RunAlerts) -> dict[str, AlertState]:
    alerts = list(alerts_of(state).values())
    out = {a.kind: a for a in alerts}
    assert len(out) == len(alerts), f"several alerts of one kind: {alerts}"
    return out


def interleavings(streams: Sequence[Sequence[Event]], count: int, seed: int = 0):
    """``count`` random merges of ``streams`` that keep each stream's own order (as Kafka
    keeps a partition's), plus the streams one after another in every order."""
    for order in itertools.permutations(streams):
        yield [e for stream in order for e in stream]
    rng = random.Random(seed)
    for _ in range(count):
        queues = [list(s) for s in streams]
        merged: list[Event] = []
        while any(queues):
            queue = rng.choice([q for q in queues if q])
            merged.append(queue.pop(0))
        yield merged


# --------------------------------------------------------------------------- the table


def test_every_kind_has_one_rule():
    assert set(ALERT_RULES) == set(ALERT_KINDS)
    assert len(ALERT_KINDS) == len(set(ALERT_KINDS))


@pytest.mark.parametrize(
    "event",
    [restart(), completed(), failed(), rejected()],
    ids=["requested", "completed", "failed", "rejected"],
)
def test_every_restart_event_alert_has_a_rule(event):
    alert = alert_of(event)
    assert alert is not None and rule_of(alert.kind) is ALERT_RULES[alert.kind]


def test_an_unknown_kind_says_where_its_rule_belongs():
    with pytest.raises(KeyError, match="ALERT_RULES"):
        rule_of("cosmic_ray")


@pytest.mark.parametrize(
    ("tag", "label"),
    [
        ("team", "team"),
        ("cluster-name", "cluster_name"),
        ("model.size", "model_size"),
        ("9lives", "tag_9lives"),
        ("__meta", "tag___meta"),
        ("run", "tag_run"),
        ("severity", "tag_severity"),
        ("", "tag_"),
    ],
    ids=lambda v: v or "empty",
)
def test_label_name(tag, label):
    assert label_name(tag) == label


# --------------------------------------------------------------------------- firing and ending


def test_a_dead_rank_fires_until_the_gang_is_back():
    state, alerts = fold(None, started(tags={"team": "llm", "cluster": "a100-west"}))
    assert alerts == []
    state, (dead,) = fold(state, anomaly(kind="dead_rank", rank=3, ts_s=100))
    assert dead.labels == {
        "alertname": "dead_rank",
        "run": "r1",
        "severity": "critical",
        "incarnation": "0",
        "rank": "3",
        "team": "llm",
        "cluster": "a100-west",
    }
    assert dead.starts_ns == 100 * S and dead.ends_ns == 100 * S + DAY_NS  # open
    assert dead.annotations["summary"] and dead.annotations["description"]
    assert dead.annotations["alert_id"] == "v-r1-dead_rank-30"
    state, (requested,) = fold(state, restart(cid="c1", ts_s=101))
    assert requested.kind == "restart_requested" and requested.labels["incarnation"] == "0"
    assert requested.ends_ns == (101 + 900) * S
    state, back = fold(state, started(incarnation=1, ts_s=108, tags={"team": "llm"}))
    assert [(a.kind, a.ends_ns) for a in back if a.kind == "dead_rank"] == [("dead_rank", 108 * S)]
    state, done = fold(state, completed(cid="c1", ts_s=110))
    assert by_kind(state)["dead_rank"].ends_ns == 108 * S  # the earlier end stands
    assert [a.kind for a in done] == ["restart_completed"]


def test_a_nan_rollback_ends_the_poisoned_incarnation():
    state = fold_all([started(), anomaly(kind="nonfinite_loss", step=50, ts_s=200)])
    assert by_kind(state)["nonfinite_loss"].ends_ns == 200 * S + DAY_NS
    state = fold_all(
        [restart(cid="c2", ts_s=201, action="rollback", cause_kind="nonfinite_loss")], state
    )
    state, (alert,) = fold(state, ended(ts_s=203, status="stopped"))
    assert alert.kind == "nonfinite_loss" and alert.ends_ns == 203 * S


def test_a_loss_spike_episode_is_one_alert_extended_by_each_spike():
    state, (first,) = fold(fold_all([started()]), anomaly(step=30, ts_s=100))
    assert first.ends_ns == (100 + 600) * S
    state, (second,) = fold(state, anomaly(step=31, ts_s=400))
    assert second.fingerprint == first.fingerprint
    assert (second.starts_ns, second.ends_ns) == (100 * S, 1000 * S)
    assert second.annotations["first_alert_id"] == "v-r1-loss_spike-30"
    assert second.annotations["alert_id"] == "v-r1-loss_spike-31"
    # after the episode ended, a spike is a new episode: same labels, a later start
    state, (third,) = fold(state, anomaly(step=90, ts_s=5000))
    assert third.fingerprint == first.fingerprint
    assert (third.starts_ns, third.ends_ns) == (5000 * S, 5600 * S)
    assert "first_alert_id" not in third.annotations


def test_the_run_end_ends_everything_but_a_failed_restart():
    state = fold_all(
        [
            started(),
            anomaly(step=30, ts_s=100),
            anomaly(kind="hang", rank=None, step=31, ts_s=110),
            restart(cid="c1", ts_s=111, cause_kind="hang"),
            failed(cid="c1", ts_s=115),
        ]
    )
    state, alerts = fold(state, ended(ts_s=116, status="failed"))
    assert sorted(a.kind for a in alerts) == ["hang", "loss_spike"]
    assert all(a.ends_ns == 116 * S for a in alerts)
    kinds = by_kind(state)
    assert kinds["restart_failed"].ends_ns == 115 * S + DAY_NS  # still firing
    assert kinds["restart_failed"].labels["incarnation"] == "0"
    # a later restart succeeds: the failure is over
    state, alerts = fold(state, completed(cid="c7", ts_s=500))
    assert by_kind(state)["restart_failed"].ends_ns == 500 * S


def test_a_failed_restart_ends_when_the_run_is_launched_again():
    state = fold_all([started(), restart(cid="c1"), failed(cid="c1", ts_s=115)])
    state = fold_all([ended(ts_s=116, status="failed"), started(ts_s=900)], state)
    assert by_kind(state)["restart_failed"].ends_ns == 900 * S


def test_nothing_fires_for_more_than_a_day_after_its_last_verdict():
    state = fold_all([anomaly(kind="dead_rank", ts_s=100)])  # and then nothing, ever
    assert by_kind(state)["dead_rank"].ends_ns == 100 * S + DAY_NS


def test_a_command_outcome_read_before_its_command_is_relabelled_once_it_is():
    state, (outcome,) = fold(None, failed(cid="c1", ts_s=115))
    assert "incarnation" not in outcome.labels
    state, alerts = fold(state, restart(cid="c1", ts_s=111, incarnation=4))
    failed_now = [a for a in alerts if a.kind == "restart_failed"]
    old, new = sorted(failed_now, key=lambda a: "incarnation" in a.labels)
    assert old.fingerprint == outcome.fingerprint and old.ends_ns == 115 * S  # ended
    assert new.labels["incarnation"] == "4" and new.ends_ns > 115 * S


def test_tags_read_after_a_verdict_relabel_its_alert():
    state, (bare,) = fold(None, anomaly(kind="hang", rank=None, ts_s=100))
    state, alerts = fold(state, started(ts_s=1, tags={"team": "llm"}))
    old, new = sorted(alerts, key=lambda a: "team" in a.labels)
    assert old.fingerprint == bare.fingerprint and old.ends_ns == 100 * S
    assert new.labels["team"] == "llm" and new.starts_ns == 100 * S


def test_a_tag_named_like_a_runwatch_label_does_not_replace_it():
    state = fold_all([started(tags={"run": "other", "severity": "low"}), anomaly(ts_s=100)])
    labels = by_kind(state)["loss_spike"].labels
    assert labels["run"] == "r1" and labels["severity"] == "warning"
    assert labels["tag_run"] == "other" and labels["tag_severity"] == "low"


def test_severities_are_separate_alerts():
    state = fold_all([anomaly(step=30, ts_s=100), anomaly(step=31, ts_s=101, severity="critical")])
    assert sorted(a.severity for a in alerts_of(state).values()) == ["critical", "warning"]


def test_a_gang_killed_at_once_is_one_alert_labelled_with_the_rank_that_died_first():
    deaths = [
        anomaly(kind="dead_rank", rank=r, step=10, ts_s=100 + r / 1000, vid=f"v{r}")
        for r in (7, *range(7), *range(8, 64))
    ]
    state = fold_all([started(), *deaths, anomaly(kind="hang", rank=None, ts_s=101)])
    kinds = by_kind(state)
    assert len(kinds) == 2 and kinds["dead_rank"].labels["rank"] == "0"  # the earliest
    assert kinds["dead_rank"].annotations["alert_id"] == "v63"  # the latest
    assert "rank" not in kinds["hang"].labels
    # read in another order, the same alert
    again = fold_all([started(), *reversed(deaths), anomaly(kind="hang", rank=None, ts_s=101)])
    assert alerts_of(again) == alerts_of(state)


def test_folding_an_event_again_changes_nothing():
    events = [
        started(tags={"team": "x"}),
        anomaly(ts_s=100),
        anomaly(kind="dead_rank", rank=1, ts_s=101),
        restart(cid="c1", ts_s=102),
        completed(cid="c1", ts_s=110),
        ended(ts_s=120),
    ]
    state = fold_all(events)
    for event in events[1:]:  # a RunStarted read again is another start
        again, alerts = fold(state, event)
        assert alerts == [] and alerts_of(again) == alerts_of(state), event


def test_every_interleaving_of_the_topics_gives_the_same_alerts():
    runs = [
        started(tags={"team": "llm"}),
        ended(ts_s=120, status="stopped"),
        started(incarnation=1, ts_s=125),
    ]
    anomalies = [
        anomaly(kind="loss_spike", step=30, ts_s=100),
        anomaly(kind="nonfinite_loss", step=40, ts_s=110),
        anomaly(kind="dead_rank", rank=1, step=45, ts_s=130, incarnation=1),
    ]
    commands = [restart(cid="c1", ts_s=111, action="rollback", cause_kind="nonfinite_loss")]
    controller = [completed(cid="c1", ts_s=126)]
    expected = alerts_of(fold_all([*runs, *anomalies, *commands, *controller]))
    assert {a.kind: a.ends_ns for a in expected.values()} == {
        "loss_spike": 120 * S,
        "nonfinite_loss": 120 * S,
        "restart_requested": (111 + 900) * S,
        "restart_completed": (126 + 900) * S,
        "dead_rank": 130 * S + DAY_NS,  # of incarnation 1: firing
    }
    for merged in interleavings([runs, anomalies, commands, controller], count=200):
        assert alerts_of(fold_all(merged)) == expected, merged


def test_apply_is_the_fold_without_the_alerts():
    events = [
        started(tags={"team": "x"}),
        anomaly(ts_s=100),
        restart(cid="c1", ts_s=102),
        failed(cid="c1", ts_s=103),
        completed(cid="c2", ts_s=110),
        ended(ts_s=120),
    ]
    folded = applied = None
    for event in events:
        folded, _ = fold(folded, event)
        applied = apply(applied, event)
        assert applied == folded


def test_prune_forgets_what_ended_long_ago():
    state = fold_all([started(), anomaly(ts_s=100), anomaly(kind="dead_rank", ts_s=100)])
    # the spike ended at 700 s; an hour later it is dropped, the dead rank is not
    kept = prune(state, now_ns=(700 + 3600) * S + 1, keep_s=3600)
    assert kept is not None and [a.kind for a in alerts_of(kept).values()] == ["dead_rank"]
    assert prune(state, now_ns=(700 + 3599) * S, keep_s=3600) is state
    # a day after the dead rank's last word, it ended; an hour later the run is forgotten
    assert prune(state, now_ns=100 * S + DAY_NS + 3601 * S, keep_s=3600) is None
