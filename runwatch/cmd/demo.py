"""`runwatch demo`: the whole pipeline on the embedded broker with a real torch run."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from runwatch.errors import UsageError

HELP = "run broker, processors, sinks and a real torch run with injected faults; then audit"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `runwatch demo`."""
    parser.add_argument("--runs", type=int, default=1, help="concurrent runs (the first is faulty)")
    parser.add_argument("--steps", type=int, default=150, help="steps per run")
    parser.add_argument("--nproc", type=int, default=2, help="ranks of the faulty run")
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument("--workdir", type=Path, help="keep logs and checkpoints here")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS")


def run(args: argparse.Namespace) -> int:
    """Validate the arguments and run the demo."""
    from runwatch.demo import DemoConfig, run_demo
    from runwatch.settings import resolve_bootstrap

    if not 1 <= args.runs <= 8:
        raise UsageError("--runs must be between 1 and 8")
    if args.steps < 120:
        raise UsageError("--steps must be at least 120 (the faults are scheduled up to step 95)")
    if args.nproc < 2:
        raise UsageError("--nproc must be at least 2 (a rank is killed)")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="runwatch-demo-"))
    cfg = DemoConfig(
        runs=args.runs,
        steps=args.steps,
        nproc=args.nproc,
        bootstrap=resolve_bootstrap(args.bootstrap) if args.bootstrap else None,  # checked
        workdir=workdir.absolute(),
        timeout_s=args.timeout,
    )
    return run_demo(cfg)
