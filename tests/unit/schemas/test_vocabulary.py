"""One vocabulary: topic roles, anomaly kinds and event names, each spelled in one table."""

from __future__ import annotations

from typing import get_args

import pytest

from runwatch.schemas.events import (
    ALL_TYPES,
    AnomalyDetected,
    AnomalyKind,
    CheckpointCommitted,
    EventPack,
    Heartbeat,
    RestartCompleted,
    RestartRequested,
    StepCompleted,
    Tick,
    event_name,
)
from runwatch.schemas.kinds import ALL_KINDS, KINDS, Chart, kind_spec, kinds_where
from runwatch.schemas.topics import (
    FOLD_ORDER,
    FOLDED_STATES,
    ROLES,
    Principal,
    StateKind,
    TopicNames,
    TopicRole,
    folding,
    names,
    table_of,
)


def test_every_role_has_one_spec_and_one_topic_name():
    assert list(ROLES) == list(TopicRole)
    assert all(spec.role is role for role, spec in ROLES.items())
    assert set(TopicNames.__struct_fields__) == {role.value for role in TopicRole}
    topics = names("p")
    assert [topics.of(role) for role in TopicRole] == [f"p.{role}" for role in TopicRole]


def test_topic_names_map_back_to_their_roles():
    topics = names("p")
    assert topics.roles(TopicRole.STEPS, TopicRole.ANOMALIES) == {
        "p.steps": TopicRole.STEPS,
        "p.anomalies": TopicRole.ANOMALIES,
    }
    assert set(topics.roles().values()) == set(TopicRole)


def test_a_role_is_its_string():
    assert TopicRole("heartbeats") is TopicRole.HEARTBEATS
    assert TopicRole.HEARTBEATS == "heartbeats"
    assert {"heartbeats": 1}[TopicRole.HEARTBEATS] == 1


def test_fold_order_puts_the_few_urgent_records_first_and_heartbeats_last():
    assert FOLD_ORDER == (
        TopicRole.ANOMALIES,
        TopicRole.STEPS,
        TopicRole.CHECKPOINTS,
        TopicRole.HEARTBEATS,
    )
    assert [folding(role).order for role in FOLD_ORDER] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("kind", "table"),
    [
        (StateKind.STEPS, "step-health"),
        (StateKind.LIVENESS, "liveness"),
        (StateKind.CHECKPOINTS, "checkpoints"),
        (StateKind.POLICY, "policy"),
    ],
    ids=str,
)
def test_table_names_are_those_deployments_already_hold(kind, table):
    """A table's name is part of its changelog topic's: renaming one orphans its states."""
    assert table_of(kind) == table
    assert folding(FOLDED_STATES[kind]).state is kind


def test_a_role_the_processors_do_not_fold_says_which_they_do():
    with pytest.raises(ValueError, match="do not fold commands; they fold anomalies, steps"):
        folding(TopicRole.COMMANDS)


@pytest.mark.parametrize(
    ("role", "carried", "not_carried"),
    [
        (TopicRole.STEPS, StepCompleted, Heartbeat),
        (TopicRole.HEARTBEATS, Tick, StepCompleted),
        (TopicRole.CHECKPOINTS, CheckpointCommitted, EventPack),
        (TopicRole.ANOMALIES, AnomalyDetected, RestartRequested),
        (TopicRole.CONTROLLER, RestartCompleted, AnomalyDetected),
    ],
    ids=str,
)
def test_what_a_topic_carries(role, carried, not_carried):
    assert carried in ROLES[role].carries
    assert not_carried not in ROLES[role].carries


def test_packs_hold_only_their_topics_own_high_volume_event():
    packs = {role: spec.packs for role, spec in ROLES.items() if spec.packs}
    assert packs == {TopicRole.STEPS: (StepCompleted,), TopicRole.HEARTBEATS: (Heartbeat,)}
    assert all(EventPack in ROLES[role].carries for role in packs)


def test_trainers_write_inputs_only_and_verdicts_have_one_writer():
    trainer = {role for role, spec in ROLES.items() if Principal.TRAINER in spec.writers}
    assert trainer == {
        TopicRole.RUNS,
        TopicRole.STEPS,
        TopicRole.HEARTBEATS,
        TopicRole.CHECKPOINTS,
    }
    for role in (TopicRole.ANOMALIES, TopicRole.COMMANDS, TopicRole.DEADLETTER):
        assert ROLES[role].writers == {Principal.PROCESSORS}
    assert not any(Principal.SINKS in spec.writers for spec in ROLES.values())


def test_every_anomaly_kind_has_one_spec():
    assert set(KINDS) == set(get_args(AnomalyKind)) == set(ALL_KINDS)
    assert all(spec.kind == kind for kind, spec in KINDS.items())


@pytest.mark.parametrize(
    ("kind", "severity", "action"),
    [
        ("nonfinite_loss", "critical", "rollback"),
        ("loss_divergence", "critical", "rollback"),
        ("loss_collapse", "warning", "rollback"),
        ("dead_rank", "critical", "respawn"),
        ("hang", "critical", "respawn"),
        ("restart_discontinuity", "critical", None),
        ("loss_spike", "warning", None),
        ("grad_norm_spike", "info", None),
        ("straggler", "warning", None),
    ],
    ids=str,
)
def test_kind_facts(kind, severity, action):
    spec = kind_spec(kind)
    assert (spec.severity, spec.action) == (severity, action)


def test_kinds_by_fact():
    assert kinds_where(captures_stacks=True) == {"hang", "dead_rank", "replica_lost"}
    assert kinds_where(breaks_continuity=True) == {"restart_discontinuity"}
    assert "grad_norm_spike" in kinds_where(chart=Chart.GRAD_NORM)
    assert "loss_spike" in kinds_where(chart=Chart.LOSS)


def test_an_unknown_kind_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown anomaly kind 'loss_hiccup'; kinds: loss_spike"):
        kind_spec("loss_hiccup")


def test_an_event_has_one_name_its_wire_tag_without_the_version():
    assert event_name(StepCompleted) == "step"
    assert event_name(RestartCompleted) == "restart_completed"
    assert event_name(Tick(run_id="*", ts_ns=1, partition=0)) == "tick"
    all_names = [event_name(t) for t in ALL_TYPES]
    assert len(set(all_names)) == len(all_names)
    for t in ALL_TYPES:
        assert t.__struct_config__.tag == f"{event_name(t)}.v1"
