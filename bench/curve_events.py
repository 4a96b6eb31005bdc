"""A recorded training curve as the steps topic would hold it, for the real-curve benches.

One curve becomes the records a producer would have written to the steps topic: a
RunStarted, one StepCompleted per recorded row (loss, grad norm, step time, tokens or
examples, skipped flag, restart marker) and a RunEnded. Around a resume (a row with a
restart marker) come a RunEnded of the old incarnation and a RunStarted of the next, as the
controller's respawn does. Log time advances one second per row, so figures do not depend
on the measured step times. `bench/real_quality.py` (the CPU corpus) and
`bench/llm_quality.py` (the LLM corpus) both replay curves through this one function, so
the two corpora are seen the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from runwatch.processors.core.replay import Record
from runwatch.schemas.events import Provenance, RunEnded, RunStarted, StepCompleted

S = 1_000_000_000
TOPIC = "real.steps"


@dataclass(frozen=True)
class Curve:
    """One recorded run, row by row (a resume redoes step numbers: rows, not steps, order it).

    Attributes:
        run_id: The run's id in the replay.
        step: Step number per row.
        loss: Loss per row (may be NaN/Inf).
        grad_norm: Grad norm before clipping per row; None when the log has none.
        step_time_s: Step wall time per row; NaN where not logged (then 1 s, the log-time
            spacing, is reported).
        count: Tokens (or examples, see ``examples``) per row.
        restart_from: The step resumed from on a resumed segment's first row, else -1.
        skipped: 1 where the optimizer skipped the update.
        world_size: Ranks in the gang (RunStarted).
        vocab_size: Vocabulary for the divergence ceiling and collapse check; None: unknown.
        examples: ``count`` counts examples (classifiers), not tokens.
    """

    run_id: str
    step: np.ndarray
    loss: np.ndarray
    grad_norm: np.ndarray | None
    step_time_s: np.ndarray
    count: np.ndarray
    restart_from: np.ndarray
    skipped: np.ndarray
    world_size: int = 1
    vocab_size: int | None = None
    examples: bool = False

    def __len__(self) -> int:
        return len(self.step)


def _step_event(curve: Curve, i: int, ts_ns: int) -> StepCompleted:
    marker = int(curve.restart_from[i])
    dt = float(curve.step_time_s[i])
    count = int(curve.count[i])
    return StepCompleted(
        run_id=curve.run_id,
        ts_ns=ts_ns,
        step=int(curve.step[i]),
        loss=float(curve.loss[i]),
        grad_norm=None if curve.grad_norm is None else float(curve.grad_norm[i]),
        step_time_s=dt if math.isfinite(dt) else 1.0,
        tokens=0 if curve.examples else count,
        examples=count if curve.examples else 0,
        skipped=bool(curve.skipped[i]),
        restart_from_step=marker if marker >= 0 else None,
    )


def curve_records(
    curve: Curve, partition: int, rows: range | None = None, *, end: bool = True
) -> tuple[list[Record], dict[int, int]]:
    """The curve's steps-topic records, and the row of each StepCompleted record's offset.

    Args:
        curve: The recorded run.
        partition: Its partition (the records' provenance).
        rows: Only these rows (offsets still count from the curve's first record, so a
            replay fed in parts equals one fed whole); None: every row.
        end: Close with a RunEnded after the last row of the curve.

    Returns:
        ``(records, row_of_offset)``.
    """
    rows = range(len(curve)) if rows is None else rows
    records: list[Record] = []
    row_of: dict[int, int] = {}
    offset = _first_offset(curve, rows.start)

    def emit(event: RunStarted | RunEnded | StepCompleted) -> None:
        nonlocal offset
        source = Provenance(topic=TOPIC, partition=partition, offset=offset)
        records.append(("steps", source, event))
        offset += 1

    incarnation = int(np.count_nonzero(curve.restart_from[: rows.start] >= 0))
    if rows.start == 0:
        emit(_started(curve, 0, 0))
    for i in rows:
        ts_ns = (i + 1) * S
        if int(curve.restart_from[i]) >= 0:
            emit(RunEnded(run_id=curve.run_id, ts_ns=ts_ns - S // 2, status="failed"))
            incarnation += 1
            emit(_started(curve, ts_ns - S // 4, incarnation))
        row_of[offset] = i
        emit(_step_event(curve, i, ts_ns))
    if end and rows.stop == len(curve):
        emit(RunEnded(run_id=curve.run_id, ts_ns=(len(curve) + 1) * S, status="completed"))
    return records, row_of


def _started(curve: Curve, ts_ns: int, incarnation: int) -> RunStarted:
    return RunStarted(
        run_id=curve.run_id,
        ts_ns=ts_ns,
        world_size=curve.world_size,
        vocab_size=curve.vocab_size,
        incarnation=incarnation,
    )


def _first_offset(curve: Curve, first_row: int) -> int:
    """Offset of the first record of ``first_row`` (RunStarted, then 1 per row, 2 per resume)."""
    if first_row == 0:
        return 0
    resumes = int(np.count_nonzero(curve.restart_from[:first_row] >= 0))
    return 1 + first_row + 2 * resumes


__all__ = ["TOPIC", "Curve", "S", "curve_records"]
