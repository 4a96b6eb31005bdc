"""Print what the core decides on fixed inputs, for `test_native` to compare copy against copy.

    RUNWATCH_PURE_PYTHON=1 python -m tests.unit.core.native_verdicts

The first line is `processors.core.native.ACTIVE`; the rest must be byte-identical whichever
copy of the compiled modules runs: the window kernel's floats (``float.hex``) on random,
quantised, constant and even/odd windows (and the straggler judge's median of the others,
`straggler_buckets.median_without`, on the same), the step fold's verdicts (msgpack, hex) and
final state (`encode_state`) on noisy curves with spikes, flat stretches and quantised
losses, and everything a `Replayer` on the heartbeat pack path holds (verdicts, dead
letters, states, evictions: `replay_compare.fingerprint`) after random heartbeats logs
(`pack_logs`) and a healthy 32-rank gang with a straggler and a rank that goes silent,
and after loose heartbeats of five runs interleaved in one partition (a batch's queued
per run and folded at once: `test_loose_path.interleaved_records`).
"""

from __future__ import annotations

import hashlib
import json
import math
import random

from runwatch.processors.core import native
from runwatch.processors.core.baseline import RollingBaseline
from runwatch.processors.core.config import DetectorConfig
from runwatch.processors.core.replay import Record, Replayer
from runwatch.processors.core.state_codec import encode_state
from runwatch.processors.core.steps import fold_step
from runwatch.processors.core.straggler_buckets import median_without
from runwatch.processors.core.window import (
    mad_lower_bound,
    mad_of_sorted,
    median_of_sorted,
    robust_scale,
)
from runwatch.schemas.codec import encode
from runwatch.schemas.events import Provenance, RunStarted, StepCompleted
from tests.unit.core.factories import hb, started
from tests.unit.core.pack_logs import CFG, MOST, at, make_records, pack
from tests.unit.core.replay_compare import batches, fingerprint
from tests.unit.core.test_loose_path import CFG as LOOSE_CFG
from tests.unit.core.test_loose_path import interleaved_records

S = 1_000_000_000


def kernel_lines(rng: random.Random) -> list[str]:
    """The kernel's outputs on windows of every shape it branches on."""
    lines = []
    for n in (1, 2, 3, 4, 5, 8, 49, 50, 51):
        for shape in ("gauss", "quantised", "constant", "zero"):
            if shape == "gauss":
                xs = sorted(rng.gauss(0.0, 1.0) for _ in range(n))
            elif shape == "quantised":
                xs = sorted(float(rng.choice((1.0, 1.0, 1.0, 2.5))) for _ in range(n))
            else:
                xs = [3.25 if shape == "constant" else 0.0] * n
            m = median_of_sorted(xs)
            out = (m, mad_of_sorted(xs, m), mad_lower_bound(xs, m), robust_scale(xs, m, 1e-3))
            lines.append(f"{n} {shape} " + " ".join(x.hex() for x in out))
            if n > 1:  # the straggler judge's peers' median, each rank left out in turn
                peers = (median_without(xs, i).hex() for i in range(n))
                lines.append(f"{n} {shape} without " + " ".join(peers))
    base = RollingBaseline(50, 10)
    for i in range(400):
        value = rng.gauss(0.0, 1.0) if i % 7 else rng.choice((0.5, 0.5, 9.0))
        z = base.z_score(value)
        lines.append("z " + ("none" if z is None else z.hex()))
        base = base.with_value(value, i)
    lines.append("rollback " + repr(base.rollback(300).state()))
    return lines


def curve(rng: random.Random, n: int) -> list[tuple[float, float]]:
    """(loss, grad norm) with spikes, a flat stretch and a quantised stretch."""
    out = []
    for i in range(n):
        loss = 2.0 + math.exp(-i / 300) + rng.gauss(0.0, 0.03)
        grad = math.exp(rng.gauss(0.0, 0.1))
        if i % 97 == 50:
            loss, grad = loss * 3.0, grad * 40.0
        if 400 <= i < 480:
            loss = 2.0
        if 600 <= i < 700:
            loss = round(loss, 1)
        out.append((loss, grad))
    return out


def fold_lines(rng: random.Random) -> list[str]:
    """The step fold's verdicts and final state on three curves."""
    lines = []
    cfg = DetectorConfig()
    for run in range(3):
        state = None
        events: list[RunStarted | StepCompleted] = [
            RunStarted(run_id=f"r{run}", ts_ns=0, world_size=1)
        ]
        events += [
            StepCompleted(
                run_id=f"r{run}",
                ts_ns=(i + 1) * S,
                step=i + 1,
                loss=x,
                grad_norm=g,
                step_time_s=1.0,
            )
            for i, (x, g) in enumerate(curve(rng, 1200))
        ]
        for offset, event in enumerate(events):
            source = Provenance(topic="t", partition=0, offset=offset)
            state, verdicts = fold_step(state, event, source, cfg)
            lines += [f"verdict {encode(v).hex()}" for v in verdicts]
        assert state is not None
        lines.append(f"state {hashlib.sha256(encode_state(state)).hexdigest()}")
    return lines


def pack_lines() -> list[str]:
    """The pack path's outcome on random logs and on a healthy gang (module docstring)."""
    logs = [batches(make_records(seed, 120), seed, MOST) for seed in range(30)]
    rng = random.Random(5)
    gang: list[Record] = [("heartbeats", at(0), started(world_size=32))]  # type: ignore[list-item]
    for n in range(1, 60):
        beats = [
            hb(r, n, n * S + rng.randrange(S // 10), dt=(0.9 if r == 3 else 0.25) + rng.random() / 100)
            for r in range(32)
            if n < 45 or r != 7  # rank 3 is slow throughout, rank 7 goes silent
        ]  # fmt: skip
        gang.append(("heartbeats", at(n), pack(beats)))  # type: ignore[arg-type]
    logs.append([gang[:20], gang[20:]])
    return [replayed("pack", Replayer(CFG, pack_path=True), feeds) for feeds in logs]


def loose_lines() -> list[str]:
    """The loose path's outcome on interleaved runs' heartbeats (module docstring)."""
    return [
        replayed(
            "loose",
            Replayer(LOOSE_CFG, loose_path=True),
            batches(interleaved_records(seed, 300), seed, 4 * MOST),
        )
        for seed in range(20)
    ]


def replayed(label: str, replayer: Replayer, feeds: list[list[Record]]) -> str:
    """One line for ``replayer`` after ``feeds``: counts, verdict kinds, a digest of all."""
    for batch in feeds:
        replayer.feed(batch)
    kinds = ",".join(sorted({v.kind for _, v in replayer.recomputed}))
    digest = hashlib.sha256(repr(fingerprint(replayer)).encode()).hexdigest()
    return f"{label} {len(replayer.recomputed)} [{kinds}] {len(replayer.dead_letters)} {digest}"


def main() -> None:
    """Print the active copies, then the outputs."""
    rng = random.Random(23)
    print(json.dumps(native.ACTIVE, sort_keys=True))
    for line in kernel_lines(rng) + fold_lines(rng) + pack_lines() + loose_lines():
        print(line)


if __name__ == "__main__":
    main()
