"""A secure embedded broker for the whole session: SASL/SCRAM-SHA-512, the StandardAuthorizer.

Separate from the plain session broker (``kafka_bootstrap``): a real Apache Kafka JVM
started by `runwatch.broker.EmbeddedBroker` with ``secure=True`` in the session's temp
dir, with its users (admin, trainer, processors, controller, sinks) and their passwords
in its ``credentials/`` directory. A test gets its own prefix: `SecureKafka.grant` applies
the roles' ACLs for it and creates its catalogue, as the admin.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition

from runwatch import admin
from runwatch.broker import ephemeral_broker
from runwatch.broker.acls import Scope, bindings, principals
from runwatch.broker.security import ADMIN_USER, Credentials, load_credentials
from runwatch.schemas.codec import decode
from runwatch.schemas.events import Event

WAIT_S = 90.0


@dataclass(frozen=True)
class SecureKafka:
    """The session's secure broker.

    Attributes:
        bootstrap: Its client (SASL) listener.
        data_dir: Its data directory.
        credentials: Every user's password.
    """

    bootstrap: str
    data_dir: Path
    credentials: Credentials

    def config(self, user: str) -> dict[str, Any]:
        """kafka-python settings that log in as ``user``."""
        return self.credentials.client_config(user)

    def environ(self, user: str) -> dict[str, str]:
        """The ``RUNWATCH_*`` variables of a process that logs in as ``user``."""
        return self.credentials.environ(user, self.bootstrap)

    def password(self, user: str) -> str:
        """``user``'s password (what an attacker holding that credential knows)."""
        return self.credentials.password(user)

    def grant(self, prefix: str, app_id: str | None = None, partitions: int = 2) -> Scope:
        """As the admin: the roles' ACLs for ``prefix`` and the catalogue's topics."""
        scope = Scope.of(prefix, app_id)
        as_admin = self.config(ADMIN_USER)
        admin.apply_acls(self.bootstrap, bindings(scope, principals()), client_config=as_admin)
        specs = admin.catalogue(prefix, partitions)
        admin.create_topics(self.bootstrap, specs, client_config=as_admin)
        return scope


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    """A secure embedded broker shared by the session's security tests."""
    data_dir = tmp_path_factory.mktemp("secure-kafka")
    with ephemeral_broker(data_dir, secure=True, scope=Scope.of("unused")) as info:
        assert info.secure
        yield SecureKafka(info.bootstrap, data_dir, load_credentials(data_dir))


@pytest.fixture
def secure_prefix() -> str:
    """A topic prefix unique to this test."""
    return f"s{uuid.uuid4().hex[:10]}"


class SecureReader:
    """Reads a topic from its beginning as one user, accumulating decoded events."""

    def __init__(self, kafka: SecureKafka, user: str, topic: str) -> None:
        self.consumer = KafkaConsumer(
            bootstrap_servers=kafka.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            **kafka.config(user),
        )
        parts = self.consumer.partitions_for_topic(topic) or set()
        assert parts, f"{user} sees no partition of {topic}"
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        self.consumer.assign(tps)
        self.consumer.seek_to_beginning(*tps)
        self.events: list[Event] = []

    def wait_for(
        self, done: Callable[[list[Event]], bool], timeout_s: float = WAIT_S
    ) -> list[Event]:
        """Consume until ``done(events)``; every event read so far."""
        deadline = time.monotonic() + timeout_s
        while not done(self.events):
            assert time.monotonic() < deadline, f"timed out; have {self.events[-5:]}"
            for records in self.consumer.poll(timeout_ms=200).values():
                self.events += [decode(r.value) for r in records if r.value is not None]
        return self.events

    def close(self) -> None:
        self.consumer.close()
