"""A secure broker's properties, passwords and files (the broker itself: tests/integration/security)."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest

from runwatch.broker.acls import Role
from runwatch.broker.config import server_properties
from runwatch.broker.security import (
    ADMIN_USER,
    AUTHORIZER,
    credentials_dir,
    ensure_credentials,
    is_secure,
    load_credentials,
    users,
    write_env_files,
)
from runwatch.common.errors import RunwatchError
from runwatch.common.settings import kafka_client_config


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_users_are_the_admin_and_one_per_role() -> None:
    assert users() == (ADMIN_USER, *(r.value for r in Role))


def test_credentials_are_made_once_private_and_kept(tmp_path: Path) -> None:
    assert not is_secure(tmp_path)
    first = ensure_credentials(tmp_path)
    assert is_secure(tmp_path) and set(first.passwords) == set(users())
    assert len(set(first.passwords.values())) == len(users())  # one password each
    assert all(len(p) >= 32 for p in first.passwords.values())
    folder = credentials_dir(tmp_path)
    assert _mode(folder) == 0o700
    assert all(_mode(f) == 0o600 for f in folder.iterdir())
    assert ensure_credentials(tmp_path) == first == load_credentials(tmp_path)


def test_a_user_added_later_gets_a_password_and_the_others_keep_theirs(tmp_path: Path) -> None:
    first = ensure_credentials(tmp_path)
    path = credentials_dir(tmp_path) / "credentials.json"
    older = {u: p for u, p in first.passwords.items() if u != Role.SINKS.value}
    path.write_text(json.dumps({"passwords": older}))
    again = ensure_credentials(tmp_path)
    assert {u: again.passwords[u] for u in older} == older
    assert again.passwords[Role.SINKS.value] and again.passwords[Role.SINKS.value] not in older


def test_no_credentials_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RunwatchError, match="no secure broker"):
        load_credentials(tmp_path)
    with pytest.raises(RunwatchError, match="no user 'nobody'"):
        ensure_credentials(tmp_path).password("nobody")


def test_a_secure_node_takes_scram_only_checks_acls_and_authenticates_its_controller(
    tmp_path: Path,
) -> None:
    creds = ensure_credentials(tmp_path)
    props = _props(server_properties(9092, 9093, tmp_path, security=creds.broker_properties()))
    assert props["listeners"] == "SASL_PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["listener.security.protocol.map"] == (
        "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT"
    )
    assert props["listener.name.sasl_plaintext.sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["listener.name.controller.sasl.enabled.mechanisms"] == "PLAIN"
    assert props["authorizer.class.name"] == AUTHORIZER
    assert props["super.users"] == f"User:{ADMIN_USER}"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert "PLAINTEXT:PLAINTEXT" not in props["listener.security.protocol.map"]
    plain = _props(server_properties(9092, 9093, tmp_path))
    assert "authorizer.class.name" not in plain and plain["listeners"].startswith("PLAINTEXT://")


def test_an_env_file_connects_as_its_user(tmp_path: Path) -> None:
    creds = ensure_credentials(tmp_path)
    paths = write_env_files(tmp_path, creds, "127.0.0.1:9999")
    assert [p.name for p in paths] == [f"{u}.env" for u in users()]
    trainer = credentials_dir(tmp_path) / "trainer.env"
    assert _mode(trainer) == 0o600
    shell = subprocess.run(
        ["sh", "-c", f". {trainer}; env"], capture_output=True, text=True, check=True, env={}
    )
    env = dict(line.split("=", 1) for line in shell.stdout.splitlines() if "=" in line)
    assert env["RUNWATCH_BOOTSTRAP"] == "127.0.0.1:9999"
    assert kafka_client_config(env) == creds.client_config("trainer")


def test_a_data_directory_formatted_plain_cannot_become_secure(tmp_path: Path) -> None:
    from runwatch.broker import EmbeddedBroker

    (tmp_path / "kafka-logs").mkdir()
    (tmp_path / "kafka-logs" / "meta.properties").write_text("cluster.id=x\n")
    assert EmbeddedBroker(tmp_path).credentials() is None  # plain stays plain
    with pytest.raises(RunwatchError, match="formatted without security"):
        EmbeddedBroker(tmp_path, secure=True).credentials()
    assert not is_secure(tmp_path)  # and nothing was written


def test_a_secure_data_directory_stays_secure_without_the_flag(tmp_path: Path) -> None:
    from runwatch.broker import EmbeddedBroker

    made = EmbeddedBroker(tmp_path, secure=True).credentials()
    assert made is not None and EmbeddedBroker(tmp_path).credentials() == made


def test_the_controllers_login_gives_its_ranks_the_trainers(tmp_path: Path) -> None:
    from runwatch.common.settings import ranks_environ

    creds = ensure_credentials(tmp_path)
    launcher = creds.environ("controller", "127.0.0.1:1")
    assert kafka_client_config(launcher) == creds.client_config("controller")
    ranks = ranks_environ(launcher)
    assert kafka_client_config(ranks) == creds.client_config("trainer")
    assert creds.password("controller") not in ranks.values()
    assert "RUNWATCH_TRAINER_SASL_USERNAME" not in creds.environ("sinks", "127.0.0.1:1")
