"""The checkpoint catalogue: which checkpoints of a run are committed, and the last failure.

The policy never picks a checkpoint (a command says "the latest committed at or before step
S" and the controller resolves it), so this catalogue serves the controller and the report.
A CheckpointFailed for the step and path of a committed checkpoint withdraws it: the failed
rewrite may have left that directory half overwritten.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import msgspec

from runwatch.processors.core.bounds import check_step
from runwatch.schemas.events import (
    CheckpointCommitted,
    CheckpointFailed,
    Provenance,
    RunEnded,
    RunStarted,
)

MAX_CATALOGUE: Final = 256
"""Committed checkpoints remembered per run (the newest ones)."""


class CheckpointInfo(msgspec.Struct, frozen=True, gc=False):
    """One committed checkpoint, without the per-rank loader states.

    Attributes:
        step: The step whose state it holds.
        path: Its directory.
        ts_ns: When it was committed (log time).
        size_bytes: Bytes written.
        write_s: Seconds the background write took.
        blocked_s: Seconds training was blocked.
    """

    step: int
    path: str
    ts_ns: int
    size_bytes: int = 0
    write_s: float = 0.0
    blocked_s: float = 0.0


class FailureInfo(msgspec.Struct, frozen=True, gc=False):
    """The latest failed checkpoint write.

    Attributes:
        step: The step it was meant to hold.
        path: Where it was being written.
        reason: The error.
        ts_ns: When it failed (log time).
    """

    step: int
    path: str
    reason: str
    ts_ns: int


class CheckpointCatalogue(msgspec.Struct, frozen=True, gc=False):
    """Committed checkpoints of a run by step, and its last failure.

    Attributes:
        run_id: The run.
        last_offset: Offset of the last applied event (-1: none).
        committed: Committed checkpoints, ascending by step (one per step: the newest).
        last_failure: The latest failure, if any.
        failures: Failures seen.
        last_ts_ns: Log time of the newest event applied (retention,
            `processors.core.retention`).
        announced: A RunStarted of the run was applied.
        ended: The latest run marker applied is a RunEnded.
    """

    run_id: str
    last_offset: int = -1
    committed: tuple[CheckpointInfo, ...] = ()
    last_failure: FailureInfo | None = None
    failures: int = 0
    last_ts_ns: int = 0
    announced: bool = False
    ended: bool = False

    def latest(self, max_step: int | None = None) -> CheckpointInfo | None:
        """The committed checkpoint with the highest step at or below ``max_step``."""
        for info in reversed(self.committed):
            if max_step is None or info.step <= max_step:
                return info
        return None

    @property
    def total_blocked_s(self) -> float:
        """Seconds training was blocked by the remembered checkpoints."""
        return sum(c.blocked_s for c in self.committed)


def _commit(
    committed: tuple[CheckpointInfo, ...], info: CheckpointInfo
) -> tuple[CheckpointInfo, ...]:
    kept = [c for c in committed if c.step != info.step]
    kept.append(info)
    kept.sort(key=lambda c: c.step)
    return tuple(kept[-MAX_CATALOGUE:])


CheckpointEvent = CheckpointCommitted | CheckpointFailed | RunStarted | RunEnded
"""Events the catalogue accepts (run markers are accepted and only advance the offset)."""


def fold_checkpoint(
    state: CheckpointCatalogue | None, event: CheckpointEvent, source: Provenance
) -> CheckpointCatalogue:
    """Apply one event of a run's checkpoints topic.

    Args:
        state: The run's catalogue, None for a run not seen yet.
        event: CheckpointCommitted or CheckpointFailed; a RunStarted or RunEnded only
            marks the run announced or ended (for its retention).
        source: The event's log position (skipped if at or below the last one).

    Returns:
        The new catalogue (no verdicts: checkpoints inform, they do not alarm).

    Raises:
        BoundError: A step outside ``[0, 2**53)`` (`processors.core.bounds`).
    """
    if state is None:
        state = CheckpointCatalogue(run_id=event.run_id)
    elif source.offset <= state.last_offset:
        return state
    if isinstance(event, CheckpointCommitted | CheckpointFailed):
        check_step(event.step, -1, "checkpoint step")
    state = _seen(state, event)
    if isinstance(event, CheckpointCommitted):
        info = CheckpointInfo(
            event.step, event.path, event.ts_ns, event.size_bytes, event.write_s, event.blocked_s
        )
        return msgspec.structs.replace(
            state, last_offset=source.offset, committed=_commit(state.committed, info)
        )
    if isinstance(event, CheckpointFailed):
        committed = tuple(
            c for c in state.committed if not (c.step == event.step and c.path == event.path)
        )
        return msgspec.structs.replace(
            state,
            last_offset=source.offset,
            committed=committed,
            last_failure=FailureInfo(event.step, event.path, event.reason, event.ts_ns),
            failures=state.failures + 1,
        )
    if isinstance(event, RunStarted):
        return msgspec.structs.replace(
            state, last_offset=source.offset, announced=True, ended=False
        )
    if isinstance(event, RunEnded):
        return msgspec.structs.replace(state, last_offset=source.offset, ended=True)
    return msgspec.structs.replace(state, last_offset=source.offset)


def _seen(state: CheckpointCatalogue, event: CheckpointEvent) -> CheckpointCatalogue:
    """``state`` with its log time moved to ``event``'s (never back)."""
    if event.ts_ns <= state.last_ts_ns:
        return state
    return msgspec.structs.replace(state, last_ts_ns=event.ts_ns)


def latest_checkpoint(
    checkpoints: Iterable[CheckpointCommitted | CheckpointFailed], max_step: int | None = None
) -> CheckpointCommitted | None:
    """The latest committed checkpoint at or before ``max_step``, from events in log order.

    Args:
        checkpoints: A run's checkpoint events, in the order they were logged.
        max_step: Highest acceptable step; None: any.

    Returns:
        The CheckpointCommitted with the highest eligible step (the latest commit of that
        step), unless a later CheckpointFailed of the same step and path withdrew it;
        None when there is none.
    """
    live: dict[int, CheckpointCommitted] = {}
    for event in checkpoints:
        if isinstance(event, CheckpointCommitted):
            live[event.step] = event
        elif event.step in live and live[event.step].path == event.path:
            del live[event.step]
    eligible = [s for s in live if max_step is None or s <= max_step]
    return live[max(eligible)] if eligible else None


__all__ = [
    "MAX_CATALOGUE",
    "CheckpointCatalogue",
    "CheckpointEvent",
    "CheckpointInfo",
    "FailureInfo",
    "fold_checkpoint",
    "latest_checkpoint",
]
