"""`runwatch processors`: run a stream-processor worker (start more to scale out)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import threading
from typing import Any

from runwatch.common.errors import UsageError

HELP = "run a stream-processor worker; workers with the same --app-id share the partitions"


def parse_overrides(pairs: list[str], shadow: str | None = None) -> dict[str, str]:
    """``["k=v", ...]`` -> ``{"k": "v"}``; a pair without ``=`` is a usage error.

    ``shadow`` (``--shadow``): ``all`` adds ``shadow=1``, a list of kinds ``shadow_kinds``.
    """
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--set expects NAME=VALUE, got {pair!r}")
        out[name.strip()] = value.strip()
    if shadow is not None and shadow.strip():
        if shadow.strip().lower() == "all":
            out["shadow"] = "1"
        else:
            out["shadow_kinds"] = shadow.strip()
    return out


def add_common(parser: argparse.ArgumentParser) -> None:
    """Arguments every processor-side command shares."""
    parser.add_argument(
        "--bootstrap", help="Kafka bootstrap HOST:PORT (default: RUNWATCH_BOOTSTRAP)"
    )
    parser.add_argument(
        "--prefix", help="topic name prefix (default: $RUNWATCH_TOPIC_PREFIX or runwatch)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="detector setting, e.g. loss_z_thresh=8 (repeatable)",
    )
    parser.add_argument(
        "--shadow",
        default=None,
        metavar="KIND,...|all",
        help="shadow mode for these verdict kinds (or all): their verdicts and the commands "
        "they would cause are recorded flagged shadow, and no controller executes them "
        "(the same as --set shadow_kinds=... or --set shadow=1)",
    )


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of `runwatch processors`."""
    add_common(parser)
    parser.add_argument(
        "--app-id",
        help="consumer group and changelog prefix; workers with the same id share the work "
        "(default: <prefix>-processors)",
    )
    parser.add_argument(
        "--partitions",
        default=None,
        metavar="N|TOPIC=N,...",
        help="partitions of the topics it creates when they do not exist, as in `runwatch "
        "topics create` (default: $RUNWATCH_PARTITIONS, else the catalogue's); the worker "
        "always uses the counts the topics have",
    )
    parser.add_argument(
        "--tick-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how often the clock writes a tick (the time liveness checks read)",
    )
    parser.add_argument(
        "--batch-max",
        type=int,
        default=None,
        help="most records of one fetched round, all partitions together (default: 20000)",
    )
    parser.add_argument(
        "--state-flush-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="longest a folded round waits for its states to be written and its "
        "offsets committed; longer writes each run's state once for more rounds, and leaves "
        "more for a crash to fold again (default: 1)",
    )
    _add_store_args(parser)


def _add_store_args(parser: argparse.ArgumentParser) -> None:
    """Where a worker keeps its tables, how it fails over and stops, what it creates."""
    parser.add_argument(
        "--store",
        default=None,
        metavar="{memory,rocksdb}",
        help="where the tables live: memory (a successor replays the changelogs) or rocksdb "
        "on local disk (a successor on the same host replays only their tail; needs "
        "runwatch[rocksdb]) (default: $RUNWATCH_STORE, else memory)",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help="the worker's data dir, where rocksdb keeps its tables; one per worker "
        "(default: $RUNWATCH_HOME/processors/<app id>)",
    )
    parser.add_argument(
        "--session-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="failover time: a worker silent this long loses its partitions to the others",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=SHUTDOWN_TIMEOUT_S,
        metavar="SECONDS",
        help="longest a stop (SIGTERM/SIGINT) may take, e.g. with Kafka gone, before the "
        "worker exits 1 without finishing it (nothing is lost: outputs precede offsets)",
    )
    parser.add_argument(
        "--replication-factor",
        type=int,
        default=None,
        metavar="N",
        help="replicas of the topics and changelogs it creates "
        "(default: $RUNWATCH_REPLICATION_FACTOR, else min(3, brokers))",
    )
    parser.add_argument(
        "--web-port", type=int, default=None, help="faust web server port (default: no server)"
    )
    parser.add_argument(
        "--loglevel",
        default=None,
        choices=["debug", "info", "warn", "error"],
        help="level of faust's and aiokafka's loggers (default: from -v; none without it)",
    )


_LIBRARY_LOGGERS = ("faust", "mode", "aiokafka")
_ALWAYS_WARN = "faust.assignor.partition_assignor"
"""Its WARNING ``Ignoring missing topic`` is the one sign that a table or the clock went
unassigned (`processors.app.topics_faust_declares`): shown whatever ``-v`` and ``--loglevel``
say."""
_LOGLEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING}


SHUTDOWN_TIMEOUT_S = 30.0
"""Longest a stop (SIGTERM, SIGINT) may take before the worker exits without finishing it."""


def make_worker(app: Any, shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S) -> Any:
    """A faust worker that leaves logging and the terminal to the runwatch command line.

    faust's own worker replaces the logging set up by `runwatch.cli` (root at DEBUG with a
    handler on stdout) and draws a progress spinner whose cursor codes (``ESC[?25l``,
    ``ESC[?25h``) it writes even when stdout is a file or a pipe. This one keeps our
    logging (``override_logging=False``) and draws no spinner.

    Its stop is bounded: faust's stop waits on the broker (commits, the producer's flush,
    leaving the group), and with the broker gone it waited for ever, so SIGTERM did
    nothing and only SIGKILL ended the worker. After ``shutdown_timeout_s`` the worker
    exits with status 1 without finishing. That loses nothing: every output is published
    before the state and the offset that record it (docs/processors.md), which is what
    makes a SIGKILL safe, and a stop cut short is no worse than one.
    """
    from faust.worker import Worker

    log = logging.getLogger("runwatch")

    def give_up() -> None:
        log.error(
            "the worker did not stop within %g s (is Kafka reachable?); exiting without "
            "finishing the stop: the next worker resumes from the last committed offsets",
            shutdown_timeout_s,
        )
        logging.shutdown()
        os._exit(1)

    class _Worker(Worker):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.spinner = None  # faust creates it unconditionally; we never draw one

        def _schedule_shutdown(self, signal: Any) -> None:
            if not self._signal_stop_time:
                log.info("stopping on %s (at most %g s)", signal.name, shutdown_timeout_s)
                timer = threading.Timer(shutdown_timeout_s, give_up)
                timer.daemon = True
                timer.start()
            super()._schedule_shutdown(signal)

        async def on_startup_finished(self) -> None:
            await super().on_startup_finished()
            loop = type(asyncio.get_running_loop())
            logging.getLogger("runwatch").info(
                "processors ready (app id %s, event loop %s.%s)",
                self.app.conf.id,
                loop.__module__,
                loop.__qualname__,
            )

    return _Worker(app, quiet=True, override_logging=False)


def detector_config(overrides: dict[str, str]) -> object:
    """The detector configuration with ``overrides`` applied, or a usage error."""
    from runwatch.processors.core.config import DetectorConfig, with_overrides

    try:
        return with_overrides(DetectorConfig(), overrides)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _store(given: str | None, from_env: str) -> str:
    """``--store``, else ``from_env`` (``RUNWATCH_STORE`` by `ProcessorEnv`, else memory)."""
    from runwatch.processors.settings import STORES

    if given is None:
        return from_env
    if given not in STORES:
        raise UsageError(f"--store expects one of {', '.join(STORES)}, got {given!r}")
    return given


def run(args: argparse.Namespace) -> int:
    """Create the topics if needed, then run a faust worker until stopped."""
    from runwatch.admin import (
        cluster_replication,
        create_catalogue,
        create_topics,
        warn_if_no_authorizer,
    )
    from runwatch.common.gc_tuning import tune_for_rounds
    from runwatch.common.settings import faust_broker_settings, replication_factor, topic_prefix
    from runwatch.processors.app import create_app, topics_faust_declares
    from runwatch.processors.event_loop import install
    from runwatch.processors.fleet import default_app_id
    from runwatch.processors.settings import (
        BATCH_MAX,
        DEFAULT_STATE_FLUSH_S,
        ProcessorEnv,
        ProcessorSettings,
    )
    from runwatch.processors.stores import rocksdb_missing
    from runwatch.resolve import partition_counts, resolve_bootstrap
    from runwatch.schemas.signing import load_key

    env = ProcessorEnv.from_env()  # a malformed variable is a usage error before anything
    store = _store(args.store, env.store)
    if store == "rocksdb" and (why := rocksdb_missing()) is not None:
        raise UsageError(why)
    batch_max = BATCH_MAX if args.batch_max is None else args.batch_max
    if batch_max < 1 or min(args.tick_interval, args.session_timeout, args.shutdown_timeout) <= 0:
        raise UsageError(
            "--tick-interval, --batch-max, --session-timeout and --shutdown-timeout must be "
            "positive"
        )
    flush_s = (
        DEFAULT_STATE_FLUSH_S if args.state_flush_interval is None else args.state_flush_interval
    )
    if not 0 <= flush_s <= 3600:
        raise UsageError("--state-flush-interval must be between 0 and 3600 seconds")
    partitions = partition_counts(args.partitions)
    overrides = parse_overrides(args.overrides, args.shadow)
    cfg = detector_config(overrides)
    bootstrap = resolve_bootstrap(args.bootstrap)
    prefix = topic_prefix(args.prefix)
    try:
        key = load_key()
        faust_broker_settings()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if key is None:
        logging.getLogger("runwatch").warning(
            "no RUNWATCH_COMMAND_KEY: restart commands go out unsigned and controllers refuse them"
        )
    warn_if_no_authorizer(bootstrap, prefix, "processors")
    # The changelogs get the catalogue's replication: both from the cluster's size.
    rule = cluster_replication(bootstrap, factor=replication_factor(args.replication_factor))
    create_catalogue(bootstrap, prefix=prefix, partitions=partitions, replication=rule)
    app_id = args.app_id or default_app_id(prefix)
    settings = ProcessorSettings(
        bootstrap=bootstrap,
        prefix=prefix,
        app_id=app_id,
        partitions=input_partitions(bootstrap, prefix, app_id),
        store=store,  # type: ignore[arg-type]
        data_dir=args.data_dir,
        batch_max=batch_max,
        state_flush_s=flush_s,
        tick_interval_s=args.tick_interval,
        session_timeout_s=args.session_timeout,
        web_port=args.web_port,
        replication_factor=rule.factor,
        min_insync_replicas=rule.min_insync,
        overrides=overrides,
    )
    # Before faust's consumer reads its first metadata (`topics_faust_declares` says why).
    create_topics(bootstrap, topics_faust_declares(settings), replication=rule)
    if args.loglevel is not None:
        for name in _LIBRARY_LOGGERS:
            logging.getLogger(name).setLevel(_LOGLEVELS.get(args.loglevel, logging.ERROR))
    assignor = logging.getLogger(_ALWAYS_WARN)
    if assignor.getEffectiveLevel() > logging.WARNING:  # -v and --loglevel may show more
        assignor.setLevel(logging.WARNING)
    install(env.event_loop)  # before faust's app takes its loop
    watch = watch_broker(bootstrap)
    try:
        app = create_app(settings, cfg, key)  # type: ignore[arg-type]
        tune_for_rounds()  # after start-up: faust and the app frozen; collections between rounds
        make_worker(app, args.shutdown_timeout).execute_from_commandline()
    finally:
        logging.getLogger("aiokafka").removeHandler(watch)
        watch.close()
    return 0


def input_partitions(bootstrap: str, prefix: str, app_id: str) -> dict[str, int]:
    """The partition count of each input topic, as the cluster has it (not as asked).

    A topic created earlier keeps its count whatever ``--partitions`` says, and a table's
    changelog must be co-partitioned with its input, so the worker sizes its tables, the
    partition lookup of its states and the Tick fan-out from these.

    Raises:
        UsageError: A changelog of ``app_id`` exists with another count than its input
            (the input was repartitioned): its states are keyed to the old partitions.
    """
    from runwatch.admin import list_topics
    from runwatch.processors.settings import changelog_topic
    from runwatch.schemas.topics import FOLD_ORDER, folding, names

    topics = names(prefix)
    have = list_topics(bootstrap)
    counts: dict[str, int] = {}
    for role in FOLD_ORDER:
        topic = topics.of(role)
        counts[role] = have.get(topic, 0)
        table = folding(role).table
        changelog = have.get(changelog_topic(app_id, table))
        if changelog is not None and changelog != counts[role]:
            raise UsageError(
                f"{changelog_topic(app_id, table)} has {changelog} partitions but its input "
                f"{topic} has {counts[role]}: the states are keyed to the old partitions; "
                "start with a new --app-id (it rebuilds them from the log)"
            )
    logging.getLogger("runwatch").info(
        "input partitions: %s", ", ".join(f"{k}={v}" for k, v in counts.items())
    )
    return counts


def watch_broker(bootstrap: str) -> logging.Handler:
    """Let the worker say when Kafka stops answering, while it does not, and when it is back.

    aiokafka logs an error per failed retry; unless ``-v`` or ``--loglevel`` shows them,
    they go only to a `runwatch.logsummary.BrokerWatch` on the ``aiokafka`` logger, which
    writes the worker's own lines instead (runwatch's ``broker_watch`` logger).

    Returns:
        The handler, to remove when the worker stops.
    """
    from runwatch.common.errors import BrokerUnreachable
    from runwatch.logsummary import BrokerWatch
    from runwatch.processors.engine import RETRY_BACKOFF_MS
    from runwatch.reachability import check_reachable

    def answers() -> bool:
        try:
            check_reachable(bootstrap, timeout_s=2.0)
        except BrokerUnreachable:
            return False
        return True

    watch = BrokerWatch(bootstrap, probe=answers, retry_s=RETRY_BACKOFF_MS / 1000)
    client = logging.getLogger("aiokafka")
    if client.getEffectiveLevel() > logging.ERROR:  # silenced: the watch alone hears it
        client.setLevel(logging.ERROR)
        client.propagate = False
    client.addHandler(watch)
    return watch
