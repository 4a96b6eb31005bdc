"""The replication rule: factor min(3, brokers), min ISR 2 from factor 3, overrides checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from runwatch.broker.config import server_properties
from runwatch.common.errors import UsageError
from runwatch.common.settings import ENV_REPLICATION_FACTOR, replication_factor
from runwatch.schemas.topics import Replication, replication_for


@pytest.mark.parametrize(
    ("brokers", "factor", "min_insync"), [(1, 1, 1), (2, 2, 1), (3, 3, 2), (5, 3, 2)]
)
def test_chosen_from_the_cluster_size(brokers: int, factor: int, min_insync: int) -> None:
    assert replication_for(brokers) == Replication(factor=factor, min_insync=min_insync)


def test_an_override_is_kept_within_the_cluster() -> None:
    assert replication_for(5, 5) == Replication(factor=5, min_insync=2)
    assert replication_for(3, 1) == Replication(factor=1, min_insync=1)
    with pytest.raises(ValueError, match=r"needs 1\.\.3"):
        replication_for(3, 4)
    with pytest.raises(ValueError, match=r"needs 1\.\.3"):
        replication_for(3, 0)
    with pytest.raises(ValueError, match="at least 1 broker"):
        replication_for(0)


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_the_override_comes_from_the_flag_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV_REPLICATION_FACTOR, raising=False)
    assert replication_factor() is None
    monkeypatch.setenv(ENV_REPLICATION_FACTOR, "2")
    assert replication_factor() == 2
    assert replication_factor(3) == 3
    monkeypatch.setenv(ENV_REPLICATION_FACTOR, "three")
    with pytest.raises(UsageError, match="positive integer"):
        replication_factor()
    with pytest.raises(UsageError, match="positive integer"):
        replication_factor(0)


def test_a_cluster_node_uses_the_same_rule_for_kafkas_own_topics(tmp_path: Path) -> None:
    voters = "1@127.0.0.1:1001,2@127.0.0.1:1002,3@127.0.0.1:1003"
    node = _props(server_properties(9002, 1002, tmp_path, node_id=2, voters=voters, replicas=3))
    assert node["node.id"] == "2" and node["controller.quorum.voters"] == voters
    assert node["offsets.topic.replication.factor"] == "3"
    assert node["default.replication.factor"] == "3" and node["min.insync.replicas"] == "2"
    assert node["transaction.state.log.min.isr"] == "2"
    assert node["unclean.leader.election.enable"] == "false"
    single = _props(server_properties(9092, 9093, tmp_path))
    assert single["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert single["offsets.topic.replication.factor"] == "1"
    assert single["min.insync.replicas"] == "1"
