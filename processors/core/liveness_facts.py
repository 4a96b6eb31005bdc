"""What the liveness detectors read and write while one heartbeat is folded.

`HeartbeatFacts` is to the liveness reducer what `processors.core.detectors.base.StepFacts`
is to the step reducer: one per heartbeat, the verdicts' `Verdicts` collector, and the
scratch in which each detector of `LIVENESS_DETECTORS`
(`processors.core.detectors.registry`) leaves its fields' new values for the next one and
for the state built at the end (`new_state`, one positional construction: no replace chain,
no per-detector struct).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runwatch.processors.core.liveness_scans import Verdicts
from runwatch.processors.core.liveness_state import LivenessState

if TYPE_CHECKING:
    from runwatch.processors.core.config import DetectorConfig
    from runwatch.processors.core.rank_table import Journal, RankTable, TableData
    from runwatch.schemas.events import Heartbeat, Provenance


class HeartbeatFacts(Verdicts):
    """One heartbeat being folded: the event, and the fields the detectors update.

    ``state`` is the state before the heartbeat (read-only). The other attributes start
    as that state's values and hold the new ones once the detector owning them has run;
    a detector reads only those of detectors registered before it (the registry's order).

    Attributes:
        event: The heartbeat.
        rank: Its rank.
        step: Its step.
        now_ns: The run's log time with this heartbeat (``log_time_ns``).
        table: The rank table's new version (set by the last-seen detector).
        data: Its containers, written through ``journal`` only.
        journal: The fold's undo journal.
        previous: The rank's last step before this heartbeat (`NEVER`: none).
        known: ``known_ranks``.
        first_step: ``first_step``.
        first_ns: ``first_heartbeat_ns``.
        run_step: ``run_step``.
        last_heartbeat_ns: ``last_heartbeat_ns``.
        step_scan_at: ``step_scan_at``.
        time_scan_after: ``time_scan_after_ns``.
        stragglers: ``stragglers``.
    """

    table: RankTable
    data: TableData
    journal: Journal
    previous: int

    __slots__ = (
        "data",
        "event",
        "first_ns",
        "first_step",
        "journal",
        "known",
        "last_heartbeat_ns",
        "now_ns",
        "previous",
        "rank",
        "run_step",
        "step",
        "step_scan_at",
        "stragglers",
        "table",
        "time_scan_after",
    )

    def __init__(
        self,
        state: LivenessState,
        event: Heartbeat,
        source: Provenance,
        cfg: DetectorConfig,
        now_ns: int,
    ) -> None:
        """Facts of ``event`` folded into ``state`` (a live run) under ``cfg``."""
        self.state = state
        self.ts_ns = event.ts_ns
        self.source = source
        self.cfg = cfg
        self.out = []
        self.event = event
        self.rank = event.rank
        self.step = event.step
        self.now_ns = now_ns
        self.known = state.known_ranks
        self.first_step = state.first_step
        self.first_ns = state.first_heartbeat_ns
        self.run_step = state.run_step
        self.last_heartbeat_ns = state.last_heartbeat_ns
        self.step_scan_at = state.step_scan_at
        self.time_scan_after = state.time_scan_after_ns
        self.stragglers = state.stragglers

    def new_state(self) -> LivenessState:
        """The run's state after the heartbeat, from the detectors' values."""
        state, source, out = self.state, self.source, self.out
        # Positional, in field order (a test pins the order): much cheaper than replace().
        return LivenessState(
            state.run_id,
            source.offset,
            state.incarnation,
            True,
            state.status,
            state.thresholds,
            self.now_ns,
            state.started_ns,
            state.expected_ranks,
            self.known,
            self.first_step,
            self.first_ns,
            self.run_step,
            state.step_hint,
            self.last_heartbeat_ns,
            self.table,
            len(self.data.dead),
            False,
            self.time_scan_after,
            self.step_scan_at,
            self.stragglers,
            state.heartbeats + 1,
            self.raised() if out else state.raised,
            self.counts() if out else state.anomaly_counts,
            state.exit_rank,
            source.index,
            state.launch_id,
        )


__all__ = ["HeartbeatFacts"]
