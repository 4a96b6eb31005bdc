"""The ledger of kept steps: recent rows for exact rollback, and run totals.

A step is *kept* when no later rollback dropped it: after a resume from step S every step
after S that was already seen is redone, and only the redone copy counts. The ledger keeps
one row per kept step (step, loss, grad norm, step time, tokens, MFU) for the last
``horizon`` steps, so a rollback within the horizon is exact: the rows after S leave and
their time, tokens and MFU are taken off the totals, and the baselines can be rebuilt as
they stood at S. Rows older than the horizon are sealed: their totals stay, the rows go
(the state must stay small enough to be a table value). A rollback past the horizon takes
a pro-rata share of the sealed totals off and marks the totals as estimated.

Rows are flat float tuples in fixed-size chunks, so appending copies one short chunk and
never the whole history. A full chunk is stored packed (`pack_rows`: its float64 columns
as deflated byte planes, bit-exact, NaN included), so the state a table writes is about
half the size of plain msgpack floats; only the rare paths (a rollback, rebuilding the
baselines, sealing a chunk once per ``CHUNK_ROWS`` steps) unpack one.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator
from typing import Final

import msgspec
import numpy as np

ROW: Final = 6
"""Floats per row: step, loss, grad norm, step time, tokens, MFU (NaN when absent)."""
COL_STEP: Final = 0
COL_LOSS: Final = 1
COL_GRAD: Final = 2
COL_TIME: Final = 3
COL_TOKENS: Final = 4
COL_MFU: Final = 5
CHUNK_ROWS: Final = 32
_CHUNK_LEN: Final = ROW * CHUNK_ROWS


def pack_rows(rows: tuple[float, ...]) -> bytes:
    """Flat rows as deflated byte planes of their float64 columns (bit-exact)."""
    columns = np.ascontiguousarray(np.array(rows, dtype="<f8").reshape(-1, ROW).T)
    planes = columns.view(np.uint8).reshape(-1, 8).T
    return zlib.compress(planes.tobytes(), 1)


def unpack_rows(packed: bytes) -> tuple[float, ...]:
    """The flat rows `pack_rows` packed.

    Raises:
        ValueError: Bytes that `pack_rows` did not write.
    """
    try:
        planes = np.frombuffer(zlib.decompress(packed), dtype=np.uint8)
    except zlib.error as exc:
        raise ValueError(f"a packed ledger chunk does not inflate: {exc}") from exc
    if planes.size % (8 * ROW):
        raise ValueError("a packed ledger chunk of a truncated length")
    columns = planes.reshape(8, -1).T.copy().view("<f8").reshape(ROW, -1)
    out: tuple[float, ...] = tuple(columns.T.ravel().tolist())
    return out


class Totals(msgspec.Struct, frozen=True, gc=False):
    """Sums over a set of kept steps.

    Attributes:
        steps: Steps counted.
        time_s: Their step time.
        tokens: Their tokens.
        mfu_steps: Steps with an MFU figure.
        mfu_sum: Sum of their per-step MFU.
        mfu_time_s: Step time of the steps with an MFU figure.
        mfu_time_weighted: Sum of MFU times step time over those steps.
    """

    steps: int = 0
    time_s: float = 0.0
    tokens: float = 0.0
    mfu_steps: int = 0
    mfu_sum: float = 0.0
    mfu_time_s: float = 0.0
    mfu_time_weighted: float = 0.0

    def plus_rows(self, rows: tuple[float, ...], sign: float = 1.0) -> Totals:
        """These totals with flat ``rows`` added (``sign`` 1) or taken off (``sign`` -1)."""
        steps, time_s, tokens = self.steps, self.time_s, self.tokens
        mfu_steps, mfu_sum = self.mfu_steps, self.mfu_sum
        mfu_time_s, mfu_tw = self.mfu_time_s, self.mfu_time_weighted
        count = int(sign)
        for i in range(0, len(rows), ROW):
            t = rows[i + COL_TIME]
            steps += count
            time_s += sign * t
            tokens += sign * rows[i + COL_TOKENS]
            m = rows[i + COL_MFU]
            if m == m:
                mfu_steps += count
                mfu_sum += sign * m
                mfu_time_s += sign * t
                mfu_tw += sign * m * t
        return Totals(steps, time_s, tokens, mfu_steps, mfu_sum, mfu_time_s, mfu_tw)

    def plus_row(self, step_time_s: float, tokens: float, mfu: float) -> Totals:
        """These totals with one kept step added (``mfu`` NaN when the step has none)."""
        if mfu == mfu:
            return Totals(
                self.steps + 1,
                self.time_s + step_time_s,
                self.tokens + tokens,
                self.mfu_steps + 1,
                self.mfu_sum + mfu,
                self.mfu_time_s + step_time_s,
                self.mfu_time_weighted + mfu * step_time_s,
            )
        return Totals(
            self.steps + 1,
            self.time_s + step_time_s,
            self.tokens + tokens,
            self.mfu_steps,
            self.mfu_sum,
            self.mfu_time_s,
            self.mfu_time_weighted,
        )

    def scaled(self, fraction: float) -> Totals:
        """A ``fraction`` share of these totals (counts rounded to the nearest integer)."""
        return Totals(
            round(self.steps * fraction),
            self.time_s * fraction,
            self.tokens * fraction,
            round(self.mfu_steps * fraction),
            self.mfu_sum * fraction,
            self.mfu_time_s * fraction,
            self.mfu_time_weighted * fraction,
        )

    def minus(self, other: Totals) -> Totals:
        """These totals without ``other``."""
        return Totals(
            self.steps - other.steps,
            self.time_s - other.time_s,
            self.tokens - other.tokens,
            self.mfu_steps - other.mfu_steps,
            self.mfu_sum - other.mfu_sum,
            self.mfu_time_s - other.mfu_time_s,
            self.mfu_time_weighted - other.mfu_time_weighted,
        )


class StepLedger(msgspec.Struct, frozen=True, gc=False):
    """Kept steps: recent rows plus totals over every kept step.

    Attributes:
        horizon_chunks: Sealed chunks of rows kept (the horizon, in chunks).
        chunks: Full chunks of rows, oldest first, packed (`pack_rows`).
        tail: The rows after the last full chunk.
        totals: Sums over every kept step, sealed ones included.
        sealed: Sums over kept steps whose rows left the horizon.
        sealed_last_step: Step of the newest sealed row (-1: none).
        exact: False once a rollback went past the horizon (totals estimated since).
    """

    horizon_chunks: int = 64
    chunks: tuple[bytes, ...] = ()
    tail: tuple[float, ...] = ()
    totals: Totals = Totals()
    sealed: Totals = Totals()
    sealed_last_step: int = -1
    exact: bool = True

    @classmethod
    def with_horizon(cls, history_steps: int) -> StepLedger:
        """An empty ledger that remembers at least ``history_steps`` rows."""
        return cls(horizon_chunks=max(1, math.ceil(history_steps / CHUNK_ROWS)))

    @property
    def last_step(self) -> int:
        """Step of the newest kept row, -1 when none is remembered."""
        if self.tail:
            return int(self.tail[-ROW + COL_STEP])
        if self.chunks:
            return int(unpack_rows(self.chunks[-1])[-ROW + COL_STEP])
        return self.sealed_last_step

    def append(
        self,
        step: int,
        loss: float,
        grad_norm: float,
        step_time_s: float,
        tokens: float,
        mfu: float,
    ) -> StepLedger:
        """The ledger with one more kept step (NaN for an absent grad norm or MFU)."""
        row = (float(step), loss, grad_norm, step_time_s, tokens, mfu)
        tail = self.tail + row
        chunks = self.chunks
        sealed, sealed_last = self.sealed, self.sealed_last_step
        if len(tail) == _CHUNK_LEN:
            chunks = (*chunks, pack_rows(tail))
            tail = ()
            if len(chunks) > self.horizon_chunks:
                oldest = unpack_rows(chunks[0])
                chunks = chunks[1:]
                sealed = sealed.plus_rows(oldest)
                sealed_last = int(oldest[-ROW + COL_STEP])
        totals = self.totals.plus_row(step_time_s, tokens, mfu)
        return StepLedger(
            self.horizon_chunks, chunks, tail, totals, sealed, sealed_last, self.exact
        )

    def rollback(self, step: int) -> StepLedger:
        """The ledger without kept steps after ``step``.

        Args:
            step: The step resumed from.

        Returns:
            A new ledger; exact within the horizon, pro-rata estimated past it.
        """
        chunks = list(self.chunks)
        tail = self.tail
        dropped: list[float] = []
        while True:
            if not tail:
                if not chunks:
                    break
                tail = unpack_rows(chunks.pop())
            if tail[COL_STEP] > step:
                dropped.extend(tail)
                tail = ()
                continue
            cut = len(tail)
            while cut > 0 and tail[cut - ROW + COL_STEP] > step:
                cut -= ROW
            dropped.extend(tail[cut:])
            tail = tail[:cut]
            break
        if not dropped and self.sealed_last_step <= step:
            return self
        totals = self.totals.plus_rows(tuple(dropped), -1.0)
        sealed, sealed_last, exact = self.sealed, self.sealed_last_step, self.exact
        if not chunks and not tail and sealed_last > step and sealed.steps > 0:
            share = min(1.0, (sealed_last - step) / sealed.steps)
            estimate = sealed.scaled(share)
            totals = totals.minus(estimate)
            sealed = sealed.minus(estimate)
            sealed_last, exact = step, False
        if len(tail) == _CHUNK_LEN:
            chunks.append(pack_rows(tail))
            tail = ()
        return StepLedger(
            self.horizon_chunks, tuple(chunks), tail, totals, sealed, sealed_last, exact
        )

    def _newest_first(self) -> Iterator[tuple[float, ...]]:
        yield self.tail
        for packed in reversed(self.chunks):
            yield unpack_rows(packed)

    def values_after(self, step: int, column: int, count: int) -> tuple[float, ...]:
        """A column's values at steps ``step+1 .. step+count`` (NaN where no kept row).

        Args:
            step: The step before the first one wanted.
            column: Which column.
            count: How many steps.

        Returns:
            ``count`` values, index i holding step ``step + 1 + i``.
        """
        out = [math.nan] * count
        for chunk in self._newest_first():
            for i in range(len(chunk) - ROW, -1, -ROW):
                offset = int(chunk[i + COL_STEP]) - step - 1
                if offset < 0:
                    return tuple(out)
                if offset < count:
                    out[offset] = chunk[i + column]
        return tuple(out)

    def recent(self, column: int, count: int) -> list[tuple[int, float]]:
        """The last ``count`` finite values of a column, as ``(step, value)``, oldest first."""
        out: list[tuple[int, float]] = []
        for chunk in self._newest_first():
            for i in range(len(chunk) - ROW, -1, -ROW):
                value = chunk[i + column]
                if math.isfinite(value):
                    out.append((int(chunk[i + COL_STEP]), value))
                    if len(out) == count:
                        out.reverse()
                        return out
        out.reverse()
        return out


__all__ = [
    "CHUNK_ROWS",
    "COL_GRAD",
    "COL_LOSS",
    "COL_MFU",
    "COL_STEP",
    "COL_TIME",
    "COL_TOKENS",
    "ROW",
    "StepLedger",
    "Totals",
    "pack_rows",
    "unpack_rows",
]
