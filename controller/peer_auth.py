"""Which agent announcements another agent may believe: signed AgentReady. Pure.

An `schemas.events.AgentReady` decides who is in the next incarnation, and when node 0 is
dropped its ``host`` becomes the next ``MASTER_ADDR``: every rank of the gang connects
there. A forged one (anyone who can write the controller topic: every client on a broker
without an authorizer) could send the gang's rendezvous to a host of its choosing, or
keep a lost node "alive". Kafka does not tell a consumer which principal wrote a record,
so the agents prove it themselves: each signs its announcement with a key derived from the
command key (``RUNWATCH_COMMAND_KEY``), which every agent needs to verify commands and
which is removed from every rank's environment. A trainer credential, or a rank's code,
cannot sign one.

The derived key (HMAC of the command key with `DOMAIN`) keeps the two uses apart: an
announcement's signature is never a valid command signature, nor the reverse.

The rules for an announcement read from the controller topic (`check_ready`), in order:

1. This agent has no key: **refuse** ("no command key to check it with").
2. Unsigned: **refuse** (a forgery, or an agent older than signed announcements).
3. Signed with a key id this agent does not know: **refuse**.
4. The signature does not match: **refuse** (forged or altered).
5. ``host`` is not a host name or an IP address (`is_host_name`): **refuse**.
6. Otherwise: **accept**.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping

import msgspec

from runwatch.schemas.codec import encode
from runwatch.schemas.events import AgentReady
from runwatch.schemas.signing import CommandKey

DOMAIN = b"runwatch agent_ready.v1"
"""What the announcement key is derived for."""

_HOST = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_IPV6 = re.compile(r"^[0-9A-Fa-f:.]{2,45}$")


def is_host_name(host: str) -> bool:
    """True for an RFC 1123 host name, an IPv4 address or an IPv6 address (no brackets)."""
    return bool(_HOST.match(host)) or (":" in host and bool(_IPV6.match(host)))


def _mac(ready: AgentReady, key: CommandKey) -> str:
    derived = hmac.new(key.secret, DOMAIN, hashlib.sha256).digest()
    body = encode(msgspec.structs.replace(ready, signature="", key_id=key.key_id))
    return hmac.new(derived, body, hashlib.sha256).hexdigest()


def sign_ready(ready: AgentReady, key: CommandKey) -> AgentReady:
    """``ready`` signed with the announcement key derived from ``key``."""
    return msgspec.structs.replace(ready, signature=_mac(ready, key), key_id=key.key_id)


def check_ready(ready: AgentReady, keys: Mapping[str, CommandKey]) -> str:
    """Why ``ready`` may not be believed, or ``""`` when it may (the module's rules).

    Args:
        ready: An announcement as read from the controller topic.
        keys: This agent's command keys by id.

    Returns:
        The reason for refusing it, one line; empty to accept it.
    """
    if not keys:  # rule 1
        return "no command key to check it with"
    if not ready.signature:  # rule 2
        return "unsigned"
    key = keys.get(ready.key_id)
    if key is None:  # rule 3
        return f"signed with unknown key id {ready.key_id!r}"
    if not ready.signature.isascii() or not hmac.compare_digest(
        _mac(ready, key), ready.signature
    ):  # rule 4
        return "bad signature: forged or altered"
    if ready.host and not is_host_name(ready.host):  # rule 5
        return f"host {ready.host[:80]!r} is not a host name"
    return ""


__all__ = ["DOMAIN", "check_ready", "is_host_name", "sign_ready"]
