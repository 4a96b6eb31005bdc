"""The compiled kernels against their pure sources: CPU per baseline update and per event.

The window kernel under a baseline update and the step fold, and the heartbeat pack fold
(`processors.core.liveness_pack`: packs of 32 and of 128, one a step) per heartbeat.

    .venv/bin/python bench/native.py [--repeat 3] [--values 20000] [--steps 20000]
    RUNWATCH_PURE_PYTHON=1 .venv/bin/python bench/native.py      # the pure copy

Which copy runs is `runwatch.processors.core.native.ACTIVE` (printed first; ``make compiled``
builds the compiled one). Figures are CPU time (``time.thread_time``), best and worst of
``--repeat``. For exact figures run it under ``valgrind --tool=cachegrind --cache-sim=no``
with ``--repeat 1`` and ``--repeat 3``: the difference of the two totals, halved, is one
repetition's instructions without the start-up (docs/processors.md has both copies' counts).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.core import CFG, HeartbeatRun, _step_events, fold_step
from runwatch.processors.core import native
from runwatch.processors.core.baseline import RollingBaseline
from runwatch.processors.core.liveness_pack import fold_heartbeat_pack
from runwatch.processors.core.state_codec import decode_state
from runwatch.schemas.events import EventPack, Provenance


class PackRun:
    """A run's heartbeats in packs of its world, one a step, folded a record at a time."""

    def __init__(self, world: int, events: int) -> None:
        run = HeartbeatRun(world, events)
        self.stored = run.stored
        self.events = len(run.beats)
        chunks = [run.beats[i : i + world] for i in range(0, len(run.beats), world)]
        self.records = [
            (
                EventPack(run_id="r", ts_ns=max(b.ts_ns for b in chunk), events=tuple(chunk)),
                Provenance(topic="hb", partition=0, offset=1 + n),
            )
            for n, chunk in enumerate(chunks)
        ]

    def once(self) -> None:
        """Fold every pack, from the state as a processor loads it."""
        state = decode_state("liveness", self.stored)
        for pack, source in self.records:
            state = fold_heartbeat_pack(state, pack, source, CFG).state  # type: ignore[arg-type]


def spread_us(repeat: int, n: int, body: Callable[[], object]) -> tuple[float, float]:
    """(best, worst) CPU µs per item of ``body`` over ``repeat`` runs."""
    times = []
    for _ in range(repeat):
        start = time.thread_time()
        body()
        times.append(time.thread_time() - start)
    return min(times) / n * 1e6, max(times) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--values", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=20_000)
    args = parser.parse_args()
    rng = random.Random(1)
    values = [rng.gauss(0.0, 1.0) for _ in range(args.values)]

    def baseline() -> None:
        b = RollingBaseline(50, 10)
        for i, v in enumerate(values):
            b.z_score(v)
            b = b.with_value(v, i)

    state0, steps, sources = _step_events(args.steps)

    def step_fold() -> None:
        state = state0
        for event, source in zip(steps, sources[1:], strict=False):
            state, _ = fold_step(state, event, source, CFG)

    beats = HeartbeatRun(8, 2 * args.steps)
    packs = {world: PackRun(world, 8 * args.steps) for world in (32, 128)}
    gc.collect()
    gc.freeze()  # the inputs: a collection walks them otherwise, as the worker's never does
    figures = {
        "baseline_z_with_value_us": spread_us(args.repeat, len(values), baseline),
        "step_fold_us": spread_us(args.repeat, len(steps), step_fold),
        "heartbeat_fold_world8_us": spread_us(args.repeat, len(beats.beats), beats.once),
        **{
            f"pack_fold_world{world}_us": spread_us(args.repeat, run.events, run.once)
            for world, run in packs.items()
        },
    }
    print(f"active: {native.ACTIVE}")
    for name, (best, worst) in figures.items():
        print(f"{name}: best {best:.3f} worst {worst:.3f}")
    print(
        json.dumps(
            {
                "bench": "native",
                "active": native.ACTIVE,
                "compiled": native.COMPILED,
                **{k: {"best": round(b, 3), "worst": round(w, 3)} for k, (b, w) in figures.items()},
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
