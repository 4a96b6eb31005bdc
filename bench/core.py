"""Throughput of the pure reducers on one core: heartbeats/s and steps/s.

Events are built before timing; the loop only folds (the work a processor does per
record after decoding). Each figure is the best of several repetitions, since a shared
machine only ever slows a run down. Also compares the sorted-tuple median/MAD with numpy
on a 50-value window, and measures the state encoding that table writes pay.

    .venv/bin/python bench/core.py [--events 200000] [--repeat 5]

Targets: >= 200k heartbeats/s and >= 100k steps/s.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from processors.core.baseline import RollingBaseline
from processors.core.config import DetectorConfig
from processors.core.liveness import fold_liveness
from processors.core.state_codec import encode_state
from processors.core.steps import fold_step
from schemas.events import Heartbeat, ModelFlopConfig, Provenance, RunStarted, StepCompleted

S = 1_000_000_000
CFG = DetectorConfig()
GPT2 = ModelFlopConfig(n_params=124_356_864, n_layer=12, n_head=12, d_model=768, seq_len=1024)


def best_rate(n: int, repeat: int, body: Callable[[], object]) -> float:
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        body()
        best = min(best, time.perf_counter() - start)
    return n / best


def heartbeat_rate(world: int, events: int, repeat: int) -> tuple[float, int]:
    rng = random.Random(0)
    sources = [Provenance(topic="hb", partition=0, offset=i) for i in range(events + 1)]
    beats = [
        Heartbeat(
            run_id="r",
            ts_ns=s * S // 4 + r,
            rank=r,
            step=s,
            step_time_s=0.25 * (1.0 + rng.gauss(0.0, 0.02)),
        )
        for s in range(1, events // world + 1)
        for r in range(world)
    ]
    state0, _ = fold_liveness(
        None, RunStarted(run_id="r", ts_ns=0, world_size=world), sources[0], CFG
    )
    verdicts = 0

    def body() -> None:
        nonlocal verdicts
        state, verdicts = state0, 0
        for event, source in zip(beats, sources[1:], strict=False):
            state, out = fold_liveness(state, event, source, CFG)
            verdicts += len(out)

    return best_rate(len(beats), repeat, body), verdicts


def step_rate(events: int, repeat: int) -> tuple[float, int, int]:
    rng = random.Random(0)
    sources = [Provenance(topic="steps", partition=0, offset=i) for i in range(events + 1)]
    steps = [
        StepCompleted(
            run_id="r",
            ts_ns=s * S // 4,
            step=s,
            loss=2.5 + math.exp(-s / 5000) + rng.gauss(0.0, 0.02),
            grad_norm=math.exp(rng.gauss(0.0, 0.08)),
            step_time_s=0.25,
            tokens=32768,
        )
        for s in range(1, events + 1)
    ]
    started = RunStarted(
        run_id="r",
        ts_ns=0,
        world_size=8,
        flop_config=GPT2,
        peak_flops_per_s=312e12,
        vocab_size=50257,
    )
    state0, _ = fold_step(None, started, sources[0], CFG)
    final = [state0]

    def body() -> None:
        state = state0
        for event, source in zip(steps, sources[1:], strict=False):
            state, _ = fold_step(state, event, source, CFG)
        final[0] = state

    rate = best_rate(len(steps), repeat, body)
    return rate, len(encode_state(final[0])), final[0].kept_steps


def baseline_rates(repeat: int) -> tuple[float, float]:
    rng = random.Random(1)
    values = [rng.gauss(0.0, 1.0) for _ in range(20_000)]
    window = 50

    def pure() -> None:
        b = RollingBaseline(window, 10)
        for i, v in enumerate(values):
            b.z_score(v)
            b = b.with_value(v, i)

    def with_numpy() -> None:
        buf = np.empty(0)
        for v in values:
            if buf.size >= 10:
                m = np.median(buf)
                scale = 1.4826 * np.median(np.abs(buf - m))
                _ = (v - m) / scale if scale > 0 else 0.0
            buf = np.append(buf, v)[-window:]

    return best_rate(len(values), repeat, pure), best_rate(
        len(values), max(1, repeat // 2), with_numpy
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    hb8, v8 = heartbeat_rate(8, args.events, args.repeat)
    hb64, v64 = heartbeat_rate(64, args.events, args.repeat)
    steps, state_bytes, kept = step_rate(args.events // 2, args.repeat)
    pure, numpy_rate = baseline_rates(max(1, args.repeat // 2))
    print(f"heartbeats, world 8:   {hb8:>12,.0f} /s   (verdicts {v8})")
    print(f"heartbeats, world 64:  {hb64:>12,.0f} /s   (verdicts {v64})")
    print(f"steps (MFU, 2 baselines, ledger): {steps:>12,.0f} /s   (kept {kept})")
    print(
        f"baseline z+update, window 50: sorted tuples {pure:,.0f} /s vs numpy {numpy_rate:,.0f} /s "
        f"({pure / numpy_rate:.0f}x)"
    )
    print(f"step state as a table value: {state_bytes:,} bytes (msgpack)")
    ok = hb8 >= 200_000 and steps >= 100_000
    print(f"targets (>= 200k heartbeats/s, >= 100k steps/s): {'MET' if ok else 'MISSED'}")
    print(
        json.dumps(
            {
                "bench": "core",
                "python": sys.version.split()[0],
                "heartbeats_per_s_world8": round(hb8),
                "heartbeats_per_s_world64": round(hb64),
                "steps_per_s": round(steps),
                "baseline_updates_per_s": round(pure),
                "numpy_baseline_updates_per_s": round(numpy_rate),
                "step_state_bytes": state_bytes,
                "targets_met": ok,
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
