"""The demo's live terminal view: pure rendering of what the processors know.

`render` turns run summaries and the latest events into one frame of text; the caller
decides how to paint it (ANSI redraw on a terminal, plain lines otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from runwatch.processors.fleet import RunSummary
from runwatch.schemas.events import (
    AnomalyDetected,
    CommandRejected,
    Event,
    RestartCompleted,
    RestartFailed,
    RestartRequested,
    event_name,
)

BAR_WIDTH = 24


def progress_bar(done: int, total: int, width: int = BAR_WIDTH) -> str:
    """``[#####-----]  42%`` for ``done`` of ``total``."""
    frac = 0.0 if total <= 0 else min(1.0, max(0.0, done / total))
    filled = round(frac * width)
    return f"[{'#' * filled}{'-' * (width - filled)}] {100 * frac:3.0f}%"


def describe(event: Event) -> str:
    """One line for an anomaly, a command or a controller event."""
    if isinstance(event, AnomalyDetected):
        rank = "" if event.rank is None else f" rank {event.rank}"
        shadow = " (shadow)" if event.shadow else ""
        return f"{event.run_id}: {event.kind}{shadow} at step {event.step}{rank}: {event.detail}"
    if isinstance(event, RestartRequested):
        bound = "latest" if event.max_checkpoint_step is None else f"<= {event.max_checkpoint_step}"
        shadow = "shadow (not executed) " if event.shadow else ""
        return (
            f"{event.run_id}: {shadow}command {event.action} "
            f"(cause {event.cause_kind}, checkpoint {bound})"
        )
    if isinstance(event, RestartCompleted):
        start = "scratch" if event.checkpoint_step is None else f"step {event.checkpoint_step}"
        return (
            f"{event.run_id}: restarted from {start} with {event.world_size} ranks "
            f"in {event.duration_s:.1f} s"
        )
    if isinstance(event, RestartFailed):
        return f"{event.run_id}: restart FAILED: {event.reason}"
    if isinstance(event, CommandRejected):
        return f"{event.run_id}: command rejected: {event.reason}"
    return f"{event.run_id}: {event_name(event)}"


def _row(r: RunSummary, total_steps: int) -> str:
    step = r.last_step if r.last_step is not None else 0
    loss = "-" if r.loss is None else f"{r.loss:.3f}"
    mfu = "-" if r.mfu is None else f"{100 * r.mfu:.2f}%"
    ranks = f"{len(r.live_ranks)}/{len(r.live_ranks) + len(r.dead_ranks)}"
    anomalies = sum(r.anomalies.values())
    flag = "" if r.continuity_ok else "  continuity BROKEN"
    return (
        f"{r.run_id:<14} {progress_bar(step, total_steps)} step {step:>4} loss {loss:>7} "
        f"mfu {mfu:>7} ranks {ranks:>4} inc {r.incarnation} anomalies {anomalies:>2} "
        f"restarts {r.restarts}{flag}"
    )


def render(
    runs: Sequence[RunSummary],
    total_steps: Mapping[str, int],
    recent: Sequence[Event],
    *,
    elapsed_s: float,
    title: str = "runwatch demo",
) -> str:
    """One frame: a line per run with a progress bar, then the newest events."""
    lines = [f"{title}  ({elapsed_s:5.1f} s)", ""]
    known = {r.run_id for r in runs}
    lines += [_row(r, total_steps.get(r.run_id, 0)) for r in runs]
    lines += [f"{run:<14} waiting for the first events" for run in total_steps if run not in known]
    lines += ["", "latest verdicts and restarts:"]
    lines += [f"  {describe(e)}" for e in recent[-8:]] or ["  (none yet)"]
    return "\n".join(lines)
