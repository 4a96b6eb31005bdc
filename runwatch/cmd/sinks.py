"""`runwatch sinks`: run the alerts, metrics and archive sinks in one process (threads)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from runwatch.errors import RunwatchError, UsageError

HELP = "deliver alerts, serve Prometheus metrics and archive every event (idempotent consumers)"

ENV_WEBHOOK = "RUNWATCH_ALERT_WEBHOOK"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `runwatch sinks`."""
    parser.add_argument("--alerts", action="store_true", help="console and webhook alerts")
    parser.add_argument("--metrics", action="store_true", help="Prometheus exporter")
    parser.add_argument("--archive", metavar="DIR", help="append every event to Parquet in DIR")
    parser.add_argument(
        "--webhook",
        action="append",
        default=[],
        metavar="URL",
        help=f"POST alerts to URL (repeatable; default: ${ENV_WEBHOOK}, comma-separated)",
    )
    parser.add_argument(
        "--webhook-format", choices=["runwatch", "alertmanager"], default="runwatch"
    )
    parser.add_argument("--webhook-attempts", type=int, default=5)
    parser.add_argument("--webhook-timeout-s", type=float, default=5.0)
    parser.add_argument("--webhook-backoff-s", type=float, default=0.5, help="first retry delay")
    parser.add_argument("--group-wait-s", type=float, default=2.0)
    parser.add_argument("--max-alerts-per-min", type=float, default=20.0)
    parser.add_argument(
        "--min-severity",
        choices=("info", "warning", "critical"),
        default="warning",
        help="alert verdicts of at least this severity (default: warning; info verdicts, "
        "such as a lone grad-norm spike, stay in the anomalies topic and the metrics)",
    )
    parser.add_argument("--no-console", action="store_true", help="no alert lines on stdout")
    parser.add_argument("--metrics-port", type=int, default=9464)
    parser.add_argument("--metrics-addr", default="0.0.0.0")
    parser.add_argument("--archive-flush-s", type=float, default=5.0)
    parser.add_argument(
        "--bootstrap", help="Kafka bootstrap HOST:PORT (default: RUNWATCH_BOOTSTRAP)"
    )
    parser.add_argument("--prefix", help="topic name prefix (default: runwatch)")
    parser.add_argument(
        "--group",
        metavar="PREFIX",
        help="consumer group prefix; groups are PREFIX-alerts, -metrics, -archive "
        "(default: <topic prefix>-sinks)",
    )
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="alert delivery log (default: $RUNWATCH_HOME/sinks)",
    )


def _validate(args: argparse.Namespace, webhooks: list[str]) -> None:
    if not (args.alerts or args.metrics or args.archive):
        raise UsageError("choose at least one sink: --alerts, --metrics or --archive DIR")
    if webhooks and not args.alerts:
        raise UsageError("--webhook needs --alerts")
    for url in webhooks:
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--webhook expects an http(s) URL, got {url!r}")
    if args.webhook_attempts < 1 or min(args.webhook_timeout_s, args.max_alerts_per_min) <= 0:
        raise UsageError(
            "--webhook-attempts, --webhook-timeout-s and --max-alerts-per-min must be > 0"
        )
    if min(args.group_wait_s, args.webhook_backoff_s, args.archive_flush_s) < 0:
        raise UsageError("--group-wait-s, --webhook-backoff-s and --archive-flush-s must be >= 0")
    if not 0 <= args.metrics_port <= 65535:
        raise UsageError(f"--metrics-port must be 0..65535, got {args.metrics_port}")


def _webhooks(args: argparse.Namespace) -> list[str]:
    if args.webhook:
        return list(args.webhook)
    env = os.environ.get(ENV_WEBHOOK, "") if args.alerts else ""
    return [u.strip() for u in env.split(",") if u.strip()]


def build_sinks(args: argparse.Namespace, topics: Any, webhooks: list[str]) -> list[Any]:
    """The selected sinks, configured from ``args``."""
    from runwatch.settings import runwatch_home
    from sinks.alert_log import DeliveryLog
    from sinks.alerts import AlertSettings, AlertSink
    from sinks.archive import ArchiveSink
    from sinks.metrics import MetricsSink
    from sinks.webhook import RetryPolicy

    out: list[Any] = []
    if args.alerts:
        state_dir = Path(args.state_dir) if args.state_dir else runwatch_home() / "sinks"
        settings = AlertSettings(
            webhooks=tuple(webhooks),
            webhook_format=args.webhook_format,
            group_wait_s=args.group_wait_s,
            max_alerts_per_min=args.max_alerts_per_min,
            retry=RetryPolicy(
                attempts=args.webhook_attempts,
                base_delay_s=args.webhook_backoff_s,
                timeout_s=args.webhook_timeout_s,
            ),
            console=not args.no_console,
            min_severity=args.min_severity,
        )
        group = args.group_prefix
        log = DeliveryLog(state_dir / f"{group}-alerts.jsonl")
        out.append(AlertSink(settings, topics, log))
    if args.metrics:
        out.append(MetricsSink(topics))
    if args.archive:
        out.append(ArchiveSink(Path(args.archive), flush_interval_s=args.archive_flush_s))
    return out


def run(args: argparse.Namespace) -> int:
    """Start every selected sink in its own thread; stop on SIGINT or SIGTERM."""
    from runwatch.settings import kafka_client_config, resolve_bootstrap, topic_prefix
    from schemas.topics import names
    from sinks.consumer import SinkLoop, start_thread

    webhooks = _webhooks(args)
    _validate(args, webhooks)
    bootstrap = resolve_bootstrap(args.bootstrap)
    prefix = topic_prefix(args.prefix)
    topics = names(prefix)
    args.group_prefix = args.group or f"{prefix}-sinks"
    sinks = build_sinks(args, topics, webhooks)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    loops = []
    for sink in sinks:
        if sink.name == "metrics":
            port = sink.serve(args.metrics_port, args.metrics_addr)
            url = f"http://{args.metrics_addr}:{port}/metrics"
            print(f"runwatch sinks: metrics on {url}", file=sys.stderr, flush=True)
        all_topics = [getattr(topics, f) for f in topics.__struct_fields__]
        loop = SinkLoop(
            sink,
            bootstrap=bootstrap,
            topics=getattr(sink, "topics", all_topics),
            group_id=f"{args.group_prefix}-{sink.name}",
            stop=stop,
            client_config=kafka_client_config(),
        )
        loops.append((loop, start_thread(loop)))
        print(f"runwatch sinks: {sink.name} (group {loop.group_id})", file=sys.stderr, flush=True)
    try:
        while not stop.wait(0.5):
            if any(not t.is_alive() for _, t in loops):
                stop.set()
    finally:
        stop.set()
        for _, thread in loops:
            thread.join(timeout=60)
        for sink in sinks:
            if hasattr(sink, "close"):
                sink.close()
    failed = [loop for loop, _ in loops if loop.error is not None]
    if failed:
        raise RunwatchError(
            "; ".join(f"{loop.sink.name} sink failed: {loop.error}" for loop in failed)
        )
    return 0
