"""The topics `runwatch processors` creates before faust starts are the ones faust declares.

`processors.app.changelog_topics` exists because faust declared them only after its consumer
had read its first metadata (a takeover then recovered no table: docs/processors.md, "A
takeover that recovered nothing"). Created by us, they must still be exactly what faust
would have made: the same names, partition counts and configs, for every table, and the
leader topic whose holder runs the clock.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from runwatch.processors.app import (
    LeaderTopic,
    _check_assignment,
    changelog_topics,
    changelogs_missing,
    create_app,
    topics_faust_declares,
)
from runwatch.processors.compat import leader_topic_of
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.settings import ProcessorSettings

COUNTS = {"steps": 16, "heartbeats": 64, "checkpoints": 8, "anomalies": 4}


@pytest.fixture(scope="module")
def settings() -> ProcessorSettings:
    return ProcessorSettings(
        bootstrap="127.0.0.1:1",  # nothing connects: the app is only built
        prefix="pre",
        app_id="pre-app",
        partitions=COUNTS,
        replication_factor=3,
        min_insync_replicas=2,
    )


@pytest.fixture(scope="module")
def app(settings: ProcessorSettings) -> Any:
    """The app `create_app` builds (never started)."""
    return create_app(settings, DetectorConfig(), None)


@pytest.fixture(scope="module")
def declared(app: Any) -> dict[str, Any]:
    """The changelog topics faust's tables declare, by name."""
    return {t.changelog_topic.get_topic_name(): t.changelog_topic for t in app.tables.values()}


def test_one_changelog_per_table_with_its_inputs_partition_count(settings, declared):
    ours = {spec.name: spec for spec in changelog_topics(settings)}
    assert set(ours) == set(declared) and len(ours) == len(COUNTS)
    for name, spec in ours.items():
        assert spec.partitions == declared[name].partitions, name


def test_the_configs_are_fausts_once_the_replication_rule_is_added(settings, declared):
    # runwatch.admin.create_topics adds these two from the cluster's replication rule
    from_rule = {
        "min.insync.replicas": str(settings.min_insync_replicas),
        "unclean.leader.election.enable": "false",
    }
    for spec in changelog_topics(settings):
        topic = declared[spec.name]
        assert topic.compacting and not topic.deleting and topic.retention is None
        assert spec.compacted and spec.retention_ms is None
        assert {**spec.configs(), **from_rule} == {"cleanup.policy": "compact", **topic.config}


def test_the_leader_topic_is_fausts(settings, app):
    faust_leader = leader_topic_of(app)
    *changelogs, ours = topics_faust_declares(settings)
    assert changelogs == changelog_topics(settings) and isinstance(ours, LeaderTopic)
    assert ours.name == faust_leader.get_topic_name() == "pre-app-__assignor-__leader"
    assert ours.partitions == faust_leader.partitions == 1
    # faust asks for no config (the broker's delete policy), and so do we
    assert not faust_leader.compacting and not faust_leader.config and not ours.compacted
    assert faust_leader.retention is None and ours.retention_ms is None


class TP(NamedTuple):
    topic: str
    partition: int


def _complete(settings: ProcessorSettings) -> set[TP]:
    """Every input partition with its changelog partition, as faust's assignor hands them out."""
    return {
        tp
        for spec in changelog_topics(settings)
        for p in range(spec.partitions)
        for tp in (TP(spec.source, p), TP(spec.name, p))
    }


def test_a_complete_assignment_lacks_nothing(settings):
    assert changelogs_missing(_complete(settings), settings) == []


def test_an_input_partition_held_without_its_changelog_is_named(settings):
    held = _complete(settings) - {TP("pre-app-liveness-changelog", 3)}
    assert changelogs_missing(held, settings) == ["pre-app-liveness-changelog[3]"]


def test_a_changelog_partition_without_its_input_is_not_a_gap(settings):
    held = {TP("pre-app-liveness-changelog", 3), TP("pre.steps", 1)}  # no heartbeats[3]
    assert changelogs_missing(held, settings) == ["pre-app-step-health-changelog[1]"]


def test_the_worker_says_so_at_error_on_an_assignment(settings, caplog):
    check = _check_assignment(settings)
    check(None, _complete(settings))
    assert not caplog.records
    check(None, _complete(settings) - {TP("pre-app-liveness-changelog", 3)})
    (record,) = caplog.records
    assert record.levelname == "ERROR" and "pre-app-liveness-changelog[3]" in record.getMessage()
