"""`runwatch demo`: the whole pipeline on the embedded broker with a real torch run."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from runwatch.common.errors import UsageError

HELP = "run broker, processors, sinks and a real torch run with injected faults; then audit"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `runwatch demo`."""
    parser.add_argument("--runs", type=int, default=1, help="concurrent runs (the first is faulty)")
    parser.add_argument("--steps", type=int, default=150, help="steps per run")
    parser.add_argument("--nproc", type=int, default=2, help="ranks of the faulty run")
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument("--workdir", type=Path, help="keep logs and checkpoints here")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS")
    parser.add_argument(
        "--ui-port",
        type=int,
        default=8470,
        help="port of the web view (default: 8470, any free port when taken; 0: any)",
    )
    parser.add_argument(
        "--no-ui", action="store_true", help="do not serve the web view during the demo"
    )
    parser.add_argument(
        "--keep-ui",
        action="store_true",
        help="keep the web view (and the broker and processors) up after the demo until Ctrl-C",
    )


def run(args: argparse.Namespace) -> int:
    """Validate the arguments and run the demo."""
    from runwatch.demo import DemoConfig, run_demo
    from runwatch.resolve import resolve_bootstrap

    if not 1 <= args.runs <= 8:
        raise UsageError("--runs must be between 1 and 8")
    if args.steps < 120:
        raise UsageError("--steps must be at least 120 (the faults are scheduled up to step 95)")
    if args.nproc < 2:
        raise UsageError("--nproc must be at least 2 (a rank is killed)")
    if args.keep_ui and args.no_ui:
        raise UsageError("--keep-ui and --no-ui contradict each other")
    if not 0 <= args.ui_port <= 65535:
        raise UsageError(f"--ui-port must be between 0 and 65535, got {args.ui_port}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="runwatch-demo-"))
    cfg = DemoConfig(
        runs=args.runs,
        steps=args.steps,
        nproc=args.nproc,
        bootstrap=resolve_bootstrap(args.bootstrap) if args.bootstrap else None,  # checked
        workdir=workdir.absolute(),
        timeout_s=args.timeout,
        ui_port=None if args.no_ui else args.ui_port,
        keep_ui=args.keep_ui,
    )
    return run_demo(cfg)
