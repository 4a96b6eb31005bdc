"""`runwatch broker`: start, stop and inspect the embedded Kafka broker or cluster.

``start --nodes N`` (N >= 2) runs a replicated cluster of N KRaft nodes on loopback in the
data directory; later commands on that directory (``stop``, ``status``, ``logs``) find the
cluster by its ``cluster.json`` and cover every node, or one with ``--node``.

``start --secure`` runs a single broker that takes SASL/SCRAM-SHA-512 clients only and
checks ACLs, with a user per role (`runwatch.broker.security`); ``env USER`` prints the
variables a process needs to connect as one of them.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

from runwatch.common.errors import UsageError

if TYPE_CHECKING:
    from runwatch.broker import EmbeddedBroker, EmbeddedCluster
    from runwatch.broker.acls import Scope

HELP = "run the embedded Apache Kafka broker or a local cluster (start, stop, status, logs, env)"

_FOLLOW_POLL_S = 0.5


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the `broker` subcommands and their arguments."""
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        child = sub.add_parser(name, help=help_text, description=help_text)
        child.add_argument(
            "--data-dir",
            type=Path,
            default=None,
            help="the broker's data directory (default: $RUNWATCH_HOME/broker)",
        )
        child.add_argument(
            "--node",
            type=int,
            default=None,
            metavar="ID",
            help="a cluster's node: act on this one only (logs: default 1)",
        )
        return child

    start = add("start", "start the broker in the background and wait until it answers")
    start.add_argument(
        "--port",
        type=int,
        default=None,
        help="client port (default: a free one, kept); a cluster's node i gets PORT+i-1",
    )
    start.add_argument(
        "--nodes",
        type=int,
        default=None,
        metavar="N",
        help="run a replicated cluster of N KRaft nodes (default: 1, or the recorded cluster)",
    )
    start.add_argument(
        "--secure",
        action="store_true",
        help="SASL/SCRAM-SHA-512 clients only, ACLs checked, one user per role (the default "
        "for a deployment; a data directory's security is fixed at its first start)",
    )
    start.add_argument(
        "--prefix",
        default=None,
        help="secure: grant the roles the topics of this prefix "
        "(default: $RUNWATCH_TOPIC_PREFIX or runwatch)",
    )
    start.add_argument(
        "--app-id",
        default=None,
        help="secure: the processors' app id to grant (default: <prefix>-processors)",
    )
    start.add_argument("--timeout", type=float, default=120.0, metavar="S", help="seconds to wait")
    add("stop", "stop the broker (SIGTERM, then SIGKILL after --timeout)").add_argument(
        "--timeout", type=float, default=30.0, metavar="S", help="seconds to wait"
    )
    add("status", "print the broker's host:port(s); exit 0 if it (every node) runs, 1 if not")
    logs = add("logs", "print the broker's log (logs/server.log in the data dir)")
    logs.add_argument("-n", "--lines", type=int, default=50, help="last N lines")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    env = add("env", "print the shell variables that connect as USER to the secure broker")
    env.add_argument(
        "user", metavar="USER", help="admin, or a role: trainer, processors, controller, sinks"
    )


def run(args: argparse.Namespace) -> int:
    """Dispatch to the chosen action; returns the exit status."""
    from runwatch.broker import EmbeddedBroker, EmbeddedCluster, default_data_dir, is_cluster_dir

    port = getattr(args, "port", None)
    if port is not None and not 0 < port < 65536:
        raise UsageError(f"--port must be 1..65535, not {port}")
    nodes = getattr(args, "nodes", None)
    if nodes is not None and nodes < 1:
        raise UsageError(f"--nodes must be >= 1, not {nodes}")
    if args.action == "logs" and args.lines < 0:
        raise UsageError(f"-n must be >= 0, not {args.lines}")
    data_dir = args.data_dir if args.data_dir is not None else default_data_dir()
    secure = getattr(args, "secure", False)
    if (nodes is not None and nodes > 1) or (nodes is None and is_cluster_dir(data_dir)):
        if secure or args.action == "env":
            raise UsageError("a secure broker is a single node: start it in another --data-dir")
        cluster = EmbeddedCluster(data_dir, nodes=nodes, port=port)
        if args.node is not None and not 1 <= args.node <= cluster.nodes:
            raise UsageError(f"--node must be 1..{cluster.nodes}, not {args.node}")
        return _run_cluster(cluster, args)
    if args.node is not None and args.node != 1:
        raise UsageError(f"--node {args.node}: {data_dir} holds a single broker (node 1)")
    if nodes == 1 and is_cluster_dir(data_dir):
        raise UsageError(f"{data_dir} holds a cluster; use another --data-dir for one broker")
    broker = EmbeddedBroker(args.data_dir, port=port, secure=secure, scope=_scope(args))
    if args.action == "start":
        return _start(broker, args.timeout)
    if args.action == "env":
        return _env(broker, args.user)
    if args.action == "stop":
        return _stop(broker, args.timeout)
    if args.action == "status":
        return _status(broker)
    if args.action == "logs":
        return _logs(broker.log_file, args.lines, args.follow)
    raise UsageError(f"unknown action {args.action!r}")


def _run_cluster(cluster: EmbeddedCluster, args: argparse.Namespace) -> int:
    if args.action == "start":
        info = cluster.start(args.node, timeout_s=args.timeout)
        print(info.bootstrap)
        for node_id, node in sorted(info.running.items()):
            print(
                f"node {node_id}: Kafka {node.kafka_version} on {node.bootstrap}, pid {node.pid}",
                file=sys.stderr,
            )
        print(f"cluster of {len(info.nodes)} nodes, data {info.data_dir}", file=sys.stderr)
        return 0
    if args.action == "stop":
        stopped = cluster.stop(args.node, timeout_s=args.timeout)
        what = ", ".join(str(n) for n in stopped) if stopped else "none was running"
        print(f"stopped nodes of {cluster.data_dir}: {what}", file=sys.stderr)
        return 0
    if args.action == "status":
        running = cluster.running()
        live = running.running if running is not None else {}
        wanted = [args.node] if args.node is not None else list(range(1, cluster.nodes + 1))
        for node_id in wanted:
            found = live.get(node_id)
            state = f"runs on {found.bootstrap}, pid {found.pid}" if found else "not running"
            print(f"node {node_id}: {state}", file=sys.stderr)
        if not all(n in live for n in wanted):
            return 1
        print(live[args.node].bootstrap if args.node is not None else cluster.bootstrap)
        return 0
    if args.action == "logs":
        return _logs(cluster.broker(args.node or 1).log_file, args.lines, args.follow)
    raise UsageError(f"unknown action {args.action!r}")


def _scope(args: argparse.Namespace) -> Scope | None:
    """The grants' scope of ``start --secure`` (None when neither flag is given)."""
    from runwatch.broker.acls import Scope
    from runwatch.common.settings import topic_prefix

    prefix, app_id = getattr(args, "prefix", None), getattr(args, "app_id", None)
    if prefix is None and app_id is None:
        return None
    return Scope.of(topic_prefix(prefix), app_id)


def _start(broker: EmbeddedBroker, timeout_s: float) -> int:
    from runwatch.broker.security import credentials_dir

    already = broker.running()
    info = broker.start(timeout_s=timeout_s)
    print(info.bootstrap)
    how = "already running" if already is not None else f"started in {info.startup_s:.1f} s"
    print(
        f"Kafka {info.kafka_version} {how}: pid {info.pid}, data {info.data_dir}",
        file=sys.stderr,
    )
    if info.secure:
        where = credentials_dir(info.data_dir)
        print(
            "secure: SASL/SCRAM-SHA-512 clients only, ACLs checked; a user per role "
            f"(trainer, processors, controller, sinks) and admin, passwords in {where}/"
            "<user>.env (0600). Connect as one with: "
            'eval "$(runwatch broker env trainer)"',
            file=sys.stderr,
        )
    return 0


def _env(broker: EmbeddedBroker, user: str) -> int:
    from runwatch.broker.security import load_credentials

    info = broker.running()
    if info is None:
        print(f"no broker runs from {broker.data_dir}", file=sys.stderr)
        return 1
    if not info.secure:
        raise UsageError(f"the broker of {broker.data_dir} is not secure: no users")
    sys.stdout.write(load_credentials(broker.data_dir).env_snippet(user, info.bootstrap))
    return 0


def _stop(broker: EmbeddedBroker, timeout_s: float) -> int:
    if broker.stop(timeout_s=timeout_s):
        print(f"stopped the broker of {broker.data_dir}", file=sys.stderr)
    else:
        print(f"no broker runs from {broker.data_dir}", file=sys.stderr)
    return 0


def _status(broker: EmbeddedBroker) -> int:
    info = broker.running()
    if info is None:
        print(f"no broker runs from {broker.data_dir}", file=sys.stderr)
        return 1
    print(info.bootstrap)
    return 0


def _logs(path: Path, lines: int, follow: bool) -> int:
    if not path.exists() and not follow:
        print(f"no log at {path} (has the broker been started?)", file=sys.stderr)
        return 1
    if path.exists():
        with path.open(errors="replace") as handle:
            tail = deque(handle, maxlen=lines) if lines else ()
            sys.stdout.writelines(tail)
            position = handle.tell()
            inode = path.stat().st_ino
    else:
        position, inode = 0, -1
    sys.stdout.flush()
    while follow:  # like `tail -F`: poll for growth, reopen after a roll
        time.sleep(_FOLLOW_POLL_S)
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        if stat.st_ino != inode or stat.st_size < position:
            position, inode = 0, stat.st_ino
        if stat.st_size > position:
            with path.open(errors="replace") as handle:
                handle.seek(position)
                sys.stdout.write(handle.read())
                position = handle.tell()
            sys.stdout.flush()
    return 0
