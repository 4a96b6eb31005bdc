"""The compiled kernel against the pure source: CPU per baseline update and per folded event.

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
    figures = {
        "baseline_z_with_value_us": spread_us(args.repeat, len(values), baseline),
        "step_fold_us": spread_us(args.repeat, len(steps), step_fold),
        "heartbeat_fold_world8_us": spread_us(args.repeat, len(beats.beats), beats.once),
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
