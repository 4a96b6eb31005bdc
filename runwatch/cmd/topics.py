"""`runwatch topics`: create runwatch's topic catalogue on a cluster, list a cluster's topics."""

from __future__ import annotations

import argparse
import sys

from runwatch.common.errors import UsageError

HELP = "create the topic catalogue (idempotent) or list the cluster's topics"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the `topics` subcommands and their arguments."""
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        child = sub.add_parser(name, help=help_text, description=help_text)
        child.add_argument(
            "--bootstrap",
            default=None,
            metavar="HOST:PORT",
            help="Kafka address (default: $RUNWATCH_BOOTSTRAP, else the embedded broker)",
        )
        child.add_argument(
            "--timeout", type=float, default=30.0, metavar="S", help="seconds to wait"
        )
        return child

    create = add("create", "create every catalogue topic that does not exist yet")
    create.add_argument(
        "--prefix",
        default=None,
        help="topic name prefix (default: $RUNWATCH_TOPIC_PREFIX or runwatch)",
    )
    create.add_argument(
        "--partitions",
        default=None,
        metavar="N|TOPIC=N,...",
        help="partitions of the new topics: N for every topic, TOPIC=N for one "
        "(heartbeats=64,steps=32), both (8,heartbeats=64); topics not named keep the "
        "catalogue's (default: $RUNWATCH_PARTITIONS, else the catalogue's: "
        f"{_defaults()})",
    )
    create.add_argument(
        "--replication-factor",
        type=int,
        default=None,
        metavar="N",
        help="replicas per partition (default: $RUNWATCH_REPLICATION_FACTOR, else min(3, brokers))",
    )
    listing = add("list", "list topics and their partition counts")
    listing.add_argument(
        "--prefix",
        default=None,
        help="only the topics of this prefix: PREFIX.* and PREFIX-* (the processors' "
        "changelogs) (default: every topic)",
    )
    listing.add_argument(
        "--all", action="store_true", help="include internal topics (__consumer_offsets ...)"
    )


def _defaults() -> str:
    from runwatch.schemas.topics import DEFAULT_PARTITIONS

    return ",".join(f"{k}={v}" for k, v in DEFAULT_PARTITIONS.items())


def of_prefix(topic: str, prefix: str) -> bool:
    """True for the topics of ``prefix``: ``PREFIX.<name>`` and ``PREFIX-...`` changelogs."""
    return topic.startswith((f"{prefix}.", f"{prefix}-"))


def run(args: argparse.Namespace) -> int:
    """Dispatch to the chosen action; returns the exit status."""
    from runwatch import admin
    from runwatch.common.settings import replication_factor, topic_prefix
    from runwatch.resolve import partition_counts, resolve_bootstrap

    if args.timeout <= 0:
        raise UsageError(f"--timeout must be > 0, not {args.timeout}")
    partitions = partition_counts(args.partitions) if args.action == "create" else None
    bootstrap = resolve_bootstrap(args.bootstrap)
    if args.action == "create":
        factor = replication_factor(args.replication_factor)
        rule = admin.cluster_replication(bootstrap, factor=factor, timeout_s=args.timeout)
        created = admin.create_catalogue(
            bootstrap,
            prefix=topic_prefix(args.prefix),
            partitions=partitions,
            replication=rule,
            timeout_s=args.timeout,
        )
        print(
            f"replication factor {rule.factor}, min.insync.replicas {rule.min_insync}",
            file=sys.stderr,
        )
        for name, new in sorted(created.items()):
            print(f"{name}\t{'created' if new else 'exists'}")
        return 0
    if args.action == "list":
        topics = admin.list_topics(bootstrap, include_internal=args.all, timeout_s=args.timeout)
        for name, partitions in topics.items():
            if args.prefix is not None and not of_prefix(name, args.prefix):
                continue
            print(f"{name}\t{partitions}")
        return 0
    raise UsageError(f"unknown action {args.action!r}")
