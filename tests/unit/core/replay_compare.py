"""Comparing two `Replayer`s that folded the same records two ways (a direct path on/off).

The pack path's and the loose path's tests feed random logs to a Replayer with the path
and one without, in random batches, and require the same `fingerprint` after every batch.
"""

from __future__ import annotations

import random
from typing import Any

from runwatch.processors.core.replay import Record, Replayer
from runwatch.processors.core.state_codec import encode_state
from runwatch.schemas.codec import encode


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
