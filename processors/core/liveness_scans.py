"""Scans of a rank table for dead ranks, and the verdicts they raise.

A scan reads every rank, O(world), but runs only when some rank can have crossed a limit:
the step scan when the run reaches ``step_scan_at`` (the oldest live rank's step plus the
threshold, so at most once per ``rank_heartbeat_threshold`` steps of the slowest rank,
i.e. once per threshold x world heartbeats in a healthy gang), the time scan when log time
passes ``time_scan_after_ns`` plus the timeout (the oldest live rank's last report). Each
scan is O(1) per rank (dead flags are a dict), so the amortised cost per heartbeat is
bounded whatever the world size.
"""

from __future__ import annotations

import msgspec

from runwatch.processors.core.config import DetectorConfig, config_hash, is_shadow
from runwatch.processors.core.liveness_state import LivenessState
from runwatch.processors.core.rank_table import NEVER, Journal, TableData
from runwatch.processors.core.verdicts import make_anomaly
from runwatch.schemas.events import AnomalyDetected, AnomalyKind, Provenance


class Verdicts:
    """Collects one event's verdicts with their shared identity and provenance."""

    __slots__ = (
        "cfg",
        "counts_before",
        "incarnation",
        "out",
        "raised_before",
        "run_id",
        "source",
        "ts_ns",
    )

    def __init__(
        self, state: LivenessState, ts_ns: int, source: Provenance, cfg: DetectorConfig
    ) -> None:
        self.run_id = state.run_id
        self.incarnation = state.incarnation
        self.raised_before = state.raised
        self.counts_before = state.anomaly_counts
        self.ts_ns = ts_ns
        self.source = source
        self.cfg = cfg
        self.out: list[AnomalyDetected] = []

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
        """Record one verdict (the arguments are its fields)."""
        self.out.append(
            make_anomaly(
                run_id=self.run_id,
                kind=kind,
                step=step,
                ts_ns=self.ts_ns,
                source=self.source,
                config_hash=config_hash(self.cfg),
                incarnation=self.incarnation,
                attempt=self.raised_before + len(self.out),
                rank=rank,
                value=value,
                baseline=baseline,
                threshold=threshold,
                detail=detail,
                shadow=is_shadow(self.cfg, kind),
            )
        )

    def counts(self) -> dict[str, int]:
        """The run's verdict counts by kind, these included."""
        counts = dict(self.counts_before)
        for v in self.out:
            counts[v.kind] = counts.get(v.kind, 0) + 1
        return counts

    def raised(self) -> int:
        """Verdicts raised for the run, these included."""
        return self.raised_before + len(self.out)


class Gang(msgspec.Struct, frozen=True, gc=False):
    """What a scan needs to know about the incarnation besides the rank table."""

    expected_ranks: int
    first_step: int
    first_heartbeat_ns: int
    last_heartbeat_ns: int


def step_scan(
    gang: Gang,
    data: TableData,
    journal: Journal,
    run_step: int,
    cfg: DetectorConfig,
    out: Verdicts,
) -> int:
    """Flag ranks too many steps behind ``run_step``; return the next step worth a scan."""
    threshold = cfg.rank_heartbeat_threshold
    oldest = run_step
    dead = data.dead
    for rank, last in enumerate(data.steps):
        if last == NEVER:
            if rank >= gang.expected_ranks:
                continue
            last = gang.first_step - 1
        if rank in dead:
            continue
        behind = run_step - last
        if behind > threshold:
            journal.put(dead, rank, None)
            out.emit(
                "dead_rank",
                run_step,
                rank,
                float(behind),
                float(threshold),
                f"rank {rank} silent since step {last}, {behind} steps behind the run",
            )
        else:
            oldest = min(oldest, last)
    return oldest + threshold + 1


def time_scan(
    gang: Gang,
    data: TableData,
    journal: Journal,
    now_ns: int,
    cfg: DetectorConfig,
    out: Verdicts,
    step: int,
) -> int:
    """Flag ranks silent too long in log time; return the oldest live rank's last report."""
    timeout_ns = int(cfg.dead_rank_timeout_s * 1e9)
    whole_gang = now_ns - gang.last_heartbeat_ns > timeout_ns
    oldest = now_ns
    dead = data.dead
    for rank, (last_step, last_ns) in enumerate(zip(data.steps, data.ts, strict=True)):
        if last_step == NEVER:
            if rank >= gang.expected_ranks:
                continue
            last_ns = gang.first_heartbeat_ns
        if rank in dead:
            continue
        silent_ns = now_ns - last_ns
        if silent_ns > timeout_ns:
            journal.put(dead, rank, None)
            out.emit(
                "dead_rank",
                step,
                rank,
                silent_ns / 1e9,
                cfg.dead_rank_timeout_s,
                f"rank {rank} silent for {silent_ns / 1e9:.1f} s of log time "
                f"({'whole gang silent' if whole_gang else 'peers reporting'})",
            )
        else:
            oldest = min(oldest, last_ns)
    return oldest


__all__ = ["Gang", "Verdicts", "step_scan", "time_scan"]
