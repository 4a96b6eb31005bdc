"""`runwatch broker`: start, stop and inspect the embedded single-node Kafka broker."""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

from runwatch.errors import UsageError

if TYPE_CHECKING:
    from runwatch.broker import EmbeddedBroker

HELP = "run the embedded Apache Kafka broker (start, stop, status, logs)"

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
        return child

    start = add("start", "start the broker in the background and wait until it answers")
    start.add_argument(
        "--port", type=int, default=None, help="client port (default: a free one, kept)"
    )
    start.add_argument("--timeout", type=float, default=120.0, metavar="S", help="seconds to wait")
    add("stop", "stop the broker (SIGTERM, then SIGKILL after --timeout)").add_argument(
        "--timeout", type=float, default=30.0, metavar="S", help="seconds to wait"
    )
    add("status", "print the broker's host:port; exit 0 if it runs, 1 if not")
    logs = add("logs", "print the broker's log (logs/server.log in the data dir)")
    logs.add_argument("-n", "--lines", type=int, default=50, help="last N lines")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")


def run(args: argparse.Namespace) -> int:
    """Dispatch to the chosen action; returns the exit status."""
    from runwatch.broker import EmbeddedBroker

    port = getattr(args, "port", None)
    if port is not None and not 0 < port < 65536:
        raise UsageError(f"--port must be 1..65535, not {port}")
    broker = EmbeddedBroker(args.data_dir, port=port)
    if args.action == "start":
        return _start(broker, args.timeout)
    if args.action == "stop":
        return _stop(broker, args.timeout)
    if args.action == "status":
        return _status(broker)
    if args.action == "logs":
        if args.lines < 0:
            raise UsageError(f"-n must be >= 0, not {args.lines}")
        return _logs(broker.log_file, args.lines, args.follow)
    raise UsageError(f"unknown action {args.action!r}")


def _start(broker: EmbeddedBroker, timeout_s: float) -> int:
    already = broker.running()
    info = broker.start(timeout_s=timeout_s)
    print(info.bootstrap)
    how = "already running" if already is not None else f"started in {info.startup_s:.1f} s"
    print(
        f"Kafka {info.kafka_version} {how}: pid {info.pid}, data {info.data_dir}",
        file=sys.stderr,
    )
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
