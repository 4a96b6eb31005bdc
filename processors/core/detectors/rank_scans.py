"""Dead ranks and hangs: the scans of the rank table, on heartbeats and on ticks.

Its state: ``step_scan_at`` and ``time_scan_after_ns`` (when a scan can next find a
rank, see `processors.core.liveness_scans`), ``dead_count`` (ranks flagged dead; the
flags themselves are the rank table's) and ``hung``. It reads the exit evidence
detector's ``exit_rank``: once the incarnation's culprit is named, its blocked peers raise
nothing.
"""

from __future__ import annotations

import msgspec

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.detectors.base import LivenessDetector
from runwatch.processors.core.liveness_facts import HeartbeatFacts
from runwatch.processors.core.liveness_scans import Gang, Verdicts, step_scan, time_scan
from runwatch.processors.core.liveness_state import LivenessState
from runwatch.processors.core.rank_table import NEVER
from runwatch.schemas.events import AnomalyDetected, Provenance, Tick


def verdict_step(state: LivenessState) -> int:
    """The step a liveness verdict names: the run's newest, else the newest known before."""
    return state.run_step if state.run_step >= 0 else state.step_hint


def fold_scans(f: HeartbeatFacts) -> None:
    """Scan for dead ranks when one can have crossed a limit; a heartbeat ends a hang.

    Rule 1: a rank reporting an older step than before lowers the next step scan to
    when that step falls ``rank_heartbeat_threshold`` behind.
    Rule 2: once the incarnation's culprit is named (exit evidence), no scan runs.
    Rule 3: the step scan runs when the run's newest step grew to ``step_scan_at``.
    Rule 4: the time scan runs when log time passed ``time_scan_after_ns`` plus
    ``dead_rank_timeout_s``.
    """
    step, previous = f.step, f.previous
    if step < previous and previous != NEVER:
        f.step_scan_at = min(f.step_scan_at, step + f.cfg.rank_heartbeat_threshold + 1)
    state = f.state
    if state.exit_rank >= 0:
        return
    run_step = f.run_step
    need_step_scan = run_step > state.run_step and run_step >= f.step_scan_at
    cfg = f.cfg
    need_time_scan = f.now_ns - f.time_scan_after > cfg.dead_rank_timeout_s * 1e9
    if not (need_step_scan or need_time_scan):
        return
    gang = Gang(state.expected_ranks, f.first_step, f.first_ns, f.last_heartbeat_ns)
    out = f.verdicts()
    if need_step_scan:
        f.step_scan_at = step_scan(gang, f.data, f.journal, run_step, cfg, out)
    if need_time_scan:
        f.time_scan_after = time_scan(gang, f.data, f.journal, f.now_ns, cfg, out, run_step)


def _hang(state: LivenessState, now_ns: int, cfg: DetectorConfig, out: Verdicts) -> bool:
    """Whether the run is hung after a tick at log time ``now_ns``.

    Rule 1: a hang already flagged stays flagged (once per outage) until a heartbeat.
    Rule 2: once the incarnation's culprit is named, no hang is raised.
    Rule 3: no heartbeat for ``hang_timeout_s`` (``startup_timeout_s`` before the
    incarnation's first one) raises ``hang``.
    """
    if state.hung:
        return True
    if state.exit_rank >= 0:
        return False
    started = state.first_step >= 0
    since_ns = state.last_heartbeat_ns if started else state.started_ns
    timeout_s = cfg.hang_timeout_s if started else cfg.startup_timeout_s
    silent_ns = now_ns - since_ns
    if silent_ns <= timeout_s * 1e9:
        return False
    what = "no rank reported" if started else "no rank reported since the start"
    out.emit(
        "hang",
        verdict_step(state),
        None,
        silent_ns / 1e9,
        timeout_s,
        f"{what} for {silent_ns / 1e9:.1f} s of log time",
    )
    return True


def on_tick(
    state: LivenessState, event: Tick, source: Provenance, cfg: DetectorConfig
) -> tuple[LivenessState, list[AnomalyDetected]]:
    """A partition's tick: log time advances; hang check and, when due, the time scan.

    Rule 1: an ended run has nothing to age: the state is returned as it is (the same
    object), so the table is not rewritten for it. A fleet's state is mostly ended runs;
    rewriting each of them on every Tick made the changelog, and a successor's replay,
    grow with uptime instead of with the fleet.
    Rule 2: the time scan runs once the incarnation has a heartbeat, no culprit is named
    and log time passed ``time_scan_after_ns`` plus ``dead_rank_timeout_s``.
    """
    if not state.live:
        return state, []
    now_ns = max(state.log_time_ns, event.ts_ns)
    out = Verdicts(state, event.ts_ns, source, cfg)
    hung = _hang(state, now_ns, cfg, out)
    table, dead_count = state.table, state.dead_count
    time_scan_after = state.time_scan_after_ns
    started = state.first_step >= 0
    if started and state.exit_rank < 0 and now_ns - time_scan_after > cfg.dead_rank_timeout_s * 1e9:
        gang = Gang(
            state.expected_ranks,
            state.first_step,
            state.first_heartbeat_ns,
            state.last_heartbeat_ns,
        )
        table, data, journal = table.begin()
        time_scan_after = time_scan(gang, data, journal, now_ns, cfg, out, verdict_step(state))
        dead_count = len(data.dead)
    return msgspec.structs.replace(
        state,
        last_offset=source.offset,
        last_index=source.index,
        log_time_ns=now_ns,
        hung=hung,
        table=table,
        dead_count=dead_count,
        time_scan_after_ns=time_scan_after,
        raised=out.raised(),
        anomaly_counts=out.counts() if out.out else state.anomaly_counts,
    ), out.out


RANK_SCANS = LivenessDetector(
    "rank_scans",
    ("step_scan_at", "time_scan_after_ns", "dead_count", "hung"),
    heartbeat=fold_scans,
    events=((Tick, on_tick),),
)
"""The dead-rank and hang detector."""

__all__ = ["RANK_SCANS", "fold_scans", "on_tick", "verdict_step"]
