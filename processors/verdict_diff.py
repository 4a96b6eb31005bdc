"""Compare recorded verdicts with recomputed ones: the heart of an audit receipt.

Pure. Verdicts are matched by id. Recorded duplicates that are byte-identical are
expected (publishing is at-least-once) and counted; two different recorded verdicts with
one id are a conflict and fail the audit. Commands are compared without their signature,
which the live policy adds and a replay cannot (it holds no key).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import msgspec

from runwatch.schemas.codec import encode
from runwatch.schemas.events import AnomalyDetected, Event, RestartRequested

E = TypeVar("E", bound=Event)


class Difference(msgspec.Struct, frozen=True, kw_only=True):
    """One verdict id whose recorded and recomputed versions differ."""

    verdict_id: str
    recorded: bytes
    recomputed: bytes


class Comparison(msgspec.Struct, frozen=True, kw_only=True):
    """How one kind of verdict (anomalies or commands) compares.

    Attributes:
        matched: Ids present and identical on both sides.
        missing: Recomputed but never recorded (the live pipeline lost or skipped one).
        unexpected: Recorded but not recomputed (the live pipeline saw something else).
        differing: Same id, different content.
        conflicts: Ids recorded more than once with different content.
        duplicates: Identical extra copies in the record (harmless, at-least-once).
    """

    matched: tuple[str, ...] = ()
    missing: tuple[bytes, ...] = ()
    unexpected: tuple[bytes, ...] = ()
    differing: tuple[Difference, ...] = ()
    conflicts: tuple[str, ...] = ()
    duplicates: int = 0

    @property
    def agrees(self) -> bool:
        """True when nothing is missing, unexpected, differing or conflicting."""
        return not (self.missing or self.unexpected or self.differing or self.conflicts)


def _canonical_command(command: RestartRequested) -> bytes:
    return encode(msgspec.structs.replace(command, signature="", key_id=""))


def compare(
    recorded: Sequence[E],
    recomputed: Sequence[E],
    *,
    ident: Callable[[E], str],
    canonical: Callable[[E], bytes] = encode,
) -> Comparison:
    """Compare two verdict lists by id.

    Args:
        recorded: Verdicts as read from the log (may hold duplicates).
        recomputed: Verdicts from replaying the input log.
        ident: The id of a verdict.
        canonical: The bytes compared for equality.

    Returns:
        The comparison, each list in first-seen order.
    """
    seen: dict[str, bytes] = {}
    conflicts: list[str] = []
    duplicates = 0
    for event in recorded:
        key, data = ident(event), canonical(event)
        if key not in seen:
            seen[key] = data
        elif seen[key] == data:
            duplicates += 1
        elif key not in conflicts:
            conflicts.append(key)
    expected: dict[str, bytes] = {}
    for event in recomputed:
        expected.setdefault(ident(event), canonical(event))
    matched = [k for k, v in expected.items() if seen.get(k) == v]
    missing = [v for k, v in expected.items() if k not in seen]
    unexpected = [v for k, v in seen.items() if k not in expected]
    differing = [
        Difference(verdict_id=k, recorded=seen[k], recomputed=v)
        for k, v in expected.items()
        if k in seen and seen[k] != v
    ]
    return Comparison(
        matched=tuple(matched),
        missing=tuple(missing),
        unexpected=tuple(unexpected),
        differing=tuple(differing),
        conflicts=tuple(conflicts),
        duplicates=duplicates,
    )


def compare_anomalies(
    recorded: Sequence[AnomalyDetected], recomputed: Sequence[AnomalyDetected]
) -> Comparison:
    """Compare anomalies by verdict id, byte for byte."""
    return compare(recorded, recomputed, ident=lambda a: a.verdict_id)


def compare_commands(
    recorded: Sequence[RestartRequested], recomputed: Sequence[RestartRequested]
) -> Comparison:
    """Compare restart commands by command id, ignoring the signature."""
    return compare(recorded, recomputed, ident=lambda c: c.command_id, canonical=_canonical_command)
