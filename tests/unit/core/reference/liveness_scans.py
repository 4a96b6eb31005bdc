"""Scans of a rank table for dead ranks, and the verdicts they raise."""

from __future__ import annotations

import msgspec

from runwatch.processors.core.config import DetectorConfig, config_hash
from runwatch.processors.core.liveness_scans import rank_ranges
from runwatch.processors.core.verdicts import make_anomaly
from runwatch.schemas.events import MAX_LISTED_RANKS, AnomalyDetected, AnomalyKind, Provenance
from tests.unit.core.reference.liveness_state import NEVER, LivenessState


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
        ranks: tuple[int, ...] = (),
    ) -> None:
        """Record one verdict (the arguments are its fields; ``ranks``: all at fault)."""
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
                ranks=ranks[:MAX_LISTED_RANKS],
                rank_count=len(ranks),
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
    ranks: tuple[int, ...],
    dead: list[int],
    run_step: int,
    cfg: DetectorConfig,
    out: Verdicts,
) -> int:
    """Flag ranks too many steps behind ``run_step``; return the next step worth a scan."""
    threshold = cfg.rank_heartbeat_threshold
    oldest = run_step
    flagged: list[tuple[int, int, int]] = []
    for rank in range(len(ranks) // 2):
        last = ranks[2 * rank]
        if last == NEVER:
            if rank >= gang.expected_ranks:
                continue
            last = gang.first_step - 1
        if rank in dead:
            continue
        behind = run_step - last
        if behind > threshold:
            dead.append(rank)
            flagged.append((rank, behind, last))
        else:
            oldest = min(oldest, last)
    if len(flagged) == 1:
        rank, behind, last = flagged[0]
        detail = f"rank {rank} silent since step {last}, {behind} steps behind the run"
    elif flagged:
        behind = max(f[1] for f in flagged)
        listed = rank_ranges([f[0] for f in flagged])
        detail = f"{len(flagged)} ranks silent ({listed}), up to {behind} steps behind the run"
    if flagged:
        ranks_ = tuple(f[0] for f in flagged)
        worst = float(max(f[1] for f in flagged))
        out.emit("dead_rank", run_step, ranks_[0], worst, float(threshold), detail, ranks=ranks_)
    return oldest + threshold + 1


def time_scan(
    gang: Gang,
    ranks: tuple[int, ...],
    dead: list[int],
    now_ns: int,
    cfg: DetectorConfig,
    out: Verdicts,
    step: int,
) -> int:
    """Flag ranks silent too long in log time; return the oldest live rank's last report."""
    timeout_ns = int(cfg.dead_rank_timeout_s * 1e9)
    whole_gang = now_ns - gang.last_heartbeat_ns > timeout_ns
    oldest = now_ns
    flagged: list[tuple[int, int]] = []
    for rank in range(len(ranks) // 2):
        last_step, last_ns = ranks[2 * rank], ranks[2 * rank + 1]
        if last_step == NEVER:
            if rank >= gang.expected_ranks:
                continue
            last_ns = gang.first_heartbeat_ns
        if rank in dead:
            continue
        silent_ns = now_ns - last_ns
        if silent_ns > timeout_ns:
            dead.append(rank)
            flagged.append((rank, silent_ns))
        else:
            oldest = min(oldest, last_ns)
    if flagged:
        ranks_ = tuple(f[0] for f in flagged)
        longest_s = max(f[1] for f in flagged) / 1e9
        how = "whole gang silent" if whole_gang else "peers reporting"
        if len(ranks_) == 1:
            detail = f"rank {ranks_[0]} silent for {longest_s:.1f} s of log time ({how})"
        else:
            detail = (
                f"{len(ranks_)} ranks silent ({rank_ranges(list(ranks_))}) for up to "
                f"{longest_s:.1f} s of log time ({how})"
            )
        out.emit(
            "dead_rank", step, ranks_[0], longest_s, cfg.dead_rank_timeout_s, detail, ranks=ranks_
        )
    return oldest


__all__ = ["Gang", "Verdicts", "step_scan", "time_scan"]
