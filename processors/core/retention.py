"""How long the processors keep a run's state once nothing more is expected of it.

A fleet sees many runs; each keeps a state per folded topic (a liveness state holds a row
per rank). Kept forever, 100,000 run ids grew a worker from 91 to 833 MiB (issue 19,
finding 10). So a run's liveness state is evicted, in log time (the Ticks of its
partition, never the processor's clock), once:

1. the run ended (RunEnded) more than `ENDED_RETENTION_NS` ago, or
2. it is live but nothing of it (RunStarted, heartbeat) arrived for `SILENT_RETENTION_NS`:
   by then its hang verdict is days old, and a run id that only ever wrote one record
   (a typo, a test, a forger) does not stay forever.

Eviction deletes the state from the processors' table (a tombstone in its changelog); the
records stay in their topics, so the audit still replays the run, and a later record of the
run starts a fresh state, as for a run never seen. Live, audit and replay evict at the same
Tick, so they agree.
"""

from __future__ import annotations

from typing import Final

from runwatch.processors.core.liveness_state import LivenessState

HOUR_NS: Final = 3600 * 1_000_000_000
ENDED_RETENTION_NS: Final = 24 * HOUR_NS
"""How long an ended run's liveness state is kept after its end (a day of log time: the web
view and the sinks show it that long)."""
SILENT_RETENTION_NS: Final = 7 * 24 * HOUR_NS
"""How long a live run's liveness state is kept with nothing of it arriving (a week)."""


def liveness_expired(state: LivenessState, now_ns: int) -> bool:
    """Whether ``state`` is past its retention at log time ``now_ns`` (module docstring).

    Rules, in order:
        1. An ended run expires `ENDED_RETENTION_NS` after its last log time (its end).
        2. A live run expires `SILENT_RETENTION_NS` after its newest RunStarted or heartbeat.
    """
    if not state.live:
        return now_ns - state.log_time_ns > ENDED_RETENTION_NS
    last_ns = max(state.last_heartbeat_ns, state.started_ns)
    return now_ns - last_ns > SILENT_RETENTION_NS


__all__ = ["ENDED_RETENTION_NS", "HOUR_NS", "SILENT_RETENTION_NS", "liveness_expired"]
