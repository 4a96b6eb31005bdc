"""`runwatch topics`: create runwatch's topic catalogue on a cluster, list a cluster's topics.

``create --acls print`` prints the ``kafka-acls.sh`` commands that give each role its
grants (`runwatch.broker.acls`) and creates nothing; ``create --acls apply`` creates the
catalogue and applies those ACLs (an admin's credential: one allowed to alter ACLs).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from runwatch.common.errors import UsageError

if TYPE_CHECKING:
    from runwatch.broker.acls import Role, Scope

HELP = "create the topic catalogue (idempotent) and its ACLs, or list the cluster's topics"


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
    create.add_argument(
        "--acls",
        choices=("print", "apply"),
        default=None,
        help="the roles' ACLs for this prefix and app id: print them as kafka-acls.sh "
        "commands (and create nothing), or apply them after creating the topics (as an "
        "admin); docs/security.md",
    )
    create.add_argument(
        "--app-id",
        default=None,
        help="with --acls: the processors' app id (default: <prefix>-processors)",
    )
    create.add_argument(
        "--sinks-group",
        default=None,
        metavar="PREFIX",
        help="with --acls: the sinks' consumer group prefix (default: <prefix>-sinks)",
    )
    create.add_argument(
        "--principal",
        action="append",
        default=[],
        metavar="ROLE=PRINCIPAL",
        help="with --acls: a role's principal (trainer=User:alice; repeatable); roles not "
        "named get User:<role> (trainer, processors, controller, sinks)",
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


def _grants(args: argparse.Namespace) -> tuple[Scope, dict[Role, str]] | None:
    """The scope and principals of ``--acls`` (None without it); flags checked."""
    from runwatch.broker.acls import Scope, parse_principals, principals
    from runwatch.common.settings import topic_prefix

    if args.acls is None:
        if args.principal or args.app_id or args.sinks_group:
            raise UsageError("--app-id, --sinks-group and --principal go with --acls")
        return None
    try:
        who = principals(parse_principals(args.principal))
    except ValueError as exc:
        raise UsageError(f"--principal {exc}") from None
    return Scope.of(topic_prefix(args.prefix), args.app_id, args.sinks_group), who


def _print_acls(args: argparse.Namespace, scope: Scope, who: dict[Role, str]) -> int:
    """Print the kafka-acls.sh commands of ``--acls print``; nothing is created."""
    from runwatch.broker.acls import kafka_acls_commands
    from runwatch.resolve import resolve_bootstrap

    try:
        bootstrap = resolve_bootstrap(args.bootstrap, check=False)
    except UsageError:
        bootstrap = "HOST:PORT"
    print(
        f"# runwatch roles' ACLs: prefix {scope.prefix}, app id {scope.app_id}, sinks' "
        f"groups {scope.sinks_group}-*; admin.properties holds an admin's client settings",
    )
    for line in kafka_acls_commands(scope, who, bootstrap):
        print(line)
    print("topics create --acls print: nothing created", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    """Dispatch to the chosen action; returns the exit status."""
    from runwatch import admin
    from runwatch.broker.acls import bindings
    from runwatch.common.settings import replication_factor, topic_prefix
    from runwatch.resolve import partition_counts, resolve_bootstrap

    if args.timeout <= 0:
        raise UsageError(f"--timeout must be > 0, not {args.timeout}")
    partitions = partition_counts(args.partitions) if args.action == "create" else None
    grants = _grants(args) if args.action == "create" else None
    if grants is not None and args.acls == "print":
        return _print_acls(args, *grants)
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
        if grants is not None:
            scope, who = grants
            count = admin.apply_acls(bootstrap, bindings(scope, who), timeout_s=args.timeout)
            for role, principal in who.items():
                print(f"{role}: {principal}", file=sys.stderr)
            print(
                f"applied {count} ACL bindings for prefix {scope.prefix}, app id "
                f"{scope.app_id}, sinks' groups {scope.sinks_group}-*",
                file=sys.stderr,
            )
        return 0
    if args.action == "list":
        topics = admin.list_topics(bootstrap, include_internal=args.all, timeout_s=args.timeout)
        for name, partitions in topics.items():
            if args.prefix is not None and not of_prefix(name, args.prefix):
                continue
            print(f"{name}\t{partitions}")
        return 0
    raise UsageError(f"unknown action {args.action!r}")
