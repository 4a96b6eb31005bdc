"""Shared fixtures: one real Kafka broker per test session, unique topic names per test.

Where the broker comes from, in order:
1. ``RUNWATCH_BOOTSTRAP`` (any running cluster);
2. testcontainers' Kafka module, when a Docker engine answers (unless
   ``RUNWATCH_TEST_BROKER=embedded``);
3. the embedded broker (``runwatch.broker``) in the session's temp dir, stopped at the end.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from schemas.topics import TopicSpec

TEST_KAFKA_IMAGE = os.environ.get("RUNWATCH_TEST_KAFKA_IMAGE", "confluentinc/cp-kafka:7.9.0")


def _docker_answers() -> bool:
    """True if a Docker engine answers a ping (cheap; False without the SDK or engine)."""
    if os.environ.get("RUNWATCH_TEST_BROKER") == "embedded":
        return False
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``host:port`` of a real Kafka broker shared by the whole session."""
    env = os.environ.get("RUNWATCH_BOOTSTRAP")
    if env:
        yield env
        return
    if _docker_answers():
        from testcontainers.community.kafka import KafkaContainer

        container = KafkaContainer(TEST_KAFKA_IMAGE).with_kraft()
        container.with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
        with container as kafka:
            yield kafka.get_bootstrap_server()
        return
    from runwatch.broker import ephemeral_broker

    data_dir: Path = tmp_path_factory.mktemp("kafka")
    with ephemeral_broker(data_dir) as info:
        yield info.bootstrap


@pytest.fixture
def topic_prefix() -> str:
    """A topic-name prefix unique to this test, so tests never share topics."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def make_topics(kafka_bootstrap: str) -> Callable[..., list[TopicSpec]]:
    """Create the topic catalogue for a prefix on the session broker; returns its specs.

    Usage: ``specs = make_topics(topic_prefix, partitions=2)``.
    """
    from runwatch import admin

    def make(prefix: str, partitions: int | None = None, **kwargs: Any) -> list[TopicSpec]:
        specs = admin.catalogue(prefix, partitions)
        admin.create_topics(kafka_bootstrap, specs, **kwargs)
        return specs

    return make
