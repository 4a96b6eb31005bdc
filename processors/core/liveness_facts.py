"""What the liveness detectors read and write while one heartbeat is folded.

`HeartbeatFacts` is to the liveness reducer what `processors.core.detectors.base.StepFacts`
is to the step reducer: one per heartbeat, holding what the reducer's own bookkeeping
recorded (the rank's last step and time, the run's newest step: `fold_liveness` does it
before any detector runs) and the scratch in which each heartbeat detector of
`LIVENESS_DETECTORS` (`processors.core.detectors.registry`) leaves its fields' new values
for the next one and for the state the reducer builds at the end (one positional
construction: no replace chain, no per-detector struct).

Cost: it is a mutable msgspec struct built positionally, so making one per heartbeat is a
single C call (a Python ``__init__`` writing its attributes one by one cost about a third
of a heartbeat's fold); its `Verdicts` collector is made only when a detector emits.
"""

from __future__ import annotations

import msgspec

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.liveness_scans import Verdicts
from runwatch.processors.core.liveness_state import LivenessState
from runwatch.processors.core.rank_table import Journal, TableData
from runwatch.processors.core.stragglers import StragglerState
from runwatch.schemas.events import AnomalyKind, Heartbeat, Provenance


class HeartbeatFacts(msgspec.Struct, gc=False):
    """One heartbeat being folded: the event, the run's new bookkeeping, the detectors' fields.

    The first fourteen attributes are set by the reducer and read only by the detectors;
    the last four start as the state's values and hold the new ones once the detector
    owning them has run (a detector reads only those of detectors registered before it:
    the registry's order).

    Attributes:
        state: The run's state before the heartbeat (read only).
        event: The heartbeat.
        source: Its log position (the verdicts' provenance).
        cfg: The configuration it is judged under.
        now_ns: The run's log time with this heartbeat (``log_time_ns``).
        rank: Its rank.
        step: Its step.
        previous: The rank's last step before this heartbeat (`NEVER`: none).
        data: The rank table's containers, written through ``journal`` only.
        journal: The fold's undo journal.
        known: ``known_ranks`` with this heartbeat.
        first_step: ``first_step`` with this heartbeat.
        first_ns: ``first_heartbeat_ns`` with this heartbeat.
        run_step: ``run_step`` with this heartbeat.
        last_heartbeat_ns: ``last_heartbeat_ns`` with this heartbeat.
        step_scan_at: ``step_scan_at`` (the rank scans detector's).
        time_scan_after: ``time_scan_after_ns`` (the rank scans detector's).
        stragglers: ``stragglers`` (the straggler detector's).
        out: The heartbeat's verdicts (None: none yet; `verdicts` makes it).
    """

    state: LivenessState
    event: Heartbeat
    source: Provenance
    cfg: DetectorConfig
    now_ns: int
    rank: int
    step: int
    previous: int
    data: TableData
    journal: Journal
    known: int
    first_step: int
    first_ns: int
    run_step: int
    last_heartbeat_ns: int
    step_scan_at: int
    time_scan_after: int
    stragglers: StragglerState
    out: Verdicts | None = None

    def verdicts(self) -> Verdicts:
        """The heartbeat's verdict collector (made on first use)."""
        out = self.out
        if out is None:
            out = self.out = Verdicts(self.state, self.event.ts_ns, self.source, self.cfg)
        return out

    def emit(
        self,
        kind: AnomalyKind,
        step: int,
        rank: int | None,
        value: float,
        threshold: float,
        detail: str,
        baseline: float | None = None,
    ) -> None:
        """Record one verdict of this heartbeat (`Verdicts.emit`)."""
        self.verdicts().emit(kind, step, rank, value, threshold, detail, baseline)


__all__ = ["HeartbeatFacts"]
