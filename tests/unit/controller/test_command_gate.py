"""The command gate, table-tested: execute, reject (with the reason) or ignore."""

from __future__ import annotations

import msgspec
import pytest

from runwatch.controller.command_gate import (
    NO_KEY,
    OTHER_LAUNCH,
    REPLAYED,
    SHADOW,
    OwnedGang,
    decide,
)
from runwatch.schemas.events import Provenance, RestartRequested
from runwatch.schemas.signing import CommandKey, sign

KEY = CommandKey.from_secret(b"the-right-key-0123456789")
OTHER = CommandKey.from_secret(b"some-other-key-0123456789")
KEYS = {KEY.key_id: KEY}
GANGS = {"run-a": OwnedGang("run-a", incarnation=1, launch_offsets={0: 10})}


def command(run: str = "run-a", incarnation: int = 1, cid: str = "c1") -> RestartRequested:
    return RestartRequested(
        run_id=run,
        ts_ns=1,
        command_id=cid,
        action="respawn",
        cause_verdict_id="v",
        cause_kind="dead_rank",
        incarnation=incarnation,
    )


def at(offset: int, partition: int = 0) -> Provenance:
    return Provenance(topic="p.commands", partition=partition, offset=offset)


CASES = [
    # (name, command, source, keys, processed, verdict, reason fragment)
    ("valid", sign(command(), KEY), at(12), KEYS, set(), "execute", ""),
    ("not my run", sign(command(run="run-b"), KEY), at(12), KEYS, set(), "ignore", "not owned"),
    ("before launch", sign(command(), KEY), at(9), KEYS, set(), "ignore", "before the run"),
    ("at launch offset", sign(command(), KEY), at(10), KEYS, set(), "execute", ""),
    ("other partition", sign(command(), KEY), at(0, partition=1), KEYS, set(), "execute", ""),
    ("no key configured", sign(command(), KEY), at(12), {}, set(), "reject", NO_KEY),
    ("unsigned", command(), at(12), KEYS, set(), "reject", "unsigned"),
    ("unknown key", sign(command(), OTHER), at(12), KEYS, set(), "reject", "unknown key"),
    (
        "altered after signing",
        msgspec.structs.replace(sign(command(), KEY), max_checkpoint_step=3),
        at(12),
        KEYS,
        set(),
        "reject",
        "bad signature",
    ),
    (
        "forged signature",
        msgspec.structs.replace(command(), key_id=KEY.key_id, signature="ab" * 32),
        at(12),
        KEYS,
        set(),
        "reject",
        "bad signature",
    ),
    ("replayed", sign(command(), KEY), at(12), KEYS, {"c1"}, "reject", REPLAYED),
    (
        "replayed and stale",
        sign(command(incarnation=0), KEY),
        at(12),
        KEYS,
        {"c1"},
        "reject",
        REPLAYED,
    ),
    ("forged replay", command(), at(12), KEYS, {"c1"}, "reject", "unsigned"),
    ("stale", sign(command(incarnation=0), KEY), at(12), KEYS, set(), "reject", "stale"),
    (
        "future incarnation",
        sign(command(incarnation=2), KEY),
        at(12),
        KEYS,
        set(),
        "reject",
        "stale",
    ),
    ("unowned without key", command(run="run-b"), at(12), {}, set(), "ignore", "not owned"),
    (
        "shadow, validly signed",
        sign(msgspec.structs.replace(command(), shadow=True), KEY),
        at(12),
        KEYS,
        set(),
        "ignore",
        SHADOW,
    ),
    (
        "shadow, unsigned",
        msgspec.structs.replace(command(), shadow=True),
        at(12),
        {},
        set(),
        "ignore",
        SHADOW,
    ),
]


@pytest.mark.parametrize(
    ("cmd", "source", "keys", "processed", "verdict", "reason"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_gate(cmd, source, keys, processed, verdict, reason):
    decision = decide(cmd, source, gangs=GANGS, keys=keys, processed=processed)
    assert decision.verdict == verdict
    assert reason in decision.reason
    assert (decision.reason == "") == (verdict == "execute")


BOUND = {"run-a": OwnedGang("run-a", incarnation=1, launch_offsets={0: 10}, launch_id="L-b")}


def bound(launch_id: str, incarnation: int = 1) -> RestartRequested:
    return msgspec.structs.replace(command(incarnation=incarnation), launch_id=launch_id)


LAUNCH_CASES = [
    # (name, command, processed, verdict, reason fragment): the gang is launch L-b
    ("this launch", sign(bound("L-b"), KEY), set(), "execute", ""),
    ("another launch", sign(bound("L-a"), KEY), set(), "reject", OTHER_LAUNCH),
    ("no launch id", sign(command(), KEY), set(), "reject", OTHER_LAUNCH),
    ("another launch, executed here", sign(bound("L-a"), KEY), {"c1"}, "reject", OTHER_LAUNCH),
    ("this launch, replayed", sign(bound("L-b"), KEY), {"c1"}, "reject", REPLAYED),
    ("this launch, stale", sign(bound("L-b", incarnation=0), KEY), set(), "reject", "stale"),
    (
        "launch id changed after signing",
        msgspec.structs.replace(sign(bound("L-a"), KEY), launch_id="L-b"),
        set(),
        "reject",
        "bad signature",
    ),
]


@pytest.mark.parametrize(
    ("cmd", "processed", "verdict", "reason"),
    [c[1:] for c in LAUNCH_CASES],
    ids=[c[0] for c in LAUNCH_CASES],
)
def test_gate_binds_commands_to_the_launch(cmd, processed, verdict, reason):
    decision = decide(cmd, at(12), gangs=BOUND, keys=KEYS, processed=processed)
    assert decision.verdict == verdict
    assert reason in decision.reason
    assert (decision.reason == "") == (verdict == "execute")


def test_a_gang_without_a_launch_id_binds_nothing():
    for cmd in (sign(command(), KEY), sign(bound("L-a"), KEY)):
        assert decide(cmd, at(12), gangs=GANGS, keys=KEYS, processed=set()).verdict == "execute"


def test_a_signature_made_before_launch_ids_still_verifies():
    # omit_defaults: an empty launch id is not on the wire, so old signed bytes are unchanged
    from runwatch.schemas.codec import encode

    assert b"launch_id" not in encode(sign(command(), KEY))
