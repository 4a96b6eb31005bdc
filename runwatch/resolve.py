"""Settings only the command line resolves: the bootstrap address and partition counts.

They live here, above `common.settings`, because resolving them needs more than the base
package may import: the bootstrap falls back on the embedded broker (`runwatch.broker`) and
is checked to answer (`runwatch.reachability`), and partition counts are parsed by the
topic catalogue (`schemas.topics`).
"""

from __future__ import annotations

from runwatch.common.errors import UsageError
from runwatch.common.settings import ENV_PARTITIONS, CommonSettings, KafkaAuth
from runwatch.schemas.topics import parse_partitions


def partition_counts(explicit: str | None = None) -> dict[str, int] | None:
    """Partition counts of new topics by short name, or None for the catalogue's defaults.

    Order: the explicit argument (``--partitions``), `RUNWATCH_PARTITIONS`. The syntax is
    `schemas.topics.parse_partitions`'s: ``8``, ``heartbeats=64,steps=32``, ``8,heartbeats=64``.

    Raises:
        UsageError: when it does not parse.
    """
    raw = explicit if explicit is not None else CommonSettings.from_env().partitions
    if raw is None or raw.strip() == "":
        return None
    try:
        return parse_partitions(raw)
    except ValueError as exc:
        source = "--partitions" if explicit is not None else ENV_PARTITIONS
        raise UsageError(f"{source}: {exc}") from None


def resolve_bootstrap(explicit: str | None = None, *, check: bool = True) -> str:
    """The Kafka bootstrap address to use, checked to answer (within seconds) by default.

    Order: the explicit argument, `RUNWATCH_BOOTSTRAP`, then the embedded broker started by
    `runwatch broker start` if it is running. Every command that talks to Kafka calls this
    once its arguments are valid, so the check (`runwatch.reachability.check_reachable`)
    reports a broker that is down before any client starts retrying.

    Args:
        explicit: ``--bootstrap``, if given.
        check: Check that a broker answers there.

    Raises:
        UsageError: when none of them gives an address, or it is malformed.
        BrokerUnreachable: ``check`` and no broker answers at the address.
    """
    address = _find_bootstrap(explicit)
    if check:
        from runwatch.reachability import check_reachable

        check_reachable(address)
    return address


def _find_bootstrap(explicit: str | None) -> str:
    if explicit:
        return explicit
    env = CommonSettings.from_env().bootstrap
    if env:
        return env
    from runwatch.broker import running_bootstrap, running_secure

    address = running_bootstrap()
    if address:
        if running_secure() and not KafkaAuth.from_env().sasl_username:
            raise UsageError(
                f"the embedded broker at {address} is secure: connect as a role, e.g. "
                '`eval "$(runwatch broker env processors)"` (docs/security.md)'
            )
        return address
    raise UsageError(
        "no Kafka broker: pass --bootstrap HOST:PORT, set RUNWATCH_BOOTSTRAP, "
        "or start the embedded one with `runwatch broker start`"
    )
