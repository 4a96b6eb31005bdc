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
from runwatch.schemas.events import MAX_LISTED_RANKS, AnomalyDetected, AnomalyKind, Provenance

RANGES_MAX_CHARS = 200
"""Longest list of rank ranges a verdict's detail spells out (``ranks`` has them all)."""


def rank_ranges(ranks: list[int]) -> str:
    """Ascending ranks as ranges, ``0-3, 7, 9-10``, cut to `RANGES_MAX_CHARS` with ``...``."""
    parts: list[str] = []
    start = prev = ranks[0]
    for rank in [*ranks[1:], -2]:
        if rank == prev + 1:
            prev = rank
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = rank
    text = ", ".join(parts)
    return text if len(text) <= RANGES_MAX_CHARS else text[: RANGES_MAX_CHARS - 3] + "..."


class Verdicts:
    """Collects one event's verdicts with their shared identity and provenance.

    Attributes:
        state: The run's state before the event (its run, incarnation, launch, and the
            verdicts raised so far, which number the new ones).
        ts_ns: The event's time (the verdicts').
        source: The event's log position (the verdicts' provenance).
        cfg: The configuration the verdicts were judged under.
        out: The verdicts, in the order they were emitted.
    """

    __slots__ = ("cfg", "out", "source", "state", "ts_ns")

    def __init__(
        self, state: LivenessState, ts_ns: int, source: Provenance, cfg: DetectorConfig
    ) -> None:
        self.state = state
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
        rank_count: int = 0,
    ) -> None:
        """Record one verdict (the arguments are its fields)."""
        state = self.state
        self.out.append(
            make_anomaly(
                run_id=state.run_id,
                kind=kind,
                step=step,
                ts_ns=self.ts_ns,
                source=self.source,
                config_hash=config_hash(self.cfg),
                incarnation=state.incarnation,
                launch_id=state.launch_id,
                attempt=state.raised + len(self.out),
                rank=rank,
                value=value,
                baseline=baseline,
                threshold=threshold,
                detail=detail,
                ranks=ranks,
                rank_count=rank_count,
                shadow=is_shadow(self.cfg, kind),
            )
        )

    def emit_ranks(
        self, step: int, ranks: list[int], value: float, threshold: float, detail: str
    ) -> None:
        """Record one ``dead_rank`` verdict naming every rank of ``ranks`` (ascending).

        ``rank`` is the first, ``ranks`` lists at most `MAX_LISTED_RANKS` of them and
        ``rank_count`` counts them all: one verdict per scan, whatever the gang's size.
        """
        self.emit(
            "dead_rank",
            step,
            ranks[0],
            value,
            threshold,
            detail,
            ranks=tuple(ranks[:MAX_LISTED_RANKS]),
            rank_count=len(ranks),
        )

    def counts(self) -> dict[str, int]:
        """The run's verdict counts by kind, these included."""
        counts = dict(self.state.anomaly_counts)
        for v in self.out:
            counts[v.kind] = counts.get(v.kind, 0) + 1
        return counts

    def raised(self) -> int:
        """Verdicts raised for the run, these included."""
        return self.state.raised + len(self.out)


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
    flagged: list[tuple[int, int, int]] = []  # rank, steps behind, its last step
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
            flagged.append((rank, behind, last))
        else:
            oldest = min(oldest, last)
    if flagged:
        worst = max(flagged, key=lambda f: f[1])
        first, behind, last = flagged[0]
        what = (
            f"rank {first} silent since step {last}, {behind} steps behind the run"
            if len(flagged) == 1
            else f"{len(flagged)} ranks silent ({rank_ranges([f[0] for f in flagged])}), "
            f"up to {worst[1]} steps behind the run"
        )
        out.emit_ranks(run_step, [f[0] for f in flagged], float(worst[1]), float(threshold), what)
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
    flagged: list[tuple[int, int]] = []  # rank, ns silent
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
            flagged.append((rank, silent_ns))
        else:
            oldest = min(oldest, last_ns)
    if flagged:
        longest_s = max(f[1] for f in flagged) / 1e9
        how = "whole gang silent" if whole_gang else "peers reporting"
        what = (
            f"rank {flagged[0][0]} silent for {longest_s:.1f} s of log time ({how})"
            if len(flagged) == 1
            else f"{len(flagged)} ranks silent ({rank_ranges([f[0] for f in flagged])}) for "
            f"up to {longest_s:.1f} s of log time ({how})"
        )
        out.emit_ranks(step, [f[0] for f in flagged], longest_s, cfg.dead_rank_timeout_s, what)
    return oldest


__all__ = ["RANGES_MAX_CHARS", "Gang", "Verdicts", "rank_ranges", "step_scan", "time_scan"]
