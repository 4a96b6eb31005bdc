"""Signed AgentReady: the rules of `controller.peer_auth.check_ready`, table-tested."""

from __future__ import annotations

import msgspec
import pytest

from runwatch.controller.peer_auth import check_ready, is_host_name, sign_ready
from runwatch.schemas.codec import decode, encode
from runwatch.schemas.events import AgentReady, RestartRequested
from runwatch.schemas.signing import CommandKey, sign, verify

KEY = CommandKey.from_secret(b"the-right-key-0123456789")
OTHER = CommandKey.from_secret(b"some-other-key-0123456789")
KEYS = {KEY.key_id: KEY}


def ready(host: str = "gpu07", node_rank: int = 1) -> AgentReady:
    return AgentReady(
        run_id="r",
        ts_ns=1,
        command_id="c1",
        incarnation=1,
        node_rank=node_rank,
        nnodes=2,
        host=host,
    )


CASES = [
    # (name, announcement, keys, reason fragment; "" accepts)
    ("signed", sign_ready(ready(), KEY), KEYS, ""),
    ("signed, no host", sign_ready(ready(host=""), KEY), KEYS, ""),
    ("signed, IPv4", sign_ready(ready(host="10.1.2.3"), KEY), KEYS, ""),
    ("signed, IPv6", sign_ready(ready(host="fe80::1"), KEY), KEYS, ""),
    ("no key here", sign_ready(ready(), KEY), {}, "no command key"),
    ("unsigned", ready(host="attacker.example"), KEYS, "unsigned"),
    ("unknown key", sign_ready(ready(), OTHER), KEYS, "unknown key id"),
    (
        "host altered after signing",
        msgspec.structs.replace(sign_ready(ready(), KEY), host="attacker.example"),
        KEYS,
        "bad signature",
    ),
    (
        "node altered after signing",
        msgspec.structs.replace(sign_ready(ready(), KEY), node_rank=0),
        KEYS,
        "bad signature",
    ),
    (
        "non-ASCII signature",
        msgspec.structs.replace(sign_ready(ready(), KEY), signature="é" * 64),
        KEYS,
        "bad signature",
    ),
    ("signed, not a host", sign_ready(ready(host="a b;rm"), KEY), KEYS, "not a host name"),
]


@pytest.mark.parametrize(
    ("announcement", "keys", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_check_ready(announcement: AgentReady, keys: dict, reason: str) -> None:
    got = check_ready(announcement, keys)
    assert (got == "") == (reason == "")
    assert reason in got


def test_the_signature_survives_the_wire() -> None:
    signed = sign_ready(ready(), KEY)
    assert check_ready(decode(encode(signed)), KEYS) == ""  # type: ignore[arg-type]


def test_an_announcement_signature_is_no_command_signature() -> None:
    # The same key signs both, through different derived keys: neither verifies as the other.
    command = sign(
        RestartRequested(
            run_id="r",
            ts_ns=1,
            command_id="c1",
            action="respawn",
            cause_verdict_id="v",
            cause_kind="dead_rank",
        ),
        KEY,
    )
    signed = sign_ready(ready(), KEY)
    assert signed.signature != command.signature
    as_command = msgspec.structs.replace(
        command, signature=sign_ready(ready(), KEY).signature, key_id=KEY.key_id
    )
    with pytest.raises(Exception, match="bad signature"):
        verify(as_command, KEYS)


@pytest.mark.parametrize("host", ["gpu07", "n0.cluster.local", "10.0.0.1", "::1", "a-b"])
def test_host_names(host: str) -> None:
    assert is_host_name(host)


@pytest.mark.parametrize("host", ["", "-a", "a b", "a/b", "x" * 254, "a..b", "$(id)"])
def test_not_host_names(host: str) -> None:
    assert not is_host_name(host)
