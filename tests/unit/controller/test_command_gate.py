"""The command gate, table-tested: execute, reject (with the reason) or ignore."""

from __future__ import annotations

import msgspec
import pytest

from runwatch.controller.command_gate import NO_KEY, REPLAYED, SHADOW, OwnedGang, decide
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
