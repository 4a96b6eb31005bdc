"""Shared fixtures: one real Kafka broker per test session, unique topic names per test.

Where the broker comes from, in order:
1. ``RUNWATCH_BOOTSTRAP`` (any running cluster);
2. a container of ``RUNWATCH_TEST_KAFKA_IMAGE`` (default ``runwatch/kafka:local``, built by
   ``compose/images/build.sh kafka``) through testcontainers, when a Docker engine answers and
   the image is there (``RUNWATCH_TEST_BROKER=docker``: required, pulled if missing;
   ``RUNWATCH_TEST_BROKER=embedded``: never). Confluent's images (``confluentinc/cp-kafka``)
   run through testcontainers' KafkaContainer, any other through a plain container on the
   host network, configured with ``KAFKA_*`` variables (the apache/kafka convention the
   runwatch image follows) on a free loopback port;
3. the embedded broker (``runwatch.broker``) in the session's temp dir, stopped at the end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from runwatch.schemas.topics import TopicSpec

TEST_KAFKA_IMAGE = os.environ.get("RUNWATCH_TEST_KAFKA_IMAGE", "runwatch/kafka:local")
KAFKA_STARTED = "Kafka Server started"  # KRaft logs it once the node is registered, unfenced


def _docker_broker_wanted() -> bool:
    """True if the session broker runs in Docker (see the module docstring)."""
    choice = os.environ.get("RUNWATCH_TEST_BROKER", "")
    if choice == "embedded":
        return False
    if choice == "docker":
        return True
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            client.ping()
            client.images.get(TEST_KAFKA_IMAGE)  # never pulled unasked: no registry, no wait
        finally:
            client.close()
    except Exception:
        return False
    return True


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _docker_kafka(image: str) -> Iterator[str]:
    """A single-node KRaft broker in a container of ``image``; yields its bootstrap."""
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")  # Ryuk is one more image
    if image.startswith("confluentinc/"):
        from testcontainers.community.kafka import KafkaContainer

        container = KafkaContainer(image).with_kraft()
        container.with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
        with container as kafka:
            yield kafka.get_bootstrap_server()
        return
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    port, controller = _free_port(), _free_port()
    generic = DockerContainer(image).with_kwargs(network_mode="host")
    generic.waiting_for(LogMessageWaitStrategy(KAFKA_STARTED).with_startup_timeout(180))
    generic.with_envs(
        KAFKA_NODE_ID="1",
        KAFKA_PROCESS_ROLES="broker,controller",
        KAFKA_LISTENERS=f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        KAFKA_ADVERTISED_LISTENERS=f"PLAINTEXT://127.0.0.1:{port}",
        KAFKA_CONTROLLER_QUORUM_VOTERS=f"1@127.0.0.1:{controller}",
        KAFKA_CONTROLLER_LISTENER_NAMES="CONTROLLER",
        KAFKA_LISTENER_SECURITY_PROTOCOL_MAP="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        KAFKA_INTER_BROKER_LISTENER_NAME="PLAINTEXT",
        KAFKA_AUTO_CREATE_TOPICS_ENABLE="false",
        KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR="1",
        KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS="0",
    )
    with generic:
        yield f"127.0.0.1:{port}"


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``host:port`` of a real Kafka broker shared by the whole session."""
    env = os.environ.get("RUNWATCH_BOOTSTRAP")
    if env:
        yield env
        return
    if _docker_broker_wanted():
        with _docker_kafka(TEST_KAFKA_IMAGE) as bootstrap:
            yield bootstrap
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


@pytest.fixture(autouse=True)
def _runwatch_log_handlers_removed() -> Iterator[None]:
    """Each test leaves no runwatch handler on the root logger.

    A CLI test that runs ``runwatch.cli.main`` in-process gets `runwatch.cli.setup_logging`,
    which puts a stderr handler bound to that test's captured stderr on the root logger.
    Left there, a later test's record (a background thread's too) reaches a closed stream
    and prints ``--- Logging error ---``, which depends on which tests ran before it in
    the process (it showed under two xdist workers).
    """
    root = logging.getLogger()
    before = set(root.handlers)
    yield
    for handler in [h for h in root.handlers if h not in before]:
        if type(handler).__module__.startswith("runwatch."):
            root.removeHandler(handler)
