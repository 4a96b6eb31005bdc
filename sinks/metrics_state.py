"""What the metrics exporter knows about each run: a fold over the events it reads (pure).

Counters are deduplicated by id (verdict id, command id), so identical duplicates that
the processors publish at-least-once count once. Times are log times (event timestamps and
the clock's ticks), never the exporter's clock, so a replay of the same log shows the same
figures.

An MFU above 1 is impossible (the run declared a peak below what it achieves, or a wrong
model size): it is kept as computed, never clamped, and the step is flagged
(``mfu_implausible``) so the exporter can warn and export the flag.

Dead letters (records the processors could not apply) are counted per source topic and
stage, not per run: a bad record's run id cannot be trusted.

Bounded cardinality: a run's label sets are dropped once the run ended (RunEnded) more
than ``ended_retention_s`` of log time ago, or has been silent for ``stale_s`` of log time;
"log time now" is the newest timestamp the exporter has read from any topic. At most
``max_runs`` runs are tracked: past it, ended runs go first (the longest ended), then the
longest silent. Each run keeps at most ``MAX_SEEN_IDS`` ids for deduplication.

Bounded time: an event's time counts only up to a bound the caller gives with it
(`sinks.metrics.MetricsSink`: the record's broker timestamp, and never past the exporter's
wall clock, plus ``max_future_s``). One record dated in 2200 (``ts_ns=7e18``) therefore
moves "log time now" by at most ``max_future_s``, and cannot retire every other run as
stale (issue 19, finding 5). The bound only caps times; a log replayed later (a restart)
is folded to the same figures, since its records are all in the past.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.mfu import mfu
from runwatch.processors.core.runinfo import RunInfo
from runwatch.schemas.events import (
    AnomalyDetected,
    CommandRejected,
    DeadLetter,
    Event,
    EventPack,
    Heartbeat,
    RestartCompleted,
    RestartFailed,
    RestartRequested,
    RunEnded,
    RunStarted,
    StepCompleted,
    Tick,
)

NS_PER_S = 1_000_000_000
MAX_SEEN_IDS = 10_000
"""Ids a run keeps for deduplicating its counters; past it, the oldest are forgotten."""
MFU_MAX = 1.0
"""Above this an MFU is implausible: more FLOP/s than the hardware's declared peak."""


@dataclass
class RunFigures:
    """One run's latest figures and counts."""

    run_id: str
    incarnation: int = 0
    info: RunInfo | None = None
    last_step: int | None = None
    loss: float | None = None
    grad_norm: float | None = None
    mfu_ratio: float | None = None
    mfu_implausible: bool = False
    tokens_per_s: float | None = None
    rank_seen_ns: dict[int, int] = field(default_factory=dict)
    heartbeat_partition: int | None = None
    last_ns: int = 0
    ended_ns: int | None = None
    anomalies: dict[str, int] = field(default_factory=dict)
    restarts: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    seen_ids: dict[str, None] = field(default_factory=dict)
    """Ids counted (insertion ordered: the oldest are forgotten past `MAX_SEEN_IDS`)."""


@dataclass
class MetricsPolicy:
    """Tunables of the fold.

    Attributes:
        live_window_s: A rank is live when its last heartbeat is this recent (log time).
        ended_retention_s: Keep an ended run's label sets this long after its end.
        stale_s: Drop a run silent this long.
        max_runs: Track at most this many runs (ended ones are evicted first).
        max_future_s: How far past its bound (broker timestamp, wall clock) an event's
            time may count.
        detector: For the MFU convention.
    """

    live_window_s: float = 60.0
    ended_retention_s: float = 3600.0
    stale_s: float = 86400.0
    max_runs: int = 10_000
    max_future_s: float = 300.0
    detector: DetectorConfig = field(default_factory=DetectorConfig)


class FleetFigures:
    """Every run's figures, folded from events in log order per partition."""

    def __init__(self, policy: MetricsPolicy | None = None) -> None:
        self.policy = policy or MetricsPolicy()
        self.runs: dict[str, RunFigures] = {}
        self.tick_ns: dict[int, int] = {}
        self.newest_ns = 0
        self.dead_letters: dict[tuple[str, str], int] = {}
        self.evicted = 0

    def _run(self, run_id: str) -> RunFigures:
        fig = self.runs.get(run_id)
        if fig is None:
            fig = self.runs[run_id] = RunFigures(run_id)
        return fig

    def apply(self, event: Event, partition: int, bound_ns: int | None = None) -> None:
        """Fold one event read from ``partition`` of its topic (a pack: each of its events).

        Args:
            event: The event.
            partition: The partition it was read from.
            bound_ns: The latest time the event may claim (module doc); None: no bound.
        """
        if isinstance(event, DeadLetter):
            self._dead_letter(event)
            return
        if type(event) is EventPack:
            for inner in event.events:
                self.apply(inner, partition, bound_ns)
            return
        ts_ns = event.ts_ns if bound_ns is None else min(event.ts_ns, bound_ns)
        self.newest_ns = max(self.newest_ns, ts_ns)
        if isinstance(event, Tick):
            self.tick_ns[partition] = max(self.tick_ns.get(partition, 0), ts_ns)
            return
        fig = self._run(event.run_id)
        fig.last_ns = max(fig.last_ns, ts_ns)
        if isinstance(event, RunStarted):
            # RunStarted travels on several topics, read in any order: only a newer start
            # (log time) replaces the info, and only ranks seen before it are forgotten.
            if fig.info is None or ts_ns >= fig.info.started_ns:
                fig.info, fig.incarnation = RunInfo.from_event(event), event.incarnation
                fig.rank_seen_ns = {r: t for r, t in fig.rank_seen_ns.items() if t >= ts_ns}
                if fig.ended_ns is not None and fig.ended_ns < ts_ns:
                    fig.ended_ns = None
        elif isinstance(event, RunEnded):
            # RunStarted and RunEnded travel on several topics: an end older than the
            # current incarnation's start is the previous incarnation's.
            if fig.info is None or ts_ns >= fig.info.started_ns:
                fig.ended_ns = ts_ns
        elif isinstance(event, StepCompleted):
            self._step(fig, event)
        elif isinstance(event, Heartbeat):
            fig.heartbeat_partition = partition
            fig.rank_seen_ns[event.rank] = max(fig.rank_seen_ns.get(event.rank, 0), ts_ns)
        else:
            self._count(fig, event)

    def _step(self, fig: RunFigures, event: StepCompleted) -> None:
        fig.last_step, fig.loss, fig.grad_norm = event.step, event.loss, event.grad_norm
        fig.tokens_per_s = fig.mfu_ratio = None
        fig.mfu_implausible = False
        if event.tokens > 0 and event.step_time_s > 0 and math.isfinite(event.step_time_s):
            fig.tokens_per_s = event.tokens / event.step_time_s
            per_token = fig.info.flops_per_token(self.policy.detector) if fig.info else None
            if per_token is not None and fig.info is not None:
                fig.mfu_ratio = mfu(
                    per_token * event.tokens, event.step_time_s, fig.info.peak_flops_per_s
                )
                fig.mfu_implausible = fig.mfu_ratio is not None and fig.mfu_ratio > MFU_MAX

    def _count(self, fig: RunFigures, event: Event) -> None:
        bucket: tuple[str, str]
        if isinstance(event, AnomalyDetected):
            key, bucket = event.verdict_id, ("anomaly", str(event.kind))
        elif isinstance(event, RestartRequested):
            key, bucket = f"cmd:{event.command_id}", ("restart", "")
        elif isinstance(event, RestartCompleted | RestartFailed | CommandRejected):
            outcome = {
                RestartCompleted: "completed",
                RestartFailed: "failed",
                CommandRejected: "rejected",
            }[type(event)]
            if isinstance(event, RestartFailed) and event.covered:
                outcome = "covered"  # a restart in progress answers it: no failure to page
            key, bucket = f"{outcome}:{event.command_id}", ("outcome", outcome)
        else:
            return
        if key in fig.seen_ids:
            return
        fig.seen_ids[key] = None
        if len(fig.seen_ids) > MAX_SEEN_IDS:
            del fig.seen_ids[next(iter(fig.seen_ids))]
        family, label = bucket
        if family == "anomaly":
            fig.anomalies[label] = fig.anomalies.get(label, 0) + 1
        elif family == "restart":
            fig.restarts += 1
        else:
            fig.outcomes[label] = fig.outcomes.get(label, 0) + 1

    def _dead_letter(self, event: DeadLetter) -> None:
        """Count a record the processors could not apply, by its topic and stage.

        Not deduplicated (a dead letter published twice counts twice): a flood of bad
        records must not grow a set of ids; a rate is what the figure is for.
        """
        key = (event.source.topic, event.stage)
        self.dead_letters[key] = self.dead_letters.get(key, 0) + 1

    def live_ranks(self, fig: RunFigures) -> int:
        """Ranks whose last heartbeat is within the live window of the run's log time."""
        if fig.ended_ns is not None:
            return 0
        now = fig.last_ns
        if fig.heartbeat_partition is not None:
            now = max(now, self.tick_ns.get(fig.heartbeat_partition, 0))
        horizon = now - int(self.policy.live_window_s * NS_PER_S)
        return sum(1 for seen in fig.rank_seen_ns.values() if seen >= horizon)

    def prune(self) -> list[str]:
        """Drop the runs the cardinality rule retires; returns their ids.

        First the runs ended longer than the retention ago or silent too long; then, while
        more than ``max_runs`` remain, ended runs (the longest ended first) and then the
        longest silent ones (counted in ``evicted``).
        """
        ended_ns = int(self.policy.ended_retention_s * NS_PER_S)
        stale_ns = int(self.policy.stale_s * NS_PER_S)
        gone = [
            r
            for r, fig in self.runs.items()
            if (fig.ended_ns is not None and self.newest_ns - fig.ended_ns > ended_ns)
            or self.newest_ns - fig.last_ns > stale_ns
        ]
        for r in gone:
            del self.runs[r]
        excess = len(self.runs) - self.policy.max_runs
        if excess > 0:
            order = heapq.nsmallest(excess, self.runs.values(), key=_eviction_order)
            for fig in order:
                del self.runs[fig.run_id]
            self.evicted += len(order)
            gone += [fig.run_id for fig in order]
        return gone


def _eviction_order(fig: RunFigures) -> tuple[bool, int]:
    """Ended runs first (longest ended), then the longest silent."""
    if fig.ended_ns is not None:
        return (False, fig.ended_ns)
    return (True, fig.last_ns)
