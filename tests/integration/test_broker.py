"""The embedded broker against a real Apache Kafka JVM: lifecycle, durability, errors, CLI."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runwatch import admin
from runwatch.broker import EmbeddedBroker, ensure_jars, running_bootstrap
from runwatch.cli import main
from runwatch.common.errors import RunwatchError

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class _Spec:
    name: str
    partitions: int
    compacted: bool
    retention_ms: int | None
    carries: str = "test"


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for value in values:
            producer.send(topic, key=b"run-1", value=value)
        producer.flush(timeout=30)
    finally:
        producer.close()


def _consume_all(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=15_000,
    )
    got: list[bytes] = []
    try:
        for message in consumer:
            got.append(message.value)
            if len(got) >= expected:
                break
    finally:
        consumer.close()
    return got


def test_session_broker_answers_and_creates_topics(kafka_bootstrap: str, topic_prefix: str) -> None:
    specs = [
        _Spec(f"{topic_prefix}.runs", 2, compacted=True, retention_ms=None),
        _Spec(f"{topic_prefix}.steps", 3, compacted=False, retention_ms=3_600_000),
    ]
    first = admin.create_topics(kafka_bootstrap, specs)
    assert first == {f"{topic_prefix}.runs": True, f"{topic_prefix}.steps": True}
    again = admin.create_topics(kafka_bootstrap, specs)  # idempotent
    assert again == {f"{topic_prefix}.runs": False, f"{topic_prefix}.steps": False}
    listed = admin.list_topics(kafka_bootstrap)
    assert listed[f"{topic_prefix}.runs"] == 2
    assert listed[f"{topic_prefix}.steps"] == 3
    assert not any(name.startswith("__") for name in listed)

    from kafka.admin import ConfigResource, ConfigResourceType

    with admin.admin_client(kafka_bootstrap) as client:
        described = client.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, f"{topic_prefix}.runs")]
        )
    assert "compact" in repr(described)


def test_make_topics_creates_the_catalogue(
    kafka_bootstrap: str, topic_prefix: str, make_topics: Callable[..., list[Any]]
) -> None:
    specs = make_topics(topic_prefix, partitions=2)
    assert specs and all(spec.name.startswith(f"{topic_prefix}.") for spec in specs)
    listed = admin.list_topics(kafka_bootstrap)
    assert {spec.name: 2 for spec in specs}.items() <= listed.items()


def test_restart_keeps_messages_and_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "broker"
    broker = EmbeddedBroker(data_dir)
    first = broker.start()
    try:
        assert running_bootstrap(data_dir) == first.bootstrap
        assert main(["broker", "status", "--data-dir", str(data_dir)]) == 0
        assert capsys.readouterr().out.strip() == first.bootstrap
        topic = "durable.steps"
        admin.create_topics(first.bootstrap, [_Spec(topic, 1, False, None)])
        values = [f"step-{i}".encode() for i in range(5)]
        _produce(first.bootstrap, topic, values)
    finally:
        assert broker.stop()
    assert running_bootstrap(data_dir) is None
    assert not broker.pid_file.exists()

    again = EmbeddedBroker(data_dir)
    second = again.start()
    try:
        assert second.port == first.port  # chosen automatically and still free: kept
        assert second.pid != first.pid
        assert _consume_all(second.bootstrap, topic, len(values)) == values
    finally:
        again.stop()


def test_stale_pid_file_is_cleaned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    broker = EmbeddedBroker(tmp_path)
    broker.pid_file.write_text(f"{dead.pid}\n")
    assert running_bootstrap(tmp_path) is None  # a dead pid is never reported as running
    with caplog.at_level(logging.WARNING, logger="runwatch.broker"):
        assert main(["broker", "status", "--data-dir", str(tmp_path)]) == 1
    assert not broker.pid_file.exists()
    assert "stale pid file" in caplog.text


def test_port_taken_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(RunwatchError, match=f"port {port} on 127.0.0.1 is taken"):
            EmbeddedBroker(tmp_path, port=port).start()
    assert not EmbeddedBroker(tmp_path).pid_file.exists()


def test_port_taken_via_cli_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        status = main(["broker", "start", "--port", str(port), "--data-dir", str(tmp_path)])
    assert status == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("runwatch broker: port") and "\n" not in err


def test_crash_during_startup_shows_log_tail(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path, jvm_opts=["-Xmx1m", "-Xms1m"])
    with pytest.raises(RunwatchError, match="exited with status") as caught:
        broker.start(timeout_s=60)
    assert str(broker.out_file) in str(caught.value)
    assert not broker.pid_file.exists()


def test_status_fails_when_none_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RUNWATCH_HOME", str(tmp_path))
    assert main(["broker", "status"]) != 0
    assert "no broker runs" in capsys.readouterr().err
    assert running_bootstrap() is None
    assert main(["broker", "stop"]) == 0  # stopping nothing is fine


def test_no_mvn_on_path_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import runwatch.broker.jars as jars

    real_which = jars.shutil.which
    monkeypatch.setattr(
        jars.shutil, "which", lambda name: None if name == "mvn" else real_which(name)
    )
    with pytest.raises(RunwatchError, match="no `mvn` on PATH"):
        ensure_jars(tmp_path / "libs")


def test_maven_central_unreachable_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"  # a Maven user home whose only repository refuses connections
    (home / ".m2").mkdir(parents=True)
    (home / ".m2" / "settings.xml").write_text(
        "<settings><mirrors><mirror><id>down</id><mirrorOf>*</mirrorOf>"
        "<url>http://127.0.0.1:9/maven2</url></mirror></mirrors></settings>"
    )
    monkeypatch.setenv("MAVEN_OPTS", f"-Duser.home={home}")
    with pytest.raises(RunwatchError, match="mvn failed") as caught:
        ensure_jars(tmp_path / "libs", timeout_s=120)
    message = str(caught.value)
    assert "Connection refused" in message and "\n" not in message
    assert "[Help" not in message
