"""`runwatch replay --run RUN --set k=v`: what would other thresholds have flagged?

`runwatch replay --all --set k=v`: the same over every run of the log (or the archive), as
a fleet calibration report (`processors.calibration`): pages per 10k steps by kind, info
verdicts by kind, commands per run, and who would page, next to what was recorded live.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from runwatch.cmd.processors import add_common, detector_config, parse_overrides
from runwatch.common.errors import UsageError

if TYPE_CHECKING:
    from runwatch.processors.audit import RunLog
    from runwatch.processors.calibration import CalibrationReport

HELP = "re-run a run's events through the detectors with other settings; live topics untouched"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `runwatch replay`."""
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--run", help="run id")
    which.add_argument(
        "--all",
        action="store_true",
        help="every run of the log: a fleet calibration report (today vs these settings)",
    )
    add_common(parser)
    fleet = parser.add_argument_group("--all (fleet calibration)")
    fleet.add_argument("--json", action="store_true", help="print the report as one JSON document")
    fleet.add_argument(
        "--runs", type=int, metavar="N", help="only the N runs begun last (by log time)"
    )
    fleet.add_argument(
        "--since",
        metavar="WHEN",
        help="only runs begun at or after WHEN: an ISO time (2026-12-01T00:00Z) or an age "
        "such as 36h or 7d",
    )
    fleet.add_argument(
        "--top", type=int, default=10, metavar="N", help="runs (and pages per run) listed"
    )
    fleet.add_argument(
        "--archive",
        metavar="DIR",
        help="read the runs from a `runwatch sinks --archive DIR` archive instead of Kafka",
    )
    parser.add_argument(
        "--output-topic",
        help="also write the replayed verdicts to this topic (never a live runwatch topic)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="give up reading the log when it makes no progress this long",
    )


def run(args: argparse.Namespace) -> int:
    """Replay and print the verdicts, marking those the live run did not raise."""
    if args.all:
        return run_fleet(args)
    if args.archive or args.json or args.runs is not None or args.since:
        raise UsageError("--archive, --json, --runs and --since go with --all")
    from kafka import KafkaProducer

    from runwatch.common.gc_tuning import tune_for_throughput
    from runwatch.common.settings import kafka_client_config, topic_prefix
    from runwatch.processors.audit import load_run_log, what_if
    from runwatch.resolve import resolve_bootstrap
    from runwatch.schemas.codec import encode, encode_key
    from runwatch.schemas.events import AnomalyDetected
    from runwatch.schemas.topics import catalogue

    tune_for_throughput()  # a bulk decode and fold of the run's whole log
    cfg = detector_config(parse_overrides(args.overrides, args.shadow))
    prefix = topic_prefix(args.prefix)
    if args.output_topic and args.output_topic in {s.name for s in catalogue(prefix)}:
        raise UsageError(f"--output-topic {args.output_topic} is a live runwatch topic")
    bootstrap = resolve_bootstrap(args.bootstrap)
    log = load_run_log(bootstrap, prefix, args.run, timeout_s=args.timeout)
    if not log.inputs:
        print(f"runwatch replay: no events for run {args.run!r}", file=sys.stderr)
        return 1
    result = what_if(log, cfg)  # type: ignore[arg-type]
    live = {
        (e.kind, e.step, e.rank)
        for _, _, e in log.recorded_anomalies
        if isinstance(e, AnomalyDetected)
    }
    replayed = {(a.kind, a.step, a.rank) for a in result.anomalies}
    print(f"replay of run {args.run} with config {result.config_hash}:")
    for a in result.anomalies:
        mark = " " if (a.kind, a.step, a.rank) in live else "+"
        where = "" if a.rank is None else f" rank {a.rank}"
        print(f" {mark} step {a.step:>7} {a.kind:<22}{where}  {a.detail}")
    for kind, step, rank in sorted(live - replayed, key=lambda t: (t[1], t[0])):
        print(f" - step {step:>7} {kind:<22}{'' if rank is None else f' rank {rank}'}  (live only)")
    for c in result.commands:
        print(
            f"   command {c.action} (cause {c.cause_kind}, "
            f"max checkpoint step {c.max_checkpoint_step})"
        )
    print(
        f"{len(result.anomalies)} verdicts, {len(result.commands)} commands "
        "(+ new with these settings, - raised live only)"
    )
    dead = log.dead_letters + sum(1 for d in result.dead_letters if d.run_id == args.run)
    if dead:
        print(f"{dead} records of this run dead-lettered (not replayed)")
    if args.output_topic:
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", **kafka_client_config())
        for event in [*result.anomalies, *result.commands]:
            producer.send(args.output_topic, key=encode_key(event.run_id), value=encode(event))
        producer.flush(timeout=30)
        producer.close()
    return 0


_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_AGE_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now_s: float) -> int:
    """``--since``: an ISO time (UTC unless it says) or an age (``36h``), as log time in ns.

    Raises:
        UsageError: Neither.
    """
    age = _AGE.match(text.strip())
    if age:
        return int((now_s - float(age.group(1)) * _AGE_S[age.group(2)]) * 1e9)
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"--since expects an ISO time or an age such as 36h or 7d, got {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1e9)


def archived_logs(root: Path, explicit_prefix: str | None) -> tuple[list[RunLog], list[str]]:
    """Every archived run's log, and notes on what could not be read back."""
    from runwatch.common.settings import topic_prefix
    from runwatch.sinks.archive_read import (
        archived_prefixes,
        archived_run_ids,
        load_archived_run_log,
    )

    if not root.is_dir():
        raise UsageError(f"--archive: {root} is not a directory")
    found = archived_prefixes(root)
    prefix = topic_prefix(explicit_prefix)
    if explicit_prefix is None and prefix not in found and len(found) == 1:
        prefix = next(iter(found))
    run_ids, shortened = archived_run_ids(root)
    notes = [
        f"archive directory run_id={d}: a shortened run id, not read back (calibrate it from Kafka)"
        for d in shortened
    ]
    return [load_archived_run_log(root, prefix, r) for r in run_ids], notes


def fleet_report(
    logs: list[RunLog],
    overrides: dict[str, str],
    *,
    since_ns: int | None,
    last: int | None,
    top_n: int,
    notes: list[str],
) -> CalibrationReport:
    """The calibration report of the selected runs of ``logs`` with ``overrides`` applied."""
    from runwatch.processors.calibration import calibrate, select_runs
    from runwatch.processors.core.config import DetectorConfig, config_hash

    cfg = detector_config(overrides)
    assert isinstance(cfg, DetectorConfig)
    try:
        chosen = select_runs(logs, since_ns=since_ns, last=last)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return calibrate(chosen, cfg, config_hash(cfg), overrides=overrides, top_n=top_n, notes=notes)


def run_fleet(args: argparse.Namespace) -> int:
    """`--all`: read every run, replay each with the settings, print the fleet report."""
    from runwatch.common.gc_tuning import tune_for_throughput
    from runwatch.common.settings import topic_prefix
    from runwatch.processors.audit import load_all_run_logs
    from runwatch.processors.calibration import render_report
    from runwatch.resolve import resolve_bootstrap

    if args.output_topic:
        raise UsageError("--output-topic goes with --run")
    if args.top < 0 or args.timeout <= 0:
        raise UsageError("--top must be >= 0 and --timeout > 0")
    tune_for_throughput()  # a bulk decode and fold of the whole log
    overrides = parse_overrides(args.overrides, args.shadow)
    detector_config(overrides)  # a bad --set is a usage error before any reading
    since_ns = parse_since(args.since, time.time()) if args.since else None
    notes: list[str] = []
    if args.archive:
        logs, notes = archived_logs(Path(args.archive), args.prefix)
        if not any(log.inputs for log in logs):
            print(
                f"runwatch replay: the archive {args.archive} holds no input records "
                "(steps, heartbeats, checkpoints) to replay; calibrate from Kafka instead",
                file=sys.stderr,
            )
            return 1
    else:
        logs = load_all_run_logs(
            resolve_bootstrap(args.bootstrap), topic_prefix(args.prefix), timeout_s=args.timeout
        )
    report = fleet_report(
        logs, overrides, since_ns=since_ns, last=args.runs, top_n=args.top, notes=notes
    )
    if not report.proposed.runs:
        print("runwatch replay: no runs with input records to replay", file=sys.stderr)
        return 1
    if args.json:
        import msgspec

        print(json.dumps(msgspec.to_builtins(report)))
    else:
        print(render_report(report))
    return 0
