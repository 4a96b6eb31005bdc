"""`runwatch sinks`: run the alerts, metrics and archive sinks in one process (threads)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runwatch.common.errors import RunwatchError, UsageError
from runwatch.sinks.settings import ENV_ALERTMANAGER, ENV_WEBHOOK, SinkEnv

HELP = "deliver alerts, serve Prometheus metrics and archive every event (idempotent consumers)"


WEBHOOK_FORMAT_GONE = (
    "--webhook-format alertmanager is gone: it posted the payload Alertmanager sends to its "
    "receivers, which Alertmanager's own API refuses (HTTP 400); post to Alertmanager with "
    "--alertmanager URL (its API v2), or to a webhook with --webhook-format runwatch"
)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `runwatch sinks` (every flag says its default)."""
    add = parser.add_argument
    sinks = parser.add_argument_group("sinks (choose at least one)")
    sinks.add_argument("--alerts", action="store_true", help="console and webhook alerts")
    sinks.add_argument("--metrics", action="store_true", help="Prometheus exporter")
    sinks.add_argument("--archive", metavar="DIR", help="append every event to Parquet in DIR")
    sinks.add_argument(
        "--alertmanager",
        action="append",
        default=[],
        metavar="URL",
        help="keep alert conditions current in the Alertmanager at URL (its API v2; "
        "repeatable: every member of a cluster gets every alert; default: "
        f"${ENV_ALERTMANAGER}, comma-separated)",
    )

    _alert_args(parser)
    _alertmanager_args(parser)
    _metrics_args(parser)
    _archive_args(parser)

    add("--bootstrap", help="Kafka bootstrap HOST:PORT (default: $RUNWATCH_BOOTSTRAP)")
    add("--prefix", help="topic name prefix (default: runwatch)")
    add(
        "--group",
        metavar="PREFIX",
        help="consumer group prefix; groups are PREFIX-alerts, -metrics, -archive and "
        "-alertmanager-<host>-<pid> (default: <topic prefix>-sinks)",
    )
    add(
        "--session-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="a sinks process silent this long (killed) loses its partitions, so its "
        "replacement waits at most this long for them; the broker allows 6 s at least "
        "(default: %(default)s)",
    )


def _alert_args(parser: argparse.ArgumentParser) -> None:
    """Flags of the console and webhook alerts (and their delivery, shared)."""
    alerts = parser.add_argument_group("alerts")
    alerts.add_argument(
        "--webhook",
        action="append",
        default=[],
        metavar="URL",
        help=f"POST alerts to URL (repeatable; default: ${ENV_WEBHOOK}, comma-separated)",
    )
    alerts.add_argument(
        "--webhook-format",
        choices=["runwatch", "alertmanager"],
        default="runwatch",
        help="payload: runwatch's own JSON; 'alertmanager' is gone (use --alertmanager URL) "
        "(default: %(default)s)",
    )
    alerts.add_argument(
        "--webhook-attempts",
        type=int,
        default=5,
        metavar="N",
        help="requests per POST before it is kept pending and retried later (default: %(default)s)",
    )
    alerts.add_argument(
        "--webhook-timeout-s",
        type=float,
        default=5.0,
        metavar="S",
        help="timeout of one request (default: %(default)s)",
    )
    alerts.add_argument(
        "--webhook-backoff-s",
        type=float,
        default=0.5,
        metavar="S",
        help="first retry delay; doubles per retry, at most 8 s within a POST and "
        "--pending-max-delay-s between tries of a pending one (default: %(default)s)",
    )
    alerts.add_argument(
        "--pending-max-delay-s",
        type=float,
        default=60.0,
        metavar="S",
        help="longest wait between tries of a delivery a receiver (webhook or "
        "Alertmanager) still owes (default: %(default)s)",
    )
    _alert_policy_args(alerts)


def _alert_policy_args(alerts: argparse._ArgumentGroup) -> None:
    """Flags of which alerts go out and when: grouping, causes, rate, severity, state."""
    alerts.add_argument(
        "--group-wait-s",
        type=float,
        default=2.0,
        metavar="S",
        help="a run's first alert waits this long for others to share its POST; a new "
        "Alertmanager alert waits this long for its labels to settle (default: %(default)s)",
    )
    alerts.add_argument(
        "--cause-wait-s",
        type=float,
        default=5.0,
        metavar="S",
        help="longest a command alert waits for the verdict that caused it (default: %(default)s)",
    )
    alerts.add_argument(
        "--max-alerts-per-min",
        type=float,
        default=20.0,
        metavar="N",
        help="per-run rate limit and burst; the rest are counted (default: %(default)s)",
    )
    alerts.add_argument(
        "--min-severity",
        choices=("info", "warning", "critical"),
        default="warning",
        help="alert verdicts of at least this severity (webhooks, console and "
        "Alertmanager); info verdicts, such as a lone grad-norm spike, stay in the anomalies "
        "topic and the metrics (default: %(default)s)",
    )
    alerts.add_argument("--no-console", action="store_true", help="no alert lines on stdout")
    alerts.add_argument(
        "--from-beginning",
        action="store_true",
        help="a new --group alerts on the whole retained anomalies history "
        "(default: a new group starts from now)",
    )
    alerts.add_argument(
        "--state-dir",
        metavar="DIR",
        help="alert delivery log, pending deliveries included (default: $RUNWATCH_HOME/sinks)",
    )


def _alertmanager_args(parser: argparse.ArgumentParser) -> None:
    """Flags of the Alertmanager sink."""
    am = parser.add_argument_group("alertmanager")
    am.add_argument(
        "--alertmanager-resend-s",
        type=float,
        default=60.0,
        metavar="S",
        help="post firing alerts again this often, each with endsAt 4 re-sends ahead "
        "(Alertmanager's resolve_timeout is 5 min by default) (default: %(default)s)",
    )
    am.add_argument(
        "--ui-url",
        metavar="URL",
        help="base URL of the web view (runwatch ui); each alert's generatorURL is its "
        "run's page there (default: no link)",
    )
    am.add_argument(
        "--runbook-url",
        default="docs/runbooks.md",
        metavar="URL",
        help="where docs/runbooks.md is published; each alert's runbook_url is "
        "URL#<its kind's section> (default: %(default)s)",
    )


def _metrics_args(parser: argparse.ArgumentParser) -> None:
    """Flags of the Prometheus exporter."""
    metrics = parser.add_argument_group("metrics")
    metrics.add_argument(
        "--metrics-port",
        type=int,
        default=9464,
        metavar="N",
        help="port of /metrics, 0 for any free one (default: %(default)s)",
    )
    metrics.add_argument(
        "--metrics-host",
        "--metrics-addr",
        dest="metrics_host",
        default="127.0.0.1",
        metavar="ADDR",
        help="address /metrics listens on; 0.0.0.0 for every interface, as a container "
        "needs (default: %(default)s)",
    )
    metrics.add_argument(
        "--metrics-max-runs",
        type=int,
        default=10_000,
        metavar="N",
        help="track at most N runs; past it, ended runs and then the longest silent are "
        "dropped, which bounds /metrics (default: %(default)s)",
    )
    metrics.add_argument(
        "--metrics-ended-retention-s",
        type=float,
        default=3600.0,
        metavar="S",
        help="keep an ended run's series this long (log time) after its RunEnded "
        "(default: %(default)s)",
    )
    metrics.add_argument(
        "--processors-group",
        metavar="GROUP",
        help="the processors' consumer group (their --app-id), whose lag and workers "
        "/metrics shows; '' for none (default: <topic prefix>-processors)",
    )


def _archive_args(parser: argparse.ArgumentParser) -> None:
    """Flags of the archive."""
    archive = parser.add_argument_group("archive")
    archive.add_argument(
        "--archive-flush-s",
        type=float,
        default=5.0,
        metavar="S",
        help="write buffered records at least this often (default: %(default)s)",
    )
    archive.add_argument(
        "--archive-compact-s",
        type=float,
        default=3600.0,
        metavar="S",
        help="merge each stream's small files this often; 0 never (default: %(default)s)",
    )


def _validate(args: argparse.Namespace, webhooks: list[str], managers: list[str]) -> None:
    if not (args.alerts or args.metrics or args.archive or managers):
        raise UsageError(
            "choose at least one sink: --alerts, --metrics, --archive DIR or --alertmanager URL"
        )
    if args.webhook_format == "alertmanager":
        raise UsageError(WEBHOOK_FORMAT_GONE)
    if webhooks and not args.alerts:
        raise UsageError("--webhook needs --alerts")
    for flag, urls in (("--webhook", webhooks), ("--alertmanager", managers)):
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise UsageError(f"{flag} expects an http(s) URL, got {url!r}")
    if args.ui_url and not args.ui_url.startswith(("http://", "https://")):
        raise UsageError(f"--ui-url expects an http(s) URL, got {args.ui_url!r}")
    positive = (
        args.webhook_timeout_s,
        args.max_alerts_per_min,
        args.session_timeout,
        args.pending_max_delay_s,
        args.alertmanager_resend_s,
    )
    if args.webhook_attempts < 1 or min(positive) <= 0:
        raise UsageError(
            "--webhook-attempts, --webhook-timeout-s, --max-alerts-per-min, "
            "--pending-max-delay-s, --alertmanager-resend-s and --session-timeout must be > 0"
        )
    non_negative = (
        args.group_wait_s,
        args.webhook_backoff_s,
        args.archive_flush_s,
        args.cause_wait_s,
        args.archive_compact_s,
    )
    if min(non_negative) < 0:
        raise UsageError(
            "--group-wait-s, --cause-wait-s, --webhook-backoff-s, --archive-flush-s and "
            "--archive-compact-s must be >= 0"
        )
    if not 0 <= args.metrics_port <= 65535:
        raise UsageError(f"--metrics-port must be 0..65535, got {args.metrics_port}")
    if args.metrics_max_runs < 1 or args.metrics_ended_retention_s < 0:
        raise UsageError("--metrics-max-runs must be >= 1 and --metrics-ended-retention-s >= 0")


def _webhooks(args: argparse.Namespace) -> list[str]:
    if args.webhook:
        return list(args.webhook)
    return list(SinkEnv.from_env().alert_webhooks) if args.alerts else []


def _alertmanagers(args: argparse.Namespace) -> list[str]:
    if args.alertmanager:
        return list(args.alertmanager)
    return list(SinkEnv.from_env().alertmanagers)


def build_sinks(
    args: argparse.Namespace,
    topics: Any,
    webhooks: list[str],
    managers: Sequence[str] = (),
    collectors: Sequence[Any] = (),
) -> list[Any]:
    """The selected sinks, configured from ``args``; ``collectors`` are served with the metrics."""
    from runwatch.common.settings import runwatch_home
    from runwatch.sinks.alert_log import DeliveryLog
    from runwatch.sinks.alertmanager import AlertmanagerSettings, AlertmanagerSink
    from runwatch.sinks.alerts import AlertSettings, AlertSink
    from runwatch.sinks.archive import ArchiveSink
    from runwatch.sinks.delivery_figures import DeliveryFigures
    from runwatch.sinks.metrics import MetricsSink
    from runwatch.sinks.metrics_state import MetricsPolicy
    from runwatch.sinks.webhook import RetryPolicy

    out: list[Any] = []
    figures = DeliveryFigures()
    retry = RetryPolicy(
        attempts=args.webhook_attempts,
        base_delay_s=args.webhook_backoff_s,
        timeout_s=args.webhook_timeout_s,
    )
    if args.alerts:
        state_dir = Path(args.state_dir) if args.state_dir else runwatch_home() / "sinks"
        settings = AlertSettings(
            webhooks=tuple(webhooks),
            group_wait_s=args.group_wait_s,
            max_alerts_per_min=args.max_alerts_per_min,
            retry=retry,
            console=not args.no_console,
            min_severity=args.min_severity,
            pending_max_delay_s=args.pending_max_delay_s,
            cause_wait_s=args.cause_wait_s,
        )
        group = args.group_prefix
        log = DeliveryLog(state_dir / f"{group}-alerts.jsonl")
        out.append(AlertSink(settings, topics, log, figures=figures))
    if managers:
        am_settings = AlertmanagerSettings(
            urls=tuple(managers),
            min_severity=args.min_severity,
            resend_s=args.alertmanager_resend_s,
            horizon_s=4 * args.alertmanager_resend_s,
            settle_s=args.group_wait_s,
            retry=retry,
            pending_max_delay_s=args.pending_max_delay_s,
            ui_url=args.ui_url,
            runbook_url=args.runbook_url,
        )
        out.append(AlertmanagerSink(am_settings, topics, figures=figures))
    if args.metrics:
        receivers = [figures] if (args.alerts or managers) else []
        policy = MetricsPolicy(
            max_runs=args.metrics_max_runs, ended_retention_s=args.metrics_ended_retention_s
        )
        out.append(MetricsSink(topics, policy, collectors=[*receivers, *collectors]))
    if args.archive:
        out.append(
            ArchiveSink(
                Path(args.archive),
                flush_interval_s=args.archive_flush_s,
                compact_interval_s=args.archive_compact_s,
            )
        )
    return out


def start_of(name: str, from_beginning: bool) -> Any:
    """Where a new group of sink ``name`` starts (see `sinks.consumer.StartFrom`).

    Alerts start from now unless ``from_beginning`` (a new group must not page the past);
    the archive from the beginning (holding the history is its job, and its file marks
    skip what it holds); the metrics and the Alertmanager sink replay the log at every
    start (their figures and alert conditions are a fold of it, so a restart shows what it
    showed before; the Alertmanager sink posts only what fires or ended recently).
    """
    from runwatch.sinks.consumer import StartFrom

    if name == "alerts":
        return StartFrom.EARLIEST if from_beginning else StartFrom.LATEST
    if name in ("metrics", "alertmanager"):
        return StartFrom.REPLAY
    return StartFrom.EARLIEST


def group_of(sink: str, group_prefix: str) -> str:
    """The consumer group of sink ``sink``.

    ``PREFIX-<sink>``; the Alertmanager sink's is its process's own
    (``PREFIX-alertmanager-<host>-<pid>``): every process must read every partition (a run's
    facts are spread over four topics of different partition counts), as each of two
    Prometheus servers evaluates every rule; it commits nothing.
    """
    if sink == "alertmanager":
        return f"{group_prefix}-alertmanager-{socket.gethostname()}-{os.getpid()}"
    return f"{group_prefix}-{sink}"


_START_NOTE = {
    "earliest": "a new group reads the retained history",
    "latest": "a new group starts from now",
    "replay": "replays the retained log at every start",
}


def _say(message: str) -> None:
    print(f"runwatch sinks: {message}", file=sys.stderr, flush=True)


def _serve(sink: Any, port: int, host: str) -> None:
    try:
        bound = sink.serve(port, host)
    except OSError as exc:
        raise RunwatchError(
            f"cannot serve metrics on {host}:{port}: {exc.strerror or exc} "
            "(another exporter there? choose --metrics-port, 0 for any free port)"
        ) from None
    _say(f"metrics on http://{host}:{bound}/metrics")


def _probe(args: argparse.Namespace, bootstrap: str, prefix: str) -> Any:
    """The processors' group probe for /metrics (None: no --metrics, or no group)."""
    if not args.metrics:
        return None
    from runwatch.common.settings import kafka_client_config
    from runwatch.processors.fleet import default_app_id
    from runwatch.sinks.group_probe import GroupProbe

    group = default_app_id(prefix) if args.processors_group is None else args.processors_group
    if not group:
        return None
    return GroupProbe(bootstrap, group, client_config=kafka_client_config())


BOOTSTRAP_TIMEOUT_S = 10.0
"""How long `runwatch sinks` waits for Kafka to answer at start before it says so."""


def _failure(loop: Any, bootstrap: str) -> str:
    from kafka.errors import KafkaError

    error = loop.error
    if not loop.connected and isinstance(error, KafkaError | OSError):
        return f"cannot reach Kafka at {bootstrap} ({type(error).__name__})"
    if isinstance(error, KafkaError):
        return f"{loop.sink.name} sink: Kafka error: {type(error).__name__}: {error}"
    return f"{loop.sink.name} sink failed: {type(error).__name__}: {error}"


def run(args: argparse.Namespace) -> int:
    """Start every selected sink in its own thread; stop on SIGINT or SIGTERM."""
    from runwatch.admin import warn_if_no_authorizer
    from runwatch.broker.acls import default_sinks_group
    from runwatch.common.settings import kafka_client_config, topic_prefix
    from runwatch.resolve import resolve_bootstrap
    from runwatch.schemas.topics import names
    from runwatch.sinks.consumer import SinkLoop, start_thread

    webhooks = _webhooks(args)
    managers = _alertmanagers(args)
    _validate(args, webhooks, managers)
    bootstrap = resolve_bootstrap(args.bootstrap)
    prefix = topic_prefix(args.prefix)
    topics = names(prefix)
    args.group_prefix = args.group or default_sinks_group(prefix)
    probe = _probe(args, bootstrap, prefix)
    sinks = build_sinks(args, topics, webhooks, managers, [probe] if probe else [])
    try:
        for sink in sinks:
            if sink.name == "metrics":
                _serve(sink, args.metrics_port, args.metrics_host)
    except RunwatchError:
        for sink in sinks:
            if hasattr(sink, "close"):
                sink.close()
        raise
    if probe is not None:
        probe.start()
    warn_if_no_authorizer(bootstrap, prefix, "sinks")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    loops = []
    all_topics = list(topics.roles())
    for sink in sinks:
        start = start_of(sink.name, args.from_beginning)
        loop = SinkLoop(
            sink,
            bootstrap=bootstrap,
            topics=getattr(sink, "topics", all_topics),
            group_id=group_of(sink.name, args.group_prefix),
            stop=stop,
            client_config=kafka_client_config(),
            start=start,
            session_timeout_s=args.session_timeout,
            notify=_say,
            bootstrap_timeout_s=BOOTSTRAP_TIMEOUT_S,
        )
        loops.append((loop, start_thread(loop)))
        _say(f"{sink.name} (group {loop.group_id}; {_START_NOTE[start.value]})")
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
        if probe is not None:
            probe.stop()
    failures = list(dict.fromkeys(_failure(lp, bootstrap) for lp, _ in loops if lp.error))
    if failures:
        raise RunwatchError("; ".join(failures))
    return 0
