"""Written as an attacker would: plain kafka-python, a stolen credential, no runwatch code.

The issue's attack: with write access to a topic trainers write, a forged
``anomaly.v1`` record became a signed rollback. With least privilege enforced by Kafka
(the secure session broker, the roles' ACLs for this test's prefix), a trainer's
credential cannot write a verdict, a command, a dead letter or the processors' state;
the sinks' credential cannot write anything; the controller's cannot write verdicts or
commands. Each refusal is checked next to an allowed call of the same client, so a
refusal cannot come from a broken connection.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import (
    GroupAuthorizationFailedError,
    KafkaError,
    KafkaTimeoutError,
    TopicAuthorizationFailedError,
)

from .conftest import SecureKafka

pytestmark = pytest.mark.integration

FORGED = json.dumps(
    {
        "type": "anomaly.v1",
        "run_id": "victim",
        "verdict_id": "f",
        "kind": "nonfinite_loss",
        "step": 1,
        "incarnation": 0,
    }
).encode()
"""The issue's forged verdict, as raw bytes."""

CATALOGUE = ("runs", "steps", "heartbeats", "checkpoints", "anomalies", "commands")
CATALOGUE += ("controller", "deadletter")


@pytest.fixture(scope="module")
def prefix(secure_kafka: SecureKafka) -> str:
    """One prefix with the roles' ACLs and its topics, for the module (app id: default)."""
    import uuid

    name = f"a{uuid.uuid4().hex[:10]}"
    secure_kafka.grant(name)
    return name


def _sasl(kafka: SecureKafka, user: str, password: str | None = None) -> dict[str, str]:
    return {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": user,
        "sasl_plain_password": password if password is not None else kafka.password(user),
    }


@pytest.fixture
def producer_as(secure_kafka: SecureKafka) -> Iterator:
    made: list[KafkaProducer] = []

    def make(user: str, **extra: object) -> KafkaProducer:
        producer = KafkaProducer(
            bootstrap_servers=secure_kafka.bootstrap,
            max_block_ms=10_000,
            request_timeout_ms=10_000,
            **{**_sasl(secure_kafka, user), **extra},
        )
        made.append(producer)
        return producer

    yield make
    for producer in made:
        producer.close(timeout=2)


def _send(producer: KafkaProducer, topic: str, value: bytes = FORGED) -> None:
    producer.send(topic, key=b"victim", value=value).get(timeout=15)


@pytest.mark.parametrize("short", ["anomalies", "commands", "deadletter"])
def test_a_trainer_cannot_write_a_verdict_a_command_or_a_dead_letter(
    producer_as, prefix: str, short: str
) -> None:
    trainer = producer_as("trainer")
    _send(trainer, f"{prefix}.steps", b"{}")  # allowed: its own input
    with pytest.raises(TopicAuthorizationFailedError):
        _send(trainer, f"{prefix}.{short}")


@pytest.mark.parametrize("table", ["step-health", "liveness", "policy"])
def test_a_trainer_cannot_write_the_processors_state(
    producer_as, secure_kafka: SecureKafka, prefix: str, table: str
) -> None:
    """A changelog the processors would restore a run's state from, existing or not."""
    with pytest.raises(TopicAuthorizationFailedError):
        _send(producer_as("trainer"), f"{prefix}-processors-{table}-changelog")


def _read_all(kafka: SecureKafka, user: str, topic: str, timeout_ms: int) -> list[bytes]:
    consumer = KafkaConsumer(
        bootstrap_servers=kafka.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        **_sasl(kafka, user),
    )
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        got: list[bytes] = []
        for records in consumer.poll(timeout_ms=timeout_ms).values():
            got += [r.value for r in records]
        return got
    finally:
        consumer.close()


@pytest.mark.parametrize(
    ("short", "writer", "refused"),
    [("steps", "trainer", True), ("commands", "processors", False)],
    ids=["own-input", "commands"],
)
def test_a_trainer_reads_nothing_not_even_its_own_inputs(
    producer_as, secure_kafka: SecureKafka, prefix: str, short: str, writer: str, refused: bool
) -> None:
    """Kafka refuses the fetch of a topic the trainer may write (so may describe), and
    hides one it may not even describe: kafka-python then has no partition to fetch."""
    topic = f"{prefix}.{short}"
    producer_as(writer).send(topic, key=b"k", value=b"there", partition=0).get(timeout=15)
    assert b"there" in _read_all(secure_kafka, "sinks", topic, 10_000)  # it is there
    if refused:
        with pytest.raises(TopicAuthorizationFailedError):
            _read_all(secure_kafka, "trainer", topic, 5_000)
    else:
        assert _read_all(secure_kafka, "trainer", topic, 5_000) == []


@pytest.mark.parametrize("short", CATALOGUE)
@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "plain"])
def test_the_sinks_credential_cannot_write_anything(
    producer_as, prefix: str, short: str, idempotent: bool
) -> None:
    sinks = producer_as("sinks", enable_idempotence=idempotent, acks=-1 if idempotent else 1)
    # An idempotent producer is refused its producer id (no Write anywhere); a plain one
    # is refused at the topic.
    with pytest.raises(KafkaError) as refused:
        _send(sinks, f"{prefix}.{short}")
    assert "AuthorizationFailed" in repr(refused.value)


def test_the_sinks_credential_reads_what_it_shows(secure_kafka: SecureKafka, prefix: str) -> None:
    consumer = KafkaConsumer(
        bootstrap_servers=secure_kafka.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        **_sasl(secure_kafka, "sinks"),
    )
    try:
        for short in CATALOGUE:
            assert consumer.partitions_for_topic(f"{prefix}.{short}"), short
    finally:
        consumer.close()


@pytest.mark.parametrize("short", ["anomalies", "commands", "deadletter"])
def test_the_controller_cannot_write_a_verdict_or_a_command(
    producer_as, prefix: str, short: str
) -> None:
    controller = producer_as("controller")
    _send(controller, f"{prefix}.controller", b"{}")  # allowed: its own topic
    with pytest.raises(TopicAuthorizationFailedError):
        _send(controller, f"{prefix}.{short}")


@pytest.mark.parametrize("user", ["trainer", "sinks", "controller"])
def test_no_other_role_joins_the_processors_group(
    secure_kafka: SecureKafka, prefix: str, user: str
) -> None:
    """Joining would take partitions away from the processors (and commit their offsets)."""
    consumer = KafkaConsumer(
        f"{prefix}.steps",
        bootstrap_servers=secure_kafka.bootstrap,
        group_id=f"{prefix}-processors",
        enable_auto_commit=False,
        **_sasl(secure_kafka, user),
    )
    try:
        with pytest.raises(GroupAuthorizationFailedError):
            consumer.poll(timeout_ms=10_000)
    finally:
        consumer.close()


@pytest.mark.parametrize("password", [None, "wrong"], ids=["no-login", "wrong-password"])
def test_no_login_no_kafka(secure_kafka: SecureKafka, prefix: str, password: str | None) -> None:
    """Without a valid SCRAM login a client never gets past the bootstrap."""
    security = {} if password is None else _sasl(secure_kafka, "trainer", password)
    with pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        KafkaProducer(
            bootstrap_servers=secure_kafka.bootstrap, bootstrap_timeout_ms=5_000, **security
        )
    good = KafkaProducer(
        bootstrap_servers=secure_kafka.bootstrap,
        bootstrap_timeout_ms=5_000,
        **_sasl(secure_kafka, "trainer"),
    )
    good.close(timeout=2)
