"""The liveness reducer's state: what it knows about one run's ranks.

The scalars are a frozen struct; the per-rank data (last step and timestamp, dead flags,
straggler buckets and streaks) is a `processors.core.rank_table.RankTable`, updated in
place through a journal so a heartbeat costs O(1) at any world size, while every state
value still reads as it was when it was returned (see that module's ownership rule).
"""

from __future__ import annotations

import msgspec

from runwatch.processors.core.rank_table import NEVER, RankTable
from runwatch.processors.core.runinfo import RunStatus
from runwatch.processors.core.stragglers import StragglerState


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
        table: Per rank: last step and timestamp, dead flag, straggler buckets, streaks
            and flags.
        dead_count: Ranks currently flagged dead.
        hung: True while a hang is flagged.
        time_scan_after_ns: No rank can be silent too long before log time passes this
            plus the timeout (a lower bound on the oldest live rank's last report).
        step_scan_at: No rank can be too far behind before the run reaches this step.
        stragglers: Which steps the two open straggler buckets hold.
        heartbeats: Heartbeats applied.
        raised: Verdicts raised for the run so far (part of their ids, so a rank that
            dies twice at the same step gets two verdicts).
        anomaly_counts: Verdicts raised, by kind.
        exit_rank: The rank whose faulty exit (a `schemas.events.RankExited`) was reported
            in this incarnation (-1: none). While set, the silence and step scans and the
            hang check raise nothing more for the incarnation: its other ranks are blocked
            peers of the culprit, not separate faults.
        last_index: Index in its pack of the last applied event (-1: the record at
            ``last_offset`` was the event); with ``last_offset`` the position that older
            ones are skipped below.
        launch_id: The launch of the latest RunStarted (empty: none); the verdicts carry it.
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
    table: RankTable = msgspec.field(default_factory=RankTable)
    dead_count: int = 0
    hung: bool = False
    time_scan_after_ns: int = 0
    step_scan_at: int = 0
    stragglers: StragglerState = StragglerState()
    heartbeats: int = 0
    raised: int = 0
    anomaly_counts: dict[str, int] = {}
    exit_rank: int = -1
    last_index: int = -1
    launch_id: str = ""

    @property
    def dead(self) -> tuple[int, ...]:
        """Ranks currently flagged dead, ascending."""
        return tuple(sorted(self.table.read().dead))

    @property
    def dead_ranks(self) -> tuple[int, ...]:
        """Ranks currently flagged dead."""
        return self.dead

    @property
    def straggler_ranks(self) -> tuple[int, ...]:
        """Ranks currently flagged as stragglers."""
        return tuple(sorted(self.table.read().flagged))

    @property
    def width(self) -> int:
        """Ranks the table has a row for (expected or seen)."""
        return len(self.table.read().steps)

    @property
    def live_ranks(self) -> tuple[int, ...]:
        """Known ranks not flagged dead."""
        dead = self.table.read().dead
        return tuple(r for r in self._known() if r not in dead)

    def rank_last_step(self, rank: int) -> int | None:
        """Newest step ``rank`` reported in this incarnation, None if none."""
        steps = self.table.read().steps
        if rank >= len(steps) or steps[rank] == NEVER:
            return None
        return steps[rank]

    def _known(self) -> list[int]:
        steps = self.table.read().steps
        return [r for r in range(len(steps)) if r < self.expected_ranks or steps[r] != NEVER]


__all__ = ["NEVER", "LivenessState"]
