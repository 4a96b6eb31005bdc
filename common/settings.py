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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from runwatch.common.errors import UsageError

_T = TypeVar("_T")

ENV_BOOTSTRAP = "RUNWATCH_BOOTSTRAP"
ENV_HOME = "RUNWATCH_HOME"
ENV_TOPIC_PREFIX = "RUNWATCH_TOPIC_PREFIX"
ENV_REPLICATION_FACTOR = "RUNWATCH_REPLICATION_FACTOR"
ENV_PARTITIONS = "RUNWATCH_PARTITIONS"
ENV_CONNECT_TIMEOUT = "RUNWATCH_CONNECT_TIMEOUT_S"
ENV_COMMAND_KEY = "RUNWATCH_COMMAND_KEY"
ENV_PURE_PYTHON = "RUNWATCH_PURE_PYTHON"
ENV_COMMAND_KEY_FILE = "RUNWATCH_COMMAND_KEY_FILE"

ENV_SECURITY_PROTOCOL = "RUNWATCH_SECURITY_PROTOCOL"
ENV_SASL_MECHANISM = "RUNWATCH_SASL_MECHANISM"
ENV_SASL_USERNAME = "RUNWATCH_SASL_USERNAME"
ENV_SASL_PASSWORD = "RUNWATCH_SASL_PASSWORD"
ENV_SASL_PASSWORD_FILE = "RUNWATCH_SASL_PASSWORD_FILE"
ENV_TRAINER_SASL_USERNAME = "RUNWATCH_TRAINER_SASL_USERNAME"
ENV_TRAINER_SASL_PASSWORD = "RUNWATCH_TRAINER_SASL_PASSWORD"
ENV_TRAINER_SASL_PASSWORD_FILE = "RUNWATCH_TRAINER_SASL_PASSWORD_FILE"
ENV_SSL_CAFILE = "RUNWATCH_SSL_CAFILE"
ENV_SSL_CERTFILE = "RUNWATCH_SSL_CERTFILE"
ENV_SSL_KEYFILE = "RUNWATCH_SSL_KEYFILE"

# Client security settings read from the environment; names follow kafka-python's arguments.
_SECURITY_ENV: dict[str, str] = {
    ENV_SECURITY_PROTOCOL: "security_protocol",
    ENV_SASL_MECHANISM: "sasl_mechanism",
    ENV_SASL_USERNAME: "sasl_plain_username",
    ENV_SASL_PASSWORD: "sasl_plain_password",
    ENV_SSL_CAFILE: "ssl_cafile",
    ENV_SSL_CERTFILE: "ssl_certfile",
    ENV_SSL_KEYFILE: "ssl_keyfile",
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


DEFAULT_TOPIC_PREFIX = "runwatch"
DEFAULT_CONNECT_TIMEOUT_S = 5.0


def env_value(
    environ: Mapping[str, str], name: str, parse: Callable[[str], _T], meaning: str
) -> _T | None:
    """The variable ``name`` parsed, None when unset or blank; a clear error when malformed.

    Every settings object's ``from_env`` reads its typed variables through this, so a bad
    value names the variable and what it should be.

    Args:
        environ: The environment to read.
        name: The variable.
        parse: Turns the stripped text into the value; raises ValueError when it cannot,
            or when the value is out of range.
        meaning: What the value must be, for the message (``a positive integer``).

    Raises:
        UsageError: The variable is set to something ``parse`` refuses.
    """
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return parse(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} must be {meaning}") from None


def positive_int(raw: str) -> int:
    """``raw`` as an integer >= 1; ValueError otherwise."""
    value = int(raw)
    if value < 1:
        raise ValueError(raw)
    return value


def positive_float(raw: str) -> float:
    """``raw`` as a number > 0; ValueError otherwise (nan included)."""
    value = float(raw)
    if not value > 0:
        raise ValueError(raw)
    return value


@dataclass(frozen=True, kw_only=True)
class CommonSettings:
    """What every command and client shares: where Kafka is and where local files go.

    Attributes:
        bootstrap: Kafka bootstrap ``host:port[,host:port]`` (``RUNWATCH_BOOTSTRAP``);
            None: ``--bootstrap``, else the embedded broker (`runwatch.resolve`).
        topic_prefix: Prefix of every topic name (``RUNWATCH_TOPIC_PREFIX``).
        home_dir: Local state: broker data, pid files, caches, controller and processor
            state (``RUNWATCH_HOME``, else ``~/.runwatch``).
        replication_factor: Replicas of the topics runwatch creates
            (``RUNWATCH_REPLICATION_FACTOR``); None: chosen from the cluster's size.
        partitions: Partition counts of new topics, unparsed (``RUNWATCH_PARTITIONS``,
            the syntax of `schemas.topics.parse_partitions`, which `runwatch.resolve`
            applies); None: the catalogue's.
        connect_timeout_s: Seconds a first connection to the broker may take before a
            command reports it unreachable (``RUNWATCH_CONNECT_TIMEOUT_S``).
    """

    bootstrap: str | None = None
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    home_dir: Path = Path("~/.runwatch")
    replication_factor: int | None = None
    partitions: str | None = None
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CommonSettings:
        """Read the variables (`os.environ` when None); unset or blank ones take defaults.

        Raises:
            UsageError: ``RUNWATCH_REPLICATION_FACTOR`` is not a positive integer or
                ``RUNWATCH_CONNECT_TIMEOUT_S`` not a number of seconds > 0.
        """
        env = os.environ if environ is None else environ
        timeout_s = env_value(env, ENV_CONNECT_TIMEOUT, positive_float, "a number of seconds > 0")
        return cls(
            bootstrap=env.get(ENV_BOOTSTRAP) or None,
            topic_prefix=env.get(ENV_TOPIC_PREFIX) or DEFAULT_TOPIC_PREFIX,
            home_dir=Path(env.get(ENV_HOME) or Path.home() / ".runwatch"),
            replication_factor=env_value(
                env, ENV_REPLICATION_FACTOR, positive_int, "a positive integer"
            ),
            partitions=env.get(ENV_PARTITIONS, "").strip() or None,
            connect_timeout_s=DEFAULT_CONNECT_TIMEOUT_S if timeout_s is None else timeout_s,
        )


@dataclass(frozen=True)
class CoreSettings:
    """Which copy of the core's compiled modules runs (`processors.core.native`).

    Attributes:
        pure_python: Run the pure-Python source of every compiled module even when its
            compiled copy is installed (``RUNWATCH_PURE_PYTHON=1``): verdicts are the same
            bit for bit, only slower.
    """

    pure_python: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CoreSettings:
        """Read the variable (`os.environ` when None); only ``1`` sets it, anything else not.

        Never raises: the core reads it on import, where a bad value of another variable
        must not stop the import.
        """
        env = os.environ if environ is None else environ
        return cls(pure_python=env.get(ENV_PURE_PYTHON, "").strip() == "1")


@dataclass(frozen=True, kw_only=True)
class CommandKeySettings:
    """Where the command key comes from (`schemas.signing.load_key` reads the key itself).

    Attributes:
        command_key: The shared secret that signs restart commands
            (``RUNWATCH_COMMAND_KEY``); None: not set.
        command_key_file: A file holding the command key (``RUNWATCH_COMMAND_KEY_FILE``),
            read when ``command_key`` is not set; None: not set.
    """

    command_key: str | None = None
    command_key_file: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CommandKeySettings:
        """Read the variables (`os.environ` when None); empty ones count as unset."""
        env = os.environ if environ is None else environ
        return cls(
            command_key=env.get(ENV_COMMAND_KEY) or None,
            command_key_file=env.get(ENV_COMMAND_KEY_FILE) or None,
        )


@dataclass(frozen=True, kw_only=True)
class KafkaAuth:
    """How Kafka clients authenticate (docs/security.md): the ``RUNWATCH_*`` security variables.

    Attributes:
        security_protocol: Kafka's ``security.protocol`` (``RUNWATCH_SECURITY_PROTOCOL``,
            one of `SECURITY_PROTOCOLS`); None: PLAINTEXT.
        sasl_mechanism: The SASL mechanism (``RUNWATCH_SASL_MECHANISM``, one of
            `SASL_MECHANISMS`).
        sasl_username: The Kafka login (``RUNWATCH_SASL_USERNAME``).
        sasl_password: The login's password (``RUNWATCH_SASL_PASSWORD``).
        sasl_password_file: A file holding the password (``RUNWATCH_SASL_PASSWORD_FILE``),
            read when ``sasl_password`` is not set.
        ssl_cafile: CA bundle verifying the broker (``RUNWATCH_SSL_CAFILE``).
        ssl_certfile: Client certificate for mutual TLS (``RUNWATCH_SSL_CERTFILE``).
        ssl_keyfile: The client certificate's private key (``RUNWATCH_SSL_KEYFILE``).
        trainer_sasl_username: The ranks' login under ``runwatch launch``
            (``RUNWATCH_TRAINER_SASL_USERNAME``; `ranks_environ`).
        trainer_sasl_password: The ranks' password (``RUNWATCH_TRAINER_SASL_PASSWORD``).
        trainer_sasl_password_file: A file holding the ranks' password
            (``RUNWATCH_TRAINER_SASL_PASSWORD_FILE``).
    """

    security_protocol: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    sasl_password_file: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    trainer_sasl_username: str | None = None
    trainer_sasl_password: str | None = None
    trainer_sasl_password_file: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> KafkaAuth:
        """Read the variables (`os.environ` when None); empty ones count as unset.

        Nothing is checked or read from disk here: `faust_broker_settings` checks the
        combination, and the password file is read when a client needs it
        (`variables`), so a command that only asks who logs in does not fail on it.
        """
        env = os.environ if environ is None else environ
        return cls(
            security_protocol=env.get(ENV_SECURITY_PROTOCOL) or None,
            sasl_mechanism=env.get(ENV_SASL_MECHANISM) or None,
            sasl_username=env.get(ENV_SASL_USERNAME) or None,
            sasl_password=env.get(ENV_SASL_PASSWORD) or None,
            sasl_password_file=env.get(ENV_SASL_PASSWORD_FILE) or None,
            ssl_cafile=env.get(ENV_SSL_CAFILE) or None,
            ssl_certfile=env.get(ENV_SSL_CERTFILE) or None,
            ssl_keyfile=env.get(ENV_SSL_KEYFILE) or None,
            trainer_sasl_username=env.get(ENV_TRAINER_SASL_USERNAME) or None,
            trainer_sasl_password=env.get(ENV_TRAINER_SASL_PASSWORD) or None,
            trainer_sasl_password_file=env.get(ENV_TRAINER_SASL_PASSWORD_FILE) or None,
        )

    @property
    def plaintext(self) -> bool:
        """True when clients speak Kafka's protocol in the clear (no TLS) to the broker."""
        protocol = (self.security_protocol or "PLAINTEXT").strip().upper()
        return protocol in ("", "PLAINTEXT", "SASL_PLAINTEXT")

    @property
    def has_trainer_login(self) -> bool:
        """True when the ranks of ``runwatch launch`` get a login of their own."""
        return bool(self.trainer_sasl_username) and bool(
            self.trainer_sasl_password or self.trainer_sasl_password_file
        )

    def variables(self) -> dict[str, str]:
        """The set client security variables, by variable name (`_SECURITY_ENV`'s).

        The password is read from ``sasl_password_file`` when only that is set.

        Raises:
            UsageError: The password file cannot be read or is empty.
        """
        values = {
            ENV_SECURITY_PROTOCOL: self.security_protocol,
            ENV_SASL_MECHANISM: self.sasl_mechanism,
            ENV_SASL_USERNAME: self.sasl_username,
            ENV_SASL_PASSWORD: self.sasl_password,
            ENV_SSL_CAFILE: self.ssl_cafile,
            ENV_SSL_CERTFILE: self.ssl_certfile,
            ENV_SSL_KEYFILE: self.ssl_keyfile,
        }
        found = {var: value for var, value in values.items() if value}
        if self.sasl_password_file and ENV_SASL_PASSWORD not in found:
            found[ENV_SASL_PASSWORD] = _read_password(self.sasl_password_file)
        return found


def runwatch_home() -> Path:
    """The directory for runwatch's local state (broker data, pid files, caches).

    `RUNWATCH_HOME` if set, else `~/.runwatch` (`CommonSettings.home_dir`).
    """
    return CommonSettings.from_env().home_dir


def topic_prefix(explicit: str | None = None) -> str:
    """The prefix of every topic name (`runwatch` unless configured)."""
    return explicit or CommonSettings.from_env().topic_prefix


def replication_factor(explicit: int | None = None) -> int | None:
    """The replication factor asked for, or None to choose it from the cluster's size.

    Order: the explicit argument (``--replication-factor``), `RUNWATCH_REPLICATION_FACTOR`.

    Raises:
        UsageError: when it is not a positive integer.
    """
    if explicit is None:
        return CommonSettings.from_env().replication_factor
    if explicit < 1:
        raise UsageError(f"the replication factor must be a positive integer, not {explicit!r}")
    return explicit


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
    if KafkaAuth.from_env(environ).has_trainer_login:
        for own in _TRAINER_LOGIN.values():
            env.pop(own, None)
        env.update({ours: environ[var] for var, ours in _TRAINER_LOGIN.items() if environ.get(var)})
    return env


def ranks_share_the_launchers_login(environ: Mapping[str, str]) -> bool:
    """True when a launcher logs in with SASL and its ranks would get the same login."""
    auth = KafkaAuth.from_env(environ)
    return bool(auth.sasl_username) and not auth.has_trainer_login


def _security_env(environ: Mapping[str, str] | None) -> dict[str, str]:
    """The non-empty `RUNWATCH_*` security variables, by variable name (`KafkaAuth`)."""
    return KafkaAuth.from_env(environ).variables()


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
    cafile = found.get(ENV_SSL_CAFILE)
    certfile = found.get(ENV_SSL_CERTFILE)
    keyfile = found.get(ENV_SSL_KEYFILE)
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
    protocol = found.get(ENV_SECURITY_PROTOCOL, "PLAINTEXT").strip().upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise ValueError(
            f"{ENV_SECURITY_PROTOCOL}={found[ENV_SECURITY_PROTOCOL]!r} is not "
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
    if ENV_SASL_MECHANISM not in found:
        raise ValueError(
            f"RUNWATCH_SECURITY_PROTOCOL={protocol} needs RUNWATCH_SASL_MECHANISM "
            f"({', '.join(SASL_MECHANISMS)})"
        )
    mechanism = validate_sasl_mechanism(found[ENV_SASL_MECHANISM])
    missing = [var for var in (ENV_SASL_USERNAME, ENV_SASL_PASSWORD) if var not in found]
    if missing:
        raise ValueError(f"SASL {mechanism} needs {' and '.join(missing)}")
    credentials = faust.SASLCredentials(
        username=found[ENV_SASL_USERNAME],
        password=found[ENV_SASL_PASSWORD],
        mechanism=mechanism,
        ssl_context=context,
    )
    return {"broker_credentials": credentials}
