"""Per-rank last-seen: each heartbeat's rank, step and time into the run's rank table.

Its state: the rank table's step and timestamp per rank (``table``), ``known_ranks``,
``first_step`` and ``first_heartbeat_ns`` (the incarnation's first heartbeat),
``run_step`` (newest step of any rank), ``last_heartbeat_ns``, ``log_time_ns`` and the
``heartbeats`` count. The scans and the straggler detector after it read these.
"""

from __future__ import annotations

from runwatch.processors.core.bounds import MAX_STEP, MAX_STEP_JUMP, check_step
from runwatch.processors.core.detectors.base import LivenessDetector
from runwatch.processors.core.liveness_facts import HeartbeatFacts
from runwatch.processors.core.rank_table import NEVER


def fold_last_seen(f: HeartbeatFacts) -> None:
    """Record the heartbeat's rank, step and time.

    Rule 1: a step past a bound (`processors.core.bounds`) is refused before any write.
    Rule 2: a rank past the table's width widens it (ranks in between have not reported).
    Rule 3: a rank not expected by the RunStarted that reports for the first time is known.
    Rule 4: the incarnation's first heartbeat sets its first step and time.
    Rule 5: a rank flagged dead that reports again is live (its outage ended).
    Rule 6: the run's newest step and heartbeat time only grow.
    """
    state, rank, step, ts_ns = f.state, f.rank, f.step, f.ts_ns
    newest = state.run_step if state.run_step >= 0 else state.step_hint or -1
    if step >= MAX_STEP or step - newest > MAX_STEP_JUMP:
        check_step(step, newest if newest >= 0 else -1, "heartbeat step")
    table, data, journal = state.table.begin()
    f.table, f.data, f.journal = table, data, journal
    steps, stamps = data.steps, data.ts
    if rank >= len(steps):
        for _ in range(rank + 1 - len(steps)):
            journal.push(steps, NEVER)
            journal.push(stamps, 0)
    previous = steps[rank]
    f.previous = previous
    # Inline journal writes (Journal.set): this is the per-heartbeat path.
    journal.append((steps, rank, previous))
    steps[rank] = step
    journal.append((stamps, rank, stamps[rank]))
    stamps[rank] = ts_ns
    if previous == NEVER and rank >= state.expected_ranks:
        f.known += 1
    if f.first_step < 0:
        f.first_step, f.first_ns = step, ts_ns
    dead = data.dead
    if dead and rank in dead:
        journal.discard(dead, rank)
    if ts_ns > f.last_heartbeat_ns:
        f.last_heartbeat_ns = ts_ns
    if step > f.run_step:
        f.run_step = step


LAST_SEEN = LivenessDetector(
    "last_seen",
    (
        "table",
        "known_ranks",
        "first_step",
        "first_heartbeat_ns",
        "run_step",
        "last_heartbeat_ns",
        "log_time_ns",
        "heartbeats",
    ),
    heartbeat=fold_last_seen,
)
"""The per-rank last-seen detector (it raises nothing; the scans judge what it records)."""

__all__ = ["LAST_SEEN", "fold_last_seen"]
