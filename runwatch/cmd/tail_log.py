"""``runwatch tail-log``: step events from the log of a script that only prints.

Follows FILE as it grows (like ``tail -F``), parses each line with `producers.logtail`
and sends a StepCompleted per step line through a `RunEmitter`. By default it starts at
the end of the file and announces the run with a RunStarted first. It stops on SIGINT or
SIGTERM (after delivering what it parsed), or at the end of the file with ``--exit-at-eof``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from runwatch.common.errors import RunwatchError, UsageError
from runwatch.common.launch_env import ENV_RUN_ID

if TYPE_CHECKING:
    from runwatch.producers.logtail import DetectingParser, LineParser

HELP = "turn a training log's step lines into step events, following the file as it grows"

logger = logging.getLogger(__name__)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add tail-log's arguments."""
    parser.add_argument("file", metavar="FILE", help="the log file to follow")
    parser.add_argument("--run-id", help="the run the lines belong to (default: $RUNWATCH_RUN_ID)")
    parser.add_argument(
        "--format",
        default=None,
        metavar="FORMAT",
        help="nanogpt (`iter 12: loss 3.1, time 250.00ms, ...` and build-nanogpt's "
        "`step 12 | loss: 3.1 | ... | dt: 250.00ms`), seed (`step: 12, loss: 3.1, dt: 0.25`) "
        "or regex (see --regex) (default: regex with --regex, else detected: nanogpt or seed, "
        "from the first step line read)",
    )
    parser.add_argument(
        "--regex",
        metavar="PATTERN",
        help="for --format regex: a Python regex with named groups step and loss, optionally "
        "step_time_s or dt (seconds) or time_ms, grad_norm and tokens",
    )
    parser.add_argument(
        "--from-start", action="store_true", help="read the file from its beginning, not its end"
    )
    parser.add_argument(
        "--exit-at-eof",
        "--once",
        dest="exit_at_eof",
        action="store_true",
        help="stop at the end of the file instead of following it",
    )
    parser.add_argument(
        "--bootstrap", help="Kafka bootstrap host:port (default: $RUNWATCH_BOOTSTRAP)"
    )
    parser.add_argument(
        "--prefix",
        "--topic-prefix",
        dest="topic_prefix",
        help="topic name prefix (default: runwatch)",
    )
    _add_run_args(parser)


def _add_run_args(parser: argparse.ArgumentParser) -> None:
    """tail-log's arguments about the run (what RunStarted says), polling and stopping."""
    parser.add_argument(
        "--tokens-per-step",
        type=int,
        default=0,
        metavar="N",
        help="tokens the whole job processes per step, for lines that do not say",
    )
    parser.add_argument(
        "--world-size", type=int, default=1, metavar="N", help="ranks of the job (for RunStarted)"
    )
    parser.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        metavar="N",
        help="the model's vocabulary (for RunStarted): enables the loss ceiling (divergence) "
        "and collapse checks, which need it",
    )
    parser.add_argument(
        "--tag",
        dest="tags",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label for RunStarted.tags (team, cluster, model); repeatable",
    )
    parser.add_argument(
        "--no-announce",
        dest="announce",
        action="store_false",
        help="do not send a RunStarted before the first step",
    )
    parser.add_argument(
        "--poll-interval-s",
        type=float,
        default=0.25,
        metavar="S",
        help="seconds between checks for new lines",
    )
    parser.add_argument(
        "--close-timeout-s",
        type=float,
        default=10.0,
        metavar="S",
        help="how long to wait for Kafka to take the last events when stopping",
    )


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Set ``stop`` on SIGINT and SIGTERM for the duration (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        logger.info("tail-log: got signal %d, stopping", signum)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _say_detected(fmt: str, line: str) -> None:
    print(f"tail-log: detected the {fmt} format from {line.strip()!r}", file=sys.stderr)


def _line_parser(args: argparse.Namespace) -> LineParser | DetectingParser:
    """The parser ``--format``/``--regex`` ask for, or one that detects the format."""
    from runwatch.producers.logtail import DetectingParser, make_parser

    if args.format is None and args.regex is None:
        return DetectingParser(on_detect=_say_detected)
    try:
        return make_parser(args.format or "regex", args.regex)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _env_run_id() -> str | None:
    """``RUNWATCH_RUN_ID`` (`EmitterEnv`): the run of the rank whose log this is."""
    from runwatch.producers.settings import EmitterEnv

    try:
        return EmitterEnv.from_env().run_id
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _checked(args: argparse.Namespace) -> tuple[Path, str, dict[str, str]]:
    """``(file, run id, tags)`` once every argument is checked; a UsageError otherwise."""
    path = Path(args.file)
    if not path.exists():
        raise UsageError(f"no such file: {path}")
    if not path.is_file():
        raise UsageError(f"not a regular file: {path}")
    run_id = args.run_id or _env_run_id()
    if not run_id:
        raise UsageError(f"no run id: pass --run-id RUN or set {ENV_RUN_ID}")
    if args.tokens_per_step < 0:
        raise UsageError(f"--tokens-per-step must be >= 0, got {args.tokens_per_step}")
    if args.world_size < 1:
        raise UsageError(f"--world-size must be >= 1, got {args.world_size}")
    if args.vocab_size is not None and args.vocab_size < 2:
        raise UsageError(f"--vocab-size must be >= 2, got {args.vocab_size}")
    if not args.poll_interval_s > 0:
        raise UsageError(f"--poll-interval-s must be > 0, got {args.poll_interval_s}")
    tags: dict[str, str] = {}
    for tag in args.tags:
        key, sep, value = tag.partition("=")
        if not sep or not key:
            raise UsageError(f"--tag takes KEY=VALUE, got {tag!r}")
        tags[key] = value
    return path, run_id, tags


def run(args: argparse.Namespace) -> int:
    """Follow the file and send its steps; returns 0 when everything was delivered."""
    from runwatch.producers.logtail import DetectingParser

    line_parser = _line_parser(args)
    path, run_id, tags = _checked(args)

    from runwatch.producers.emitter import RunEmitter
    from runwatch.producers.follow import FileFollower
    from runwatch.resolve import resolve_bootstrap

    emitter = RunEmitter(
        run_id,
        bootstrap=resolve_bootstrap(args.bootstrap),
        rank=0,
        world_size=args.world_size,
        topic_prefix=args.topic_prefix,
    )
    follower = FileFollower(path, from_start=args.from_start, poll_interval_s=args.poll_interval_s)
    stop = threading.Event()
    steps = skipped = 0
    try:
        with _stop_on_signals(stop):
            lines = follower.lines(stop, exit_at_eof=args.exit_at_eof)  # positions the tail
            if args.announce:  # after positioning: a consumer may take it as "ready"
                emitter.run_started(vocab_size=args.vocab_size, tags=tags or None)
            for line in lines:
                parsed = line_parser.parse(line)
                if parsed is None:
                    continue
                try:
                    emitter.step(
                        parsed.step,
                        loss=parsed.loss,
                        step_time_s=parsed.step_time_s or 0.0,
                        grad_norm=parsed.grad_norm,
                        tokens=args.tokens_per_step if parsed.tokens is None else parsed.tokens,
                    )
                except (TypeError, ValueError) as exc:
                    skipped += 1
                    logger.warning("tail-log: skipped %r: %s", line, exc)
                    continue
                steps += 1
    except FileNotFoundError as exc:
        raise UsageError(f"no such file: {exc.filename}") from None
    finally:
        delivered = emitter.close(args.close_timeout_s)
    stats = emitter.stats
    if isinstance(line_parser, DetectingParser) and line_parser.detected is None:
        print(
            "tail-log: no step line recognised (tried the nanogpt and seed formats); "
            "pass --format, or --regex for another format",
            file=sys.stderr,
        )
    print(
        f"tail-log: {steps} step(s) from {path} for run {run_id}: {stats.delivered} event(s) "
        f"delivered, {stats.dropped} dropped, {stats.failed} failed, {stats.buffered} undelivered"
        + (f", {skipped} line(s) skipped" if skipped else ""),
        file=sys.stderr,
    )
    if not delivered:
        raise RunwatchError(
            f"{stats.enqueued - stats.delivered} event(s) were not delivered to Kafka "
            f"at {emitter.bootstrap}"
        )
    return 0
