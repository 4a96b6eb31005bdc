"""Where runwatch finds Kafka and keeps its files, from arguments or the environment.

Every Kafka client runwatch creates takes its connection settings from `kafka_client_config`,
so security settings given once (environment or arguments) reach producers, consumers,
admin clients and the faust app alike.

This module imports nothing of runwatch but `common.errors`: the settings that need more
(the bootstrap address, which may ask the embedded broker; partition counts, parsed by the
topic catalogue) are resolved by the command line, in `runwatch.resolve`.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runwatch.common.errors import UsageError

ENV_BOOTSTRAP = "RUNWATCH_BOOTSTRAP"
ENV_HOME = "RUNWATCH_HOME"
ENV_TOPIC_PREFIX = "RUNWATCH_TOPIC_PREFIX"
ENV_REPLICATION_FACTOR = "RUNWATCH_REPLICATION_FACTOR"
ENV_PARTITIONS = "RUNWATCH_PARTITIONS"

ENV_SECURITY_PROTOCOL = "RUNWATCH_SECURITY_PROTOCOL"
ENV_SASL_MECHANISM = "RUNWATCH_SASL_MECHANISM"
ENV_SASL_USERNAME = "RUNWATCH_SASL_USERNAME"
ENV_SASL_PASSWORD = "RUNWATCH_SASL_PASSWORD"
ENV_SASL_PASSWORD_FILE = "RUNWATCH_SASL_PASSWORD_FILE"
ENV_TRAINER_SASL_USERNAME = "RUNWATCH_TRAINER_SASL_USERNAME"
ENV_TRAINER_SASL_PASSWORD = "RUNWATCH_TRAINER_SASL_PASSWORD"
ENV_TRAINER_SASL_PASSWORD_FILE = "RUNWATCH_TRAINER_SASL_PASSWORD_FILE"

# Client security settings read from the environment; names follow kafka-python's arguments.
_SECURITY_ENV: dict[str, str] = {
    ENV_SECURITY_PROTOCOL: "security_protocol",
    ENV_SASL_MECHANISM: "sasl_mechanism",
    ENV_SASL_USERNAME: "sasl_plain_username",
    ENV_SASL_PASSWORD: "sasl_plain_password",
    "RUNWATCH_SSL_CAFILE": "ssl_cafile",
    "RUNWATCH_SSL_CERTFILE": "ssl_certfile",
    "RUNWATCH_SSL_KEYFILE": "ssl_keyfile",
}

# A launcher's variables for its ranks' login -> the ranks' own variables.
_TRAINER_LOGIN: dict[str, str] = {
    ENV_TRAINER_SASL_USERNAME: ENV_SASL_USERNAME,
    ENV_TRAINER_SASL_PASSWORD: ENV_SASL_PASSWORD,
    ENV_TRAINER_SASL_PASSWORD_FILE: ENV_SASL_PASSWORD_FILE,
}

SECURITY_PROTOCOLS: tuple[str, ...] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
"""Values `RUNWATCH_SECURITY_PROTOCOL` may take (Kafka's `security.protocol`)."""

SASL_MECHANISMS: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
"""Values `RUNWATCH_SASL_MECHANISM` may take: the username/password mechanisms."""


def runwatch_home() -> Path:
    """The directory for runwatch's local state (broker data, pid files, caches).

    `RUNWATCH_HOME` if set, else `~/.runwatch`.
    """
    return Path(os.environ.get(ENV_HOME) or Path.home() / ".runwatch")


def topic_prefix(explicit: str | None = None) -> str:
    """The prefix of every topic name (`runwatch` unless configured)."""
    return explicit or os.environ.get(ENV_TOPIC_PREFIX) or "runwatch"


def replication_factor(explicit: int | None = None) -> int | None:
    """The replication factor asked for, or None to choose it from the cluster's size.

    Order: the explicit argument (``--replication-factor``), `RUNWATCH_REPLICATION_FACTOR`.

    Raises:
        UsageError: when it is not a positive integer.
    """
    raw: object = explicit if explicit is not None else os.environ.get(ENV_REPLICATION_FACTOR)
    if raw is None or raw == "":
        return None
    try:
        factor = int(str(raw))
    except ValueError:
        factor = 0
    if factor < 1:
        raise UsageError(f"the replication factor must be a positive integer, not {raw!r}")
    return factor


def kafka_client_config(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Security settings for kafka-python clients, read from `RUNWATCH_*` variables.

    The password is `RUNWATCH_SASL_PASSWORD`, or else the content of the file
    `RUNWATCH_SASL_PASSWORD_FILE` names (surrounding whitespace stripped).

    Raises:
        UsageError: `RUNWATCH_SASL_PASSWORD_FILE` cannot be read or is empty.
    """
    return {_SECURITY_ENV[var]: value for var, value in _security_env(environ).items()}


def _read_password(path: str) -> str:
    try:
        password = Path(path).read_text().strip()
    except OSError as exc:
        raise UsageError(f"{ENV_SASL_PASSWORD_FILE}={path}: cannot read it: {exc}") from None
    if not password:
        raise UsageError(f"{ENV_SASL_PASSWORD_FILE}={path} is empty")
    return password


def ranks_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """A launcher's environment as its ranks get it: the trainer's Kafka login, not its own.

    ``runwatch launch`` logs in as the controller (`RUNWATCH_SASL_USERNAME`); its ranks run
    user code and should log in as a trainer. With `RUNWATCH_TRAINER_SASL_USERNAME` and
    `RUNWATCH_TRAINER_SASL_PASSWORD` (or `..._PASSWORD_FILE`) set, a rank gets them as its
    `RUNWATCH_SASL_USERNAME` and `RUNWATCH_SASL_PASSWORD` (``_FILE``), and the launcher's
    own login variables are not passed on. Without them the ranks inherit the launcher's
    login (one credential for both). The ranks run as the launcher's OS user, so this keeps
    honest code to the trainer's rights; it is no wall against code that reads the
    launcher's process (docs/security.md).

    Args:
        environ: The launcher's environment.

    Returns:
        A new mapping; the ``RUNWATCH_TRAINER_SASL_*`` variables are not in it.
    """
    env = {k: v for k, v in environ.items() if k not in _TRAINER_LOGIN}
    if _has_trainer_login(environ):
        for own in _TRAINER_LOGIN.values():
            env.pop(own, None)
        env.update({ours: environ[var] for var, ours in _TRAINER_LOGIN.items() if environ.get(var)})
    return env


def _has_trainer_login(environ: Mapping[str, str]) -> bool:
    return bool(environ.get(ENV_TRAINER_SASL_USERNAME)) and bool(
        environ.get(ENV_TRAINER_SASL_PASSWORD) or environ.get(ENV_TRAINER_SASL_PASSWORD_FILE)
    )


def ranks_share_the_launchers_login(environ: Mapping[str, str]) -> bool:
    """True when a launcher logs in with SASL and its ranks would get the same login."""
    return bool(environ.get(ENV_SASL_USERNAME)) and not _has_trainer_login(environ)


def _security_env(environ: Mapping[str, str] | None) -> dict[str, str]:
    """The non-empty `RUNWATCH_*` security variables, by variable name.

    The password is read from `RUNWATCH_SASL_PASSWORD_FILE` when only that is set.
    """
    env = os.environ if environ is None else environ
    found = {var: env[var] for var in _SECURITY_ENV if env.get(var)}
    path = env.get(ENV_SASL_PASSWORD_FILE)
    if path and ENV_SASL_PASSWORD not in found:
        found[ENV_SASL_PASSWORD] = _read_password(path)
    return found


def validate_sasl_mechanism(mechanism: str) -> str:
    """Check a SASL mechanism name and return it in Kafka's spelling (upper case).

    Args:
        mechanism: The value of `RUNWATCH_SASL_MECHANISM`, e.g. ``SCRAM-SHA-512``.

    Returns:
        The mechanism, upper-cased and stripped.

    Raises:
        ValueError: It is not one of `SASL_MECHANISMS`.
    """
    name = mechanism.strip().upper()
    if name not in SASL_MECHANISMS:
        raise ValueError(
            f"RUNWATCH_SASL_MECHANISM={mechanism!r} is not supported; "
            f"use one of {', '.join(SASL_MECHANISMS)}"
        )
    return name


def _ssl_context(found: Mapping[str, str]) -> ssl.SSLContext:
    """A client TLS context verifying the broker, from the `RUNWATCH_SSL_*` files."""
    cafile = found.get("RUNWATCH_SSL_CAFILE")
    certfile = found.get("RUNWATCH_SSL_CERTFILE")
    keyfile = found.get("RUNWATCH_SSL_KEYFILE")
    if keyfile and not certfile:
        raise ValueError("RUNWATCH_SSL_KEYFILE is set without RUNWATCH_SSL_CERTFILE")
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load RUNWATCH_SSL_CAFILE={cafile}: {exc}") from None
    if certfile:
        try:
            context.load_cert_chain(certfile, keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"cannot load RUNWATCH_SSL_CERTFILE={certfile} "
                f"(RUNWATCH_SSL_KEYFILE={keyfile}): {exc}"
            ) from None
    return context


def faust_broker_settings(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Security settings for a faust App, from the same variables as `kafka_client_config`.

    Pass the result as keyword arguments: ``faust.App(id, broker=..., **faust_broker_settings())``.
    Without security variables (or with ``RUNWATCH_SECURITY_PROTOCOL=PLAINTEXT``) it returns
    ``{}``, leaving faust's plaintext default. Otherwise it returns ``broker_credentials``:

    * ``SSL``: ``faust.SSLCredentials(context)``;
    * ``SASL_PLAINTEXT``: ``faust.SASLCredentials(username, password, mechanism)``;
    * ``SASL_SSL``: the same with ``ssl_context`` (which makes faust speak SASL_SSL).

    The TLS context verifies the broker's certificate and host name against
    ``RUNWATCH_SSL_CAFILE`` (the system CAs when unset) and presents
    ``RUNWATCH_SSL_CERTFILE`` / ``RUNWATCH_SSL_KEYFILE`` when set (mutual TLS). faust is
    imported only here, so producers and other light clients do not pay for it.

    Args:
        environ: The environment to read; `os.environ` when None.

    Returns:
        Keyword settings for `faust.App`.

    Raises:
        ValueError: An unknown protocol or SASL mechanism, SASL without a mechanism,
            username or password, SASL or TLS variables set while the protocol would ignore
            them, or certificate files that cannot be loaded.
    """
    found = _security_env(environ)
    protocol = found.get("RUNWATCH_SECURITY_PROTOCOL", "PLAINTEXT").strip().upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise ValueError(
            f"RUNWATCH_SECURITY_PROTOCOL={found['RUNWATCH_SECURITY_PROTOCOL']!r} is not "
            f"supported; use one of {', '.join(SECURITY_PROTOCOLS)}"
        )
    sasl = protocol.startswith("SASL_")
    tls = protocol.endswith("SSL")
    ignored = [
        var
        for var in found
        if (var.startswith("RUNWATCH_SASL_") and not sasl)
        or (var.startswith("RUNWATCH_SSL_") and not tls)
    ]
    if ignored:
        raise ValueError(
            f"{', '.join(ignored)} set but RUNWATCH_SECURITY_PROTOCOL is {protocol}, "
            "which does not use them; set RUNWATCH_SECURITY_PROTOCOL to "
            f"{'SASL_SSL or SASL_PLAINTEXT' if not sasl else 'SSL or SASL_SSL'}"
        )
    if protocol == "PLAINTEXT":
        return {}

    import faust

    context = _ssl_context(found) if tls else None
    if not sasl:
        return {"broker_credentials": faust.SSLCredentials(context)}
    if "RUNWATCH_SASL_MECHANISM" not in found:
        raise ValueError(
            f"RUNWATCH_SECURITY_PROTOCOL={protocol} needs RUNWATCH_SASL_MECHANISM "
            f"({', '.join(SASL_MECHANISMS)})"
        )
    mechanism = validate_sasl_mechanism(found["RUNWATCH_SASL_MECHANISM"])
    missing = [
        var for var in ("RUNWATCH_SASL_USERNAME", "RUNWATCH_SASL_PASSWORD") if var not in found
    ]
    if missing:
        raise ValueError(f"SASL {mechanism} needs {' and '.join(missing)}")
    credentials = faust.SASLCredentials(
        username=found["RUNWATCH_SASL_USERNAME"],
        password=found["RUNWATCH_SASL_PASSWORD"],
        mechanism=mechanism,
        ssl_context=context,
    )
    return {"broker_credentials": credentials}
