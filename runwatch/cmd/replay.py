"""`runwatch replay --run RUN --set k=v`: what would other thresholds have flagged?

``runwatch replay --report [--set k=v] [--shadow KINDS]``: the fleet calibration report,
every run of the prefix's history replayed with those settings: pages per 10k steps by
kind, commands per run, and the runs and steps that would page.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from runwatch.cmd.processors import add_common, detector_config, parse_overrides
from runwatch.common.errors import UsageError

if TYPE_CHECKING:
    from runwatch.processors.core.config import DetectorConfig

HELP = "re-run a run's events through the detectors with other settings; live topics untouched"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `runwatch replay`."""
    parser.add_argument("--run", default=None, help="run id (required without --report)")
    parser.add_argument(
        "--report",
        action="store_true",
        help="replay every run of the prefix and print the fleet calibration report "
        "(pages per 10k steps by kind, commands per run, the runs and steps that would page)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="with --report: print the report as one JSON object",
    )
    add_common(parser)
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
    if args.report:
        return report(resolve_bootstrap(args.bootstrap), prefix, cfg, args)  # type: ignore[arg-type]
    if args.run is None:
        raise UsageError("--run is required (or --report for every run of the prefix)")
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


MAX_PAGES_LISTED = 200
"""The report lists at most this many would-be pages (the JSON has them all)."""


def report(bootstrap: str, prefix: str, cfg: DetectorConfig, args: argparse.Namespace) -> int:
    """Print the fleet calibration report of every run of ``prefix``."""
    import msgspec

    from runwatch.processors.audit import load_fleet_logs, what_if
    from runwatch.processors.core.calibration import fleet_report
    from runwatch.processors.core.config import config_hash

    logs = load_fleet_logs(bootstrap, prefix, timeout_s=args.timeout)
    fleet = fleet_report(
        config_hash(cfg), [(log.run_id, what_if(log, cfg)) for log in logs if log.inputs]
    )
    if args.json:
        print(msgspec.json.encode(fleet).decode())
        return 0
    print(
        f"fleet calibration report of prefix {prefix} with config {fleet.config_hash}: "
        f"{len(fleet.runs)} runs, {fleet.steps} steps"
    )
    for label, counts in (("pages", fleet.pages_by_kind), ("info", fleet.info_by_kind)):
        rates = fleet.per_10k_steps(counts)
        shown = ", ".join(f"{k} {n} ({rates.get(k, 0.0):g}/10k)" for k, n in counts.items())
        print(f"  {label} by kind: {shown or 'none'}")
    print(f"  commands per run: {fleet.commands_per_run():.2f}")
    for r in fleet.runs:
        shadow = f", {r.shadow_commands} shadow" if r.shadow_commands else ""
        print(
            f"  run {r.run_id}: {r.steps} steps, {r.pages} pages, {r.info} info, "
            f"{r.commands} commands{shadow}"
        )
    for page in fleet.pages[:MAX_PAGES_LISTED]:
        mark = " (shadow)" if page.shadow else ""
        print(
            f"  would page: {page.run_id} step {page.step} {page.kind} "
            f"[{page.severity}]{mark}: {page.detail}"
        )
    if len(fleet.pages) > MAX_PAGES_LISTED:
        print(f"  ... and {len(fleet.pages) - MAX_PAGES_LISTED} more (--json lists them all)")
    return 0
