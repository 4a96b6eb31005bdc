"""Exit evidence: a rank process that ended badly is the incarnation's culprit.

Its state: ``exit_rank`` (the culprit of the current incarnation, -1: none). A
`schemas.events.RankExited` of the current incarnation with a non-zero exit code, a
signal or an unknown status raises ``dead_rank`` for that rank at once, naming the rank,
host, pid, exit status and, when the rank's ``@record`` entry point left one, its root
cause. Afterwards the scans and the hang check raise nothing more for the incarnation
(`processors.core.detectors.rank_scans` reads ``exit_rank``). A signal after the rank told
its agent its training finished (``RankExited.finished``) is a clean exit: the
interpreter's teardown, not a fault. It folds no heartbeat.
"""

from __future__ import annotations

from typing import Final

import msgspec

from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.detectors.base import LivenessDetector
from runwatch.processors.core.detectors.rank_scans import verdict_step
from runwatch.processors.core.liveness_scans import Verdicts
from runwatch.processors.core.liveness_state import LivenessState
from runwatch.processors.core.rank_table import NEVER
from runwatch.schemas.events import AnomalyDetected, Provenance, RankExited

SIGNAL_NAMES: Final[dict[int, str]] = {
    1: "SIGHUP",
    2: "SIGINT",
    3: "SIGQUIT",
    4: "SIGILL",
    6: "SIGABRT",
    7: "SIGBUS",
    8: "SIGFPE",
    9: "SIGKILL",
    11: "SIGSEGV",
    13: "SIGPIPE",
    15: "SIGTERM",
}
"""Linux signal names for verdict details (a fixed table: replay on any OS says the same)."""


def exit_status(event: RankExited) -> str:
    """How the rank ended, in words: ``exit code 1``, ``signal 9 (SIGKILL)``, ``unknown``."""
    if event.signal is not None:
        name = SIGNAL_NAMES.get(event.signal)
        return f"signal {event.signal}" + (f" ({name})" if name else "")
    if event.exit_code is not None:
        return f"exit code {event.exit_code}"
    return "unknown exit status"


def _emit_exit(state: LivenessState, event: RankExited, last: int, out: Verdicts) -> None:
    """The culprit's ``dead_rank`` verdict (value: the status as a shell reports it)."""
    where = f"after step {last}" if last != NEVER else "before its first report"
    host = f" on {event.host}" if event.host else ""
    pid = f", pid {event.pid}" if event.pid else ""
    code = event.exit_code if event.signal is None else 128 + event.signal
    cause = f"; root cause: {event.root_cause}" if event.root_cause else ""
    out.emit(
        "dead_rank",
        verdict_step(state),
        event.rank,
        float(code) if code is not None else -1.0,
        0.0,
        f"rank {event.rank}{host} exited ({exit_status(event)}{pid}) {where}; "
        f"its peers are blocked on it{cause}",
    )


def on_rank_exited(
    state: LivenessState, event: RankExited, source: Provenance, cfg: DetectorConfig
) -> tuple[LivenessState, list[AnomalyDetected]]:
    """A rank process ended.

    Rule 1: while the run is suspended, for another incarnation, or once the
    incarnation's culprit is named, only log time advances.
    Rule 2: the rank is flagged not live (a clean exit too: it is not reported silent
    while its peers finish).
    Rule 3: a non-zero code, a signal or an unknown status names the culprit, and raises
    ``dead_rank`` unless a scan had already flagged the rank dead; not after the rank
    had finished its training (``finished``: its teardown aborted, as a clean exit).
    Rule 4: the verdict carries the state's launch, else the evidence's (`RankExited.launch_id`).
    """
    now_ns = max(state.log_time_ns, event.ts_ns)
    if not state.live or event.incarnation != state.incarnation or state.exit_rank >= 0:
        return msgspec.structs.replace(
            state, last_offset=source.offset, last_index=source.index, log_time_ns=now_ns
        ), []
    clean = event.finished or (event.exit_code == 0 and event.signal is None)  # rule 3
    table, data, journal = state.table.begin()
    rank = event.rank
    steps = data.steps
    if rank >= len(steps):
        for _ in range(rank + 1 - len(steps)):
            journal.push(steps, NEVER)
            journal.push(data.ts, 0)
    already = rank in data.dead
    journal.put(data.dead, rank, None)
    # Rule 4: a run whose RunStarted is not read yet (a rank killed in its first steps)
    # takes the verdict's launch from the agent's evidence, so the command it causes is
    # bound to the launch the agent runs (a RunStarted read later still sets the state's).
    bound = state
    if not state.launch_id and event.launch_id:
        bound = msgspec.structs.replace(state, launch_id=event.launch_id)
    out = Verdicts(bound, event.ts_ns, source, cfg)
    exit_rank = state.exit_rank
    if not clean:
        exit_rank = rank
        if not already:
            _emit_exit(state, event, steps[rank], out)
    return msgspec.structs.replace(
        state,
        last_offset=source.offset,
        last_index=source.index,
        log_time_ns=now_ns,
        table=table,
        dead_count=len(data.dead),
        exit_rank=exit_rank,
        raised=out.raised(),
        anomaly_counts=out.counts() if out.out else state.anomaly_counts,
    ), out.out


EXIT_EVIDENCE = LivenessDetector(
    "exit_evidence", ("exit_rank",), events=((RankExited, on_rank_exited),)
)
"""The exit evidence detector."""

__all__ = ["EXIT_EVIDENCE", "SIGNAL_NAMES", "exit_status", "on_rank_exited"]
