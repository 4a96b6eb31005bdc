"""Where runwatch finds Kafka and keeps its files, from arguments or the environment.

Every Kafka client runwatch creates takes its connection settings from `kafka_client_config`,
so security settings given once (environment or arguments) reach producers, consumers,
admin clients and the faust app alike.
"""

from __future__ import annotations

import os
from pathlib import Path

from runwatch.errors import UsageError

ENV_BOOTSTRAP = "RUNWATCH_BOOTSTRAP"
ENV_HOME = "RUNWATCH_HOME"
ENV_TOPIC_PREFIX = "RUNWATCH_TOPIC_PREFIX"

# Client security settings read from the environment; names follow kafka-python's arguments.
_SECURITY_ENV: dict[str, str] = {
    "RUNWATCH_SECURITY_PROTOCOL": "security_protocol",
    "RUNWATCH_SASL_MECHANISM": "sasl_mechanism",
    "RUNWATCH_SASL_USERNAME": "sasl_plain_username",
    "RUNWATCH_SASL_PASSWORD": "sasl_plain_password",
    "RUNWATCH_SSL_CAFILE": "ssl_cafile",
    "RUNWATCH_SSL_CERTFILE": "ssl_certfile",
    "RUNWATCH_SSL_KEYFILE": "ssl_keyfile",
}


def runwatch_home() -> Path:
    """The directory for runwatch's local state (broker data, pid files, caches).

    `RUNWATCH_HOME` if set, else `~/.runwatch`.
    """
    return Path(os.environ.get(ENV_HOME) or Path.home() / ".runwatch")


def topic_prefix(explicit: str | None = None) -> str:
    """The prefix of every topic name (`runwatch` unless configured)."""
    return explicit or os.environ.get(ENV_TOPIC_PREFIX) or "runwatch"


def resolve_bootstrap(explicit: str | None = None) -> str:
    """The Kafka bootstrap address to use.

    Order: the explicit argument, `RUNWATCH_BOOTSTRAP`, then the embedded broker started by
    `runwatch broker start` if it is running.

    Raises:
        UsageError: when none of them gives an address.
    """
    if explicit:
        return explicit
    env = os.environ.get(ENV_BOOTSTRAP)
    if env:
        return env
    from runwatch.broker import running_bootstrap

    address = running_bootstrap()
    if address:
        return address
    raise UsageError(
        "no Kafka broker: pass --bootstrap HOST:PORT, set RUNWATCH_BOOTSTRAP, "
        "or start the embedded one with `runwatch broker start`"
    )


def kafka_client_config(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Security settings for kafka-python clients, read from `RUNWATCH_*` variables."""
    env = os.environ if environ is None else environ
    return {arg: env[var] for var, arg in _SECURITY_ENV.items() if env.get(var)}
