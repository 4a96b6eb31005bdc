"""Comparing two `Replayer`s that folded the same records two ways (a direct path on/off).

The pack path's and the loose path's tests feed random logs to a Replayer with the path
and one without, in random batches, and require the same `fingerprint` after every batch.
Their logs' clocks and steps drift by `drift_clock` and `drift_step`.
"""

from __future__ import annotations

import random
from typing import Any

from runwatch.processors.core.bounds import MAX_STEP, MAX_STEP_JUMP
from runwatch.processors.core.replay import Record, Replayer
from runwatch.processors.core.state_codec import encode_state
from runwatch.schemas.codec import encode
from tests.unit.core.factories import S


def batches(records: list[Record], seed: int, most: int) -> list[list[Record]]:
    """``records`` cut into consecutive batches of 1 to ``most`` records, by ``seed``."""
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(records):
        n = rng.randint(1, most)
        out.append(records[i : i + n])
        i += n
    return out


def fingerprint(replayer: Replayer) -> dict[str, Any]:
    """Everything a Replayer holds that a caller reads, as comparable bytes and values."""
    return {
        "recomputed": [(key, encode(v)) for key, v in replayer.recomputed],
        "dead": [encode(d) for d in replayer.dead_letters],
        "liveness": {run: encode_state(s) for run, s in sorted(replayer.liveness.items())},
        "steps": {run: encode_state(s) for run, s in sorted(replayer.steps.items())},
        "encoded": {k: dict(sorted(v.items())) for k, v in replayer.encoded.items()},
        "evicted": {k: sorted(v) for k, v in replayer.evicted.items()},
        "members": {k: {p: sorted(r) for p, r in v.items()} for k, v in replayer.members.items()},
        "partition_runs": {p: sorted(r) for p, r in replayer.partition_runs.items()},
    }


def drift_clock(
    rng: random.Random, ts_ns: int, jump_below: float, jumps_ns: tuple[int, ...]
) -> int:
    """A random log's next time: 5 % back 1-10 s, up to ``jump_below`` a jump, else on.

    The jumps (``jumps_ns``) are past a retention; the result may be negative (callers
    clamp what they report, not what they keep).
    """
    r = rng.random()
    if r < 0.05:
        return ts_ns - rng.randint(1, 10) * S  # time going backwards
    if r < jump_below:
        return ts_ns + rng.choice(jumps_ns)
    return ts_ns + rng.randint(0, S // 2)


def drift_step(rng: random.Random, newest: int, advance: float, behind: float) -> tuple[int, int]:
    """``(newest, reported)``: a run's newest step, and the step an event reports.

    The newest advances with probability ``advance``; the reported one is sometimes 0-6
    behind it (probability ``behind``), 2 % past `MAX_STEP`, 2 % a jump past
    `MAX_STEP_JUMP`, and never negative.
    """
    if rng.random() < advance:
        newest += 1
    reported = newest - (rng.randint(0, 6) if rng.random() < behind else 0)
    r = rng.random()
    if r < 0.02:
        reported = MAX_STEP + rng.randint(0, 3)  # past the bound
    elif r < 0.04:
        reported = newest + MAX_STEP_JUMP + rng.randint(1, 3)  # a jump past it
    return newest, max(reported, 0)
