"""The command line of a secure deployment: the broker's users, topics with ACLs, the warning.

Against real brokers: the secure session broker and, for the warning, the plain one.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kafka import KafkaProducer
from kafka.admin import (
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePatternFilter,
    ResourceType,
)

from runwatch import admin
from runwatch.broker.acls import Role, Scope, bindings, principals
from runwatch.broker.security import ADMIN_USER
from runwatch.procs import ManagedProcess

from .conftest import SecureKafka

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RUNWATCH_")}
    return subprocess.run(
        [sys.executable, "-m", "runwatch.cli", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**base, **(env or {})},
        cwd=REPO,
    )


def _acls_of(kafka: SecureKafka, principal: str) -> set[tuple[str, str, str, str]]:
    """(resource type, pattern, name, operation) of every ACL of ``principal``, as the admin."""
    client = KafkaAdminClient(bootstrap_servers=kafka.bootstrap, **kafka.config(ADMIN_USER))
    try:
        found, _ = client.describe_acls(
            ACLFilter(
                principal=principal,
                host=None,
                operation=ACLOperation.ANY,
                permission_type=ACLPermissionType.ANY,
                resource_pattern=ResourcePatternFilter(
                    ResourceType.ANY, None, ACLResourcePatternType.ANY
                ),
            )
        )
    finally:
        client.close()
    return {
        (
            a.resource_pattern.resource_type.name,
            a.resource_pattern.pattern_type.name,
            a.resource_pattern.resource_name,
            a.operation.name,
        )
        for a in found
    }


def _expected(scope: Scope, role: Role) -> set[tuple[str, str, str, str]]:
    return {
        (acl.resource.value, acl.pattern.value, acl.name, op.value)
        for principal, acl in bindings(scope, principals())
        if principal == f"User:{role.value}"
        for op in acl.operations
    }


def test_broker_env_prints_a_working_login_per_user(secure_kafka: SecureKafka) -> None:
    data_dir = str(secure_kafka.data_dir)
    status = _cli("broker", "status", "--data-dir", data_dir)
    assert status.returncode == 0 and status.stdout.strip() == secure_kafka.bootstrap
    shown = _cli("broker", "env", "trainer", "--data-dir", data_dir)
    assert shown.returncode == 0, shown.stderr
    exported = dict(
        line.removeprefix("export ").split("=", 1)
        for line in shown.stdout.splitlines()
        if line.startswith("export ")
    )
    assert exported == secure_kafka.environ("trainer")
    producer = KafkaProducer(
        bootstrap_servers=exported["RUNWATCH_BOOTSTRAP"],
        security_protocol=exported["RUNWATCH_SECURITY_PROTOCOL"],
        sasl_mechanism=exported["RUNWATCH_SASL_MECHANISM"],
        sasl_plain_username=exported["RUNWATCH_SASL_USERNAME"],
        sasl_plain_password=exported["RUNWATCH_SASL_PASSWORD"],
        bootstrap_timeout_ms=10_000,
    )
    producer.close(timeout=2)
    unknown = _cli("broker", "env", "root", "--data-dir", data_dir)
    assert unknown.returncode != 0 and "no user 'root'" in unknown.stderr


def test_a_start_of_the_running_secure_broker_grants_another_prefix(
    secure_kafka: SecureKafka, secure_prefix: str
) -> None:
    scope = Scope.of(secure_prefix, f"{secure_prefix}-app")
    assert not _acls_of(secure_kafka, "User:sinks") & _expected(scope, Role.SINKS)
    started = _cli(
        "broker",
        "start",
        "--data-dir",
        str(secure_kafka.data_dir),
        "--prefix",
        secure_prefix,
        "--app-id",
        scope.app_id,
    )
    assert started.returncode == 0, started.stderr
    assert "already running" in started.stderr and "secure:" in started.stderr
    for role in Role:
        assert _expected(scope, role) <= _acls_of(secure_kafka, f"User:{role.value}"), role


def test_topics_create_applies_the_roles_acls_as_an_admin(
    secure_kafka: SecureKafka, secure_prefix: str
) -> None:
    scope = Scope.of(secure_prefix)
    args = ("topics", "create", "--prefix", secure_prefix, "--partitions", "1", "--acls")
    refused = _cli(*args, "apply", env=secure_kafka.environ("trainer"))
    assert refused.returncode != 0 and "not authorized to create" in refused.stderr
    done = _cli(*args, "apply", "--principal", "trainer=alice", env=secure_kafka.environ("admin"))
    assert done.returncode == 0, done.stderr
    assert f"{secure_prefix}.anomalies\tcreated" in done.stdout
    assert "applied" in done.stderr
    trainer_grants = {
        (acl.resource.value, acl.pattern.value, acl.name, op.value)
        for principal, acl in bindings(scope, principals({Role.TRAINER: "User:alice"}))
        if principal == "User:alice"
        for op in acl.operations
    }
    assert _acls_of(secure_kafka, "User:alice") == trainer_grants
    assert _expected(scope, Role.PROCESSORS) <= _acls_of(secure_kafka, "User:processors")
    again = _cli(*args, "apply", env=secure_kafka.environ("admin"))  # idempotent
    assert again.returncode == 0 and f"{secure_prefix}.anomalies\texists" in again.stdout


def test_topics_create_prints_the_acls_without_touching_kafka() -> None:
    printed = _cli("topics", "create", "--prefix", "p", "--acls", "print", "--bootstrap", "k:1")
    assert printed.returncode == 0, printed.stderr
    lines = [line for line in printed.stdout.splitlines() if not line.startswith("#")]
    assert len(lines) == len(bindings(Scope.of("p"), principals()))
    assert all(line.startswith("kafka-acls.sh --bootstrap-server k:1 ") for line in lines)
    assert "nothing created" in printed.stderr


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "secure"])
def test_the_no_authorizer_warning_is_said_only_without_one(
    kafka_bootstrap: str,
    secure_kafka: SecureKafka,
    secure: bool,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bootstrap = secure_kafka.bootstrap if secure else kafka_bootstrap
    if secure:
        for name, value in secure_kafka.environ("sinks").items():
            monkeypatch.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger="runwatch"):
        admin.warn_if_no_authorizer(bootstrap, "p", "sinks").join(timeout=30)
    said = [r for r in caplog.records if r.name == "runwatch.sinks"]
    assert admin.authorizer_enabled(bootstrap) is secure
    assert len(said) == (0 if secure else 1)
    if not secure:
        assert "can forge verdicts" in said[0].getMessage()
        assert "runwatch broker start --secure" in said[0].getMessage()


def test_a_component_says_it_once_at_start(kafka_bootstrap: str, tmp_path: Path) -> None:
    """``runwatch sinks`` on the plain broker: one WARNING line, then it runs on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWATCH_")}
    sinks = ManagedProcess.runwatch(
        "sinks",
        [
            "sinks",
            "--bootstrap",
            kafka_bootstrap,
            "--prefix",
            "nowarn",
            "--archive",
            str(tmp_path / "archive"),
        ],
        tmp_path / "sinks.log",
        env={**env, "RUNWATCH_HOME": str(tmp_path)},
    )
    try:
        deadline = time.monotonic() + 60
        # it said what it started, and (from its own thread) the warning
        while not all(s in sinks.log_tail(50) for s in ("archive (group", "checks no ACLs")):
            assert sinks.returncode is None, sinks.log_tail(50)
            assert time.monotonic() < deadline, sinks.log_tail(50)
            time.sleep(0.2)  # polling a log file
        lines = sinks.log_tail(50).splitlines()
    finally:
        sinks.stop()
    warned = [line for line in lines if "checks no ACLs" in line]
    assert len(warned) == 1 and "WARNING runwatch.sinks" in warned[0], lines


def test_a_client_without_a_login_is_told_to_source_one(
    secure_kafka: SecureKafka, tmp_path: Path
) -> None:
    """A command that finds the secure embedded broker by itself needs a role's login."""
    (tmp_path / "broker").symlink_to(secure_kafka.data_dir)  # $RUNWATCH_HOME/broker
    bare = _cli("status", env={"RUNWATCH_HOME": str(tmp_path)})
    assert bare.returncode != 0
    assert "is secure: connect as a role" in bare.stderr
    assert "runwatch broker env" in bare.stderr
    login = {k: v for k, v in secure_kafka.environ("sinks").items() if k != "RUNWATCH_BOOTSTRAP"}
    found = _cli("status", "--prefix", "nothing", env={"RUNWATCH_HOME": str(tmp_path), **login})
    assert found.returncode == 0, found.stderr
