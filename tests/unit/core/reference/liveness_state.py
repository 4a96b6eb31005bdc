"""The liveness reducer's state: what it knows about one run's ranks."""

from __future__ import annotations

from typing import Final

import msgspec

from runwatch.processors.core.runinfo import RunStatus
from tests.unit.core.reference.stragglers import StragglerState

NEVER: Final = -1
"""Step of a rank that has not reported in this incarnation."""


class LivenessState(msgspec.Struct, frozen=True, gc=False):
    """Everything the liveness reducer knows about one run.

    Attributes:
        run_id: The run.
        last_offset: Offset of the last applied event (-1: none).
        incarnation: Gang incarnation of the latest RunStarted.
        live: False between a RunEnded and the next RunStarted (checks suspended).
        status: ``running`` or the RunEnded status.
        thresholds: The run's own detector overrides.
        log_time_ns: The run's log time (monotonic).
        started_ns: Start of the incarnation (RunStarted, else first heartbeat).
        expected_ranks: World size the RunStarted announced (0: unknown).
        known_ranks: Ranks expected or seen in this incarnation.
        first_step: Step of the incarnation's first heartbeat (-1: none yet).
        first_heartbeat_ns: Its timestamp.
        run_step: Newest step any rank reported in this incarnation (-1: none).
        step_hint: Newest step known across incarnations (for verdicts before a heartbeat).
        last_heartbeat_ns: Newest heartbeat timestamp of any rank.
        ranks: Flat ``(last_step, last_ts_ns)`` per rank; last_step -1: not reported.
        dead: Ranks currently flagged dead, ascending.
        hung: True while a hang is flagged.
        time_scan_after_ns: No rank can be silent too long before log time passes this
            plus the timeout (a lower bound on the oldest live rank's last report).
        step_scan_at: No rank can be too far behind before the run reaches this step.
        stragglers: Straggler buckets and streaks.
        heartbeats: Heartbeats applied.
        raised: Verdicts raised for the run so far (part of their ids, so a rank that
            dies twice at the same step gets two verdicts).
        anomaly_counts: Verdicts raised, by kind.
    """

    run_id: str
    last_offset: int = -1
    incarnation: int = 0
    live: bool = True
    status: RunStatus = "running"
    thresholds: dict[str, float] = {}
    log_time_ns: int = 0
    started_ns: int = 0
    expected_ranks: int = 0
    known_ranks: int = 0
    first_step: int = -1
    first_heartbeat_ns: int = 0
    run_step: int = -1
    step_hint: int = 0
    last_heartbeat_ns: int = 0
    ranks: tuple[int, ...] = ()
    dead: tuple[int, ...] = ()
    hung: bool = False
    time_scan_after_ns: int = 0
    step_scan_at: int = 0
    stragglers: StragglerState = StragglerState()
    heartbeats: int = 0
    raised: int = 0
    anomaly_counts: dict[str, int] = {}

    @property
    def dead_ranks(self) -> tuple[int, ...]:
        """Ranks currently flagged dead."""
        return self.dead

    @property
    def straggler_ranks(self) -> tuple[int, ...]:
        """Ranks currently flagged as stragglers."""
        return self.stragglers.flagged

    @property
    def live_ranks(self) -> tuple[int, ...]:
        """Known ranks not flagged dead."""
        dead = set(self.dead)
        return tuple(r for r in self._known() if r not in dead)

    def rank_last_step(self, rank: int) -> int | None:
        """Newest step ``rank`` reported in this incarnation, None if none."""
        if 2 * rank + 1 >= len(self.ranks) or self.ranks[2 * rank] == NEVER:
            return None
        return self.ranks[2 * rank]

    def _known(self) -> list[int]:
        width = len(self.ranks) // 2
        return [r for r in range(width) if r < self.expected_ranks or self.ranks[2 * r] != NEVER]


__all__ = ["NEVER", "LivenessState"]
