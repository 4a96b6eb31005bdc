"""How long the fleet calibration fold takes: `processors.calibration.calibrate` in process.

`runwatch replay --all` and the web view's ``/api/calibration`` replay every run and fold
the outcomes into fleet figures. This measures that part alone (the Kafka read and decode
are `bench/audit.py`'s), over synthetic runs of rank 0's steps: a noisy, slowly falling
loss with a planted spike every 500 steps, so the report has pages to list. It prints
figures, then one JSON line.

    python bench/calibration.py [--runs 200] [--steps 2000] [--repeats 3]
"""

from __future__ import annotations

import sys

# Run as a script, this file's directory comes first on sys.path, and bench/processors.py
# would shadow the `processors` package the fold lives in.
if sys.path and sys.path[0] == __import__("os").path.dirname(__file__):
    sys.path.pop(0)

import argparse
import json
import random
import time

import msgspec

from runwatch.processors.calibration import calibrate
from runwatch.processors.core.config import DetectorConfig, config_hash
from runwatch.processors.core.replay import Record
from runwatch.schemas.events import Provenance, RestartRequested, RunStarted, StepCompleted
from runwatch.schemas.topics import TopicRole

S = 1_000_000_000
SPIKE_EVERY = 500


class Log(msgspec.Struct, frozen=True):
    """One run's log as `calibrate` reads it."""

    run_id: str
    inputs: list[Record]
    recorded_anomalies: list[Record] = []
    recorded_commands: list[RestartRequested] = []


def run_log(run_id: str, steps: int, seed: int) -> Log:
    """A run of ``steps`` steps with a loss spike every `SPIKE_EVERY` steps."""
    rng = random.Random(seed)
    src = Provenance(topic="bench.steps", partition=0, offset=0)
    records: list[Record] = [
        (TopicRole.STEPS, src, RunStarted(run_id=run_id, ts_ns=0, world_size=8))
    ]
    for n in range(steps):
        loss = 4.0 * (1 - n / (4 * steps)) + rng.gauss(0, 0.02)
        if n and n % SPIKE_EVERY == 0:
            loss += 1.0
        event = StepCompleted(
            run_id=run_id,
            ts_ns=(n + 1) * S,
            step=n,
            loss=loss,
            grad_norm=1.0 + rng.gauss(0, 0.05),
            step_time_s=1.0,
        )
        records.append(
            (TopicRole.STEPS, Provenance(topic="bench.steps", partition=0, offset=n + 1), event)
        )
    return Log(run_id=run_id, inputs=records)


def main() -> int:
    """Time the fold over a synthetic fleet; print figures and one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    logs = [run_log(f"run-{i:04d}", args.steps, i) for i in range(args.runs)]
    cfg = DetectorConfig()
    times = []
    report = None
    for _ in range(args.repeats):
        began = time.perf_counter()
        report = calibrate(logs, cfg, config_hash(cfg), overrides={})
        times.append(time.perf_counter() - began)
    assert report is not None
    steps = args.runs * args.steps
    worst = max(times)
    print(
        f"calibrate: {args.runs} runs x {args.steps} steps = {steps} steps; "
        f"worst of {args.repeats}: {worst:.2f} s ({steps / worst:,.0f} steps/s), "
        f"best {min(times):.2f} s; {report.proposed.pages} pages "
        f"({report.proposed.pages_per_10k_steps:.2f} per 10k steps)"
    )
    print(
        json.dumps(
            {
                "bench": "calibration",
                "runs": args.runs,
                "steps": steps,
                "worst_s": round(worst, 3),
                "best_s": round(min(times), 3),
                "steps_per_s_worst": round(steps / worst),
                "pages": report.proposed.pages,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
