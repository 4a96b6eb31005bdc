"""Partition counts from --partitions / RUNWATCH_PARTITIONS, and the processors' view."""

from __future__ import annotations

import pytest

from runwatch.common.errors import UsageError
from runwatch.common.settings import ENV_PARTITIONS
from runwatch.processors.settings import ProcessorSettings
from runwatch.resolve import partition_counts
from runwatch.schemas.topics import DEFAULT_PARTITIONS


def test_none_means_the_catalogue(monkeypatch):
    monkeypatch.delenv(ENV_PARTITIONS, raising=False)
    assert partition_counts(None) is None


def test_environment_then_argument(monkeypatch):
    monkeypatch.setenv(ENV_PARTITIONS, "heartbeats=32")
    assert partition_counts(None)["heartbeats"] == 32
    assert partition_counts("steps=3")["heartbeats"] == DEFAULT_PARTITIONS["heartbeats"]


def test_bad_value_is_a_usage_error_naming_its_source(monkeypatch):
    monkeypatch.setenv(ENV_PARTITIONS, "beats=3")
    with pytest.raises(UsageError, match=f"{ENV_PARTITIONS}: no topic 'beats'"):
        partition_counts(None)
    with pytest.raises(UsageError, match="--partitions: partitions must be positive"):
        partition_counts("steps=0")


def test_processor_settings_read_counts_by_role():
    settings = ProcessorSettings(bootstrap="b", partitions={"heartbeats": 5})
    assert settings.partitions_of("heartbeats") == 5
    assert settings.partitions_of("steps") == DEFAULT_PARTITIONS["steps"]
