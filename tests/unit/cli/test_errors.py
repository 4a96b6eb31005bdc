"""Client exceptions become one-line runwatch errors; bootstrap addresses parse strictly."""

from __future__ import annotations

import pytest
from kafka import errors as kafka_errors

from runwatch.common.errors import (
    BROKER_HINT,
    BrokerUnreachable,
    RunwatchError,
    UsageError,
    kafka_error,
)
from runwatch.reachability import api_versions_request, parse_bootstrap


@pytest.mark.parametrize(
    "exc",
    [
        kafka_errors.KafkaTimeoutError("Unable to bootstrap from 127.0.0.1:1"),
        kafka_errors.KafkaConnectionError("111 ECONNREFUSED"),
        kafka_errors.NodeNotReadyError(0),
    ],
    ids=type,
)
def test_no_broker_family_maps_to_broker_unreachable(exc: Exception) -> None:
    mapped = kafka_error(exc, "h:1")
    assert isinstance(mapped, BrokerUnreachable)
    assert mapped.exit_code == 4 and mapped.bootstrap == "h:1"
    text = str(mapped)
    assert "\n" not in text and "h:1" in text and text.endswith(BROKER_HINT)


def test_aiokafka_connection_error_maps_too() -> None:
    aio = pytest.importorskip("aiokafka.errors")
    mapped = kafka_error(aio.KafkaConnectionError("Unable to bootstrap from [('h', 1)]"), "h:1")
    assert isinstance(mapped, BrokerUnreachable)


def test_other_client_errors_are_one_line_failures() -> None:
    mapped = kafka_error(kafka_errors.TopicAuthorizationFailedError("no\naccess"), "h:1")
    assert type(mapped) is RunwatchError and mapped.exit_code == 1
    assert str(mapped) == "Kafka at h:1 failed: TopicAuthorizationFailedError: " + " ".join(
        str(kafka_errors.TopicAuthorizationFailedError("no\naccess")).split()
    )


def test_non_client_exceptions_are_not_mapped() -> None:
    assert kafka_error(ValueError("x"), "h:1") is None
    assert kafka_error(ConnectionRefusedError(), "h:1") is None


@pytest.mark.parametrize(
    ("text", "pairs"),
    [
        ("h:9092", [("h", 9092)]),
        ("a:1, b:2", [("a", 1), ("b", 2)]),
        ("[::1]:9092", [("::1", 9092)]),
    ],
)
def test_parse_bootstrap(text: str, pairs: list[tuple[str, int]]) -> None:
    assert parse_bootstrap(text) == pairs


@pytest.mark.parametrize("text", ["h", "h:", ":1", "h:0", "h:70000", "h:x", ","])
def test_bad_bootstrap_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="HOST:PORT"):
        parse_bootstrap(text)


def test_api_versions_request_is_size_prefixed() -> None:
    frame = api_versions_request()
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    assert frame[4:6] == (18).to_bytes(2, "big")  # ApiVersions
