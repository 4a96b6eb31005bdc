"""faust_broker_settings: the RUNWATCH_* security variables as faust App settings."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import faust
import pytest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from runwatch.common.settings import (
    SASL_MECHANISMS,
    faust_broker_settings,
    kafka_client_config,
    validate_sasl_mechanism,
)

SCRAM = {
    "RUNWATCH_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "RUNWATCH_SASL_MECHANISM": "SCRAM-SHA-512",
    "RUNWATCH_SASL_USERNAME": "runwatch",
    "RUNWATCH_SASL_PASSWORD": "s3cret",
}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A self-signed CA certificate and a client certificate/key (PEM), made by openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: cannot make test certificates")
    d = tmp_path_factory.mktemp("pki")
    ca_key, ca_crt = d / "ca.key", d / "ca.crt"
    key, csr, crt = d / "client.key", d / "client.csr", d / "client.crt"

    def ossl(*args: str | Path) -> None:
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)

    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
         "-keyout", ca_key, "-out", ca_crt)  # fmt: skip
    ossl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=runwatch", "-keyout", key,
         "-out", csr)  # fmt: skip
    ossl("x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey", ca_key, "-CAcreateserial",
         "-days", "2", "-out", crt)  # fmt: skip
    return {"ca": ca_crt, "cert": crt, "key": key}


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"RUNWATCH_SECURITY_PROTOCOL": "PLAINTEXT"},
        {"RUNWATCH_SECURITY_PROTOCOL": "plaintext"},
        # Empty values (compose's `${VAR:-}`) count as unset, as in kafka_client_config.
        {"RUNWATCH_SECURITY_PROTOCOL": "", "RUNWATCH_SASL_USERNAME": "", "RUNWATCH_SSL_CAFILE": ""},
    ],
)
def test_plaintext_leaves_faust_defaults(env: dict[str, str]) -> None:
    assert faust_broker_settings(env) == {}


def test_reads_os_environ_when_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    for var, value in SCRAM.items():
        monkeypatch.setenv(var, value)
    creds = faust_broker_settings()["broker_credentials"]
    assert isinstance(creds, faust.SASLCredentials)
    assert creds.username == "runwatch"


@pytest.mark.parametrize("mechanism", SASL_MECHANISMS)
def test_sasl_plaintext(mechanism: str) -> None:
    creds = faust_broker_settings({**SCRAM, "RUNWATCH_SASL_MECHANISM": mechanism})[
        "broker_credentials"
    ]
    assert isinstance(creds, faust.SASLCredentials)
    # What faust hands to aiokafka: the same fields kafka_client_config gives kafka-python.
    assert credentials_to_aiokafka_auth(creds) == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "runwatch",
        "sasl_plain_password": "s3cret",
        "ssl_context": None,
    }


def test_mechanism_and_protocol_are_case_insensitive() -> None:
    env = {
        **SCRAM,
        "RUNWATCH_SECURITY_PROTOCOL": "sasl_plaintext",
        "RUNWATCH_SASL_MECHANISM": "scram-sha-256",
    }
    auth = credentials_to_aiokafka_auth(faust_broker_settings(env)["broker_credentials"])
    assert (auth["security_protocol"], auth["sasl_mechanism"]) == (
        "SASL_PLAINTEXT",
        "SCRAM-SHA-256",
    )


@pytest.mark.parametrize("bad", ["GSSAPI", "OAUTHBEARER", "SCRAM-SHA-1", "plain text"])
def test_unsupported_mechanism_is_a_clear_error(bad: str) -> None:
    with pytest.raises(
        ValueError, match=r"RUNWATCH_SASL_MECHANISM=.*PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"
    ):
        faust_broker_settings({**SCRAM, "RUNWATCH_SASL_MECHANISM": bad})
    with pytest.raises(ValueError, match="not supported"):
        validate_sasl_mechanism(bad)


def test_validate_sasl_mechanism_normalises() -> None:
    assert validate_sasl_mechanism(" scram-sha-512 ") == "SCRAM-SHA-512"


def test_unknown_protocol() -> None:
    with pytest.raises(ValueError, match=r"RUNWATCH_SECURITY_PROTOCOL='TLS'.*SASL_SSL"):
        faust_broker_settings({"RUNWATCH_SECURITY_PROTOCOL": "TLS"})


def test_sasl_needs_a_mechanism() -> None:
    env = {k: v for k, v in SCRAM.items() if k != "RUNWATCH_SASL_MECHANISM"}
    with pytest.raises(ValueError, match="needs RUNWATCH_SASL_MECHANISM"):
        faust_broker_settings(env)


def test_sasl_needs_username_and_password() -> None:
    env = {k: v for k, v in SCRAM.items() if k != "RUNWATCH_SASL_PASSWORD"}
    with pytest.raises(ValueError, match="needs RUNWATCH_SASL_PASSWORD"):
        faust_broker_settings(env)


@pytest.mark.parametrize(
    ("protocol", "extra"),
    [
        ("PLAINTEXT", {"RUNWATCH_SASL_USERNAME": "u"}),
        (None, {"RUNWATCH_SASL_MECHANISM": "PLAIN"}),
        ("SASL_PLAINTEXT", {"RUNWATCH_SSL_CAFILE": "/ca.pem"}),
        ("SSL", {"RUNWATCH_SASL_PASSWORD": "p"}),
    ],
)
def test_settings_the_protocol_would_ignore_are_refused(
    protocol: str | None, extra: dict[str, str]
) -> None:
    env = {**SCRAM, **extra} if protocol == "SASL_PLAINTEXT" else dict(extra)
    if protocol is not None:
        env["RUNWATCH_SECURITY_PROTOCOL"] = protocol
    with pytest.raises(ValueError, match="does not use them"):
        faust_broker_settings(env)


def test_ssl_with_ca(pki: dict[str, Path]) -> None:
    env = {"RUNWATCH_SECURITY_PROTOCOL": "SSL", "RUNWATCH_SSL_CAFILE": str(pki["ca"])}
    creds = faust_broker_settings(env)["broker_credentials"]
    assert isinstance(creds, faust.SSLCredentials)
    ctx = creds.context
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert any(c["subject"] == ((("commonName", "test-ca"),),) for c in ctx.get_ca_certs())
    assert credentials_to_aiokafka_auth(creds)["security_protocol"] == "SSL"


def test_ssl_without_ca_uses_system_trust() -> None:
    creds = faust_broker_settings({"RUNWATCH_SECURITY_PROTOCOL": "SSL"})["broker_credentials"]
    assert isinstance(creds, faust.SSLCredentials)
    assert creds.context.verify_mode == ssl.CERT_REQUIRED


def test_sasl_ssl_with_client_certificate(pki: dict[str, Path]) -> None:
    env = {
        **SCRAM,
        "RUNWATCH_SECURITY_PROTOCOL": "SASL_SSL",
        "RUNWATCH_SSL_CAFILE": str(pki["ca"]),
        "RUNWATCH_SSL_CERTFILE": str(pki["cert"]),
        "RUNWATCH_SSL_KEYFILE": str(pki["key"]),
    }
    creds = faust_broker_settings(env)["broker_credentials"]
    assert isinstance(creds, faust.SASLCredentials)
    auth = credentials_to_aiokafka_auth(creds)
    assert auth["security_protocol"] == "SASL_SSL"
    assert auth["sasl_mechanism"] == "SCRAM-SHA-512"
    assert isinstance(auth["ssl_context"], ssl.SSLContext)


def test_unreadable_ca_names_the_variable(tmp_path: Path) -> None:
    env = {"RUNWATCH_SECURITY_PROTOCOL": "SSL", "RUNWATCH_SSL_CAFILE": str(tmp_path / "nope.pem")}
    with pytest.raises(ValueError, match="RUNWATCH_SSL_CAFILE="):
        faust_broker_settings(env)


def test_bad_client_certificate_names_the_variables(pki: dict[str, Path]) -> None:
    env = {
        "RUNWATCH_SECURITY_PROTOCOL": "SSL",
        "RUNWATCH_SSL_CERTFILE": str(pki["cert"]),
        "RUNWATCH_SSL_KEYFILE": str(pki["ca"]),  # a certificate, not a key
    }
    with pytest.raises(ValueError, match="RUNWATCH_SSL_CERTFILE="):
        faust_broker_settings(env)


def test_keyfile_without_certfile(pki: dict[str, Path]) -> None:
    env = {"RUNWATCH_SECURITY_PROTOCOL": "SSL", "RUNWATCH_SSL_KEYFILE": str(pki["key"])}
    with pytest.raises(ValueError, match="without RUNWATCH_SSL_CERTFILE"):
        faust_broker_settings(env)


def test_faust_app_accepts_the_settings() -> None:
    app = faust.App(
        "runwatch-test-security", broker="kafka://localhost:9092", **faust_broker_settings(SCRAM)
    )
    creds = app.conf.broker_credentials
    assert isinstance(creds, faust.SASLCredentials)
    assert creds.mechanism.value == "SCRAM-SHA-512"


def test_kafka_client_config_is_unchanged() -> None:
    assert kafka_client_config(SCRAM) == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "runwatch",
        "sasl_plain_password": "s3cret",
    }
    assert kafka_client_config({"RUNWATCH_SASL_MECHANISM": ""}) == {}


def test_faust_is_imported_lazily() -> None:
    code = (
        "import sys; from runwatch.common.settings import faust_broker_settings, kafka_client_config; "
        "faust_broker_settings({}); kafka_client_config({}); "
        "assert 'faust' not in sys.modules, 'faust imported eagerly'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


LAUNCHER = {**SCRAM, "RUNWATCH_SASL_USERNAME": "controller", "RUNWATCH_SASL_PASSWORD": "ctl"}


def test_ranks_log_in_as_the_trainer_when_the_launcher_has_its_credential() -> None:
    from runwatch.common.settings import ranks_environ, ranks_share_the_launchers_login

    env = {**LAUNCHER, "RUNWATCH_TRAINER_SASL_USERNAME": "trainer"}
    env["RUNWATCH_TRAINER_SASL_PASSWORD"] = "trn"
    ranks = ranks_environ(env)
    assert kafka_client_config(ranks)["sasl_plain_username"] == "trainer"
    assert ranks["RUNWATCH_SASL_PASSWORD"] == "trn"
    assert "ctl" not in ranks.values()  # the controller's password never reaches user code
    assert not any(k.startswith("RUNWATCH_TRAINER_") for k in ranks)
    assert not ranks_share_the_launchers_login(env)


@pytest.mark.parametrize(
    "extra",
    [{}, {"RUNWATCH_TRAINER_SASL_USERNAME": "trainer"}],
    ids=["no-trainer-credential", "half-a-credential"],
)
def test_without_a_trainer_credential_ranks_share_the_launchers(extra: dict[str, str]) -> None:
    from runwatch.common.settings import ranks_environ, ranks_share_the_launchers_login

    env = {**LAUNCHER, **extra}
    ranks = ranks_environ(env)
    assert kafka_client_config(ranks) == kafka_client_config(LAUNCHER)
    assert ranks_share_the_launchers_login(env)
    assert not ranks_share_the_launchers_login({})  # no SASL at all: nothing shared


def test_the_controller_gives_its_ranks_the_trainer_login() -> None:
    from runwatch.controller.gang import node_environ

    env = {**LAUNCHER, "RUNWATCH_COMMAND_KEY": "k" * 32}
    env |= {"RUNWATCH_TRAINER_SASL_USERNAME": "trainer", "RUNWATCH_TRAINER_SASL_PASSWORD": "trn"}
    ranks = node_environ(env, {"EXTRA": "1"})
    assert ranks["RUNWATCH_SASL_USERNAME"] == "trainer" and ranks["EXTRA"] == "1"
    assert "RUNWATCH_COMMAND_KEY" not in ranks and "ctl" not in ranks.values()


def test_the_password_can_come_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("from-a-file\n")
    env = {k: v for k, v in SCRAM.items() if k != "RUNWATCH_SASL_PASSWORD"}
    env["RUNWATCH_SASL_PASSWORD_FILE"] = str(secret)
    assert kafka_client_config(env)["sasl_plain_password"] == "from-a-file"
    assert faust_broker_settings(env)["broker_credentials"].password == "from-a-file"
    assert (
        kafka_client_config({**env, "RUNWATCH_SASL_PASSWORD": "wins"})["sasl_plain_password"]
        == "wins"
    )


@pytest.mark.parametrize("content", [None, "  \n"], ids=["missing", "empty"])
def test_an_unusable_password_file_is_a_clear_error(tmp_path: Path, content: str | None) -> None:
    from runwatch.common.errors import UsageError

    secret = tmp_path / "password"
    if content is not None:
        secret.write_text(content)
    env = {"RUNWATCH_SASL_PASSWORD_FILE": str(secret)}
    with pytest.raises(UsageError, match="RUNWATCH_SASL_PASSWORD_FILE"):
        kafka_client_config(env)


def test_a_trainer_password_file_reaches_the_ranks_as_theirs(tmp_path: Path) -> None:
    from runwatch.common.settings import ranks_environ

    env = {**LAUNCHER, "RUNWATCH_SASL_PASSWORD_FILE": "/run/secrets/controller"}
    env |= {"RUNWATCH_TRAINER_SASL_USERNAME": "trainer"}
    env |= {"RUNWATCH_TRAINER_SASL_PASSWORD_FILE": "/run/secrets/trainer"}
    ranks = ranks_environ(env)
    assert ranks["RUNWATCH_SASL_USERNAME"] == "trainer"
    assert ranks["RUNWATCH_SASL_PASSWORD_FILE"] == "/run/secrets/trainer"
    assert "RUNWATCH_SASL_PASSWORD" not in ranks  # the launcher's own is not passed on
